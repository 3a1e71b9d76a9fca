"""Several independent seeds of one agent as one program: the agent pytree gets a leading seed axis (S,).

The agent classes stay single-seed; a `SeedGroup` vmaps their `create`, `update`, `batch_update` and
`sample_actions` over a leading seed axis, so S seeds train as one compiled program (one launch per step instead
of S processes). Seed `s` of a group starts from exactly the parameters and key that `create(s, ...)` gives alone,
and each later step agrees with the single-seed agent up to float rounding (vmapped matmuls may be batched
differently). A group of one seed holds the plain agent and runs the single-seed program unchanged.

Batches and observations go in as one entry per seed; infos come back with a leading (S,) axis on every leaf.

The group also owns the online phase's pending updates: `queue_updates` takes one step's batches and runs them at
once or holds them, fused with the following steps' up to `fuse_steps` steps (one compiled call per action chunk).
Whatever reads the agents (a policy call, infos, evaluation, a checkpoint, the parameters) runs what is held first,
so the agents it reads have every update queued before it, in order.
"""

from functools import partial

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from evaluation import episode_chunks
from evaluation import sample_episode_chunks as _plain_sample_episode_chunks
from training.data import join_steps
from training.device_replay import replay_steps, to_device

_CREATES = {}  # (agent class, config, vmapped) -> its compiled `create` (see `_compiled_create`).


def _compiled_create(agent_class, config, vmapped):
    """`agent_class.create(seed, ex_observations, ex_actions, config)` as one compiled call (op by op, creation
    dispatches hundreds of small ops: seconds on a GPU), vmapped over a leading seed axis when `vmapped`. The seed
    and the examples are arguments, so one program serves every seed, and one function per agent class and config
    value lets groups built alike in one process reuse it (a persistent cache serves it to the next process). It
    builds from its own copy of that value: a new trace (new example shapes) never sees a caller's later changes."""
    frozen = ml_collections.FrozenConfigDict(config)
    key = (agent_class, frozen, vmapped)
    if key not in _CREATES:

        def create(seed, ex_observations, ex_actions):
            return agent_class.create(seed, ex_observations, ex_actions, ml_collections.ConfigDict(frozen))

        _CREATES[key] = jax.jit(jax.vmap(create, in_axes=(0, None, None)) if vmapped else create)
    return _CREATES[key]


def _stack(trees):
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *trees)


def _over_seeds(fn, seeds_per_vmap, *xs):
    """`fn` applied to every seed's slice of `xs`: vmapped over all seeds (`seeds_per_vmap` None), or over
    `seeds_per_vmap` seeds at a time in a loop inside the program (`seeds_per_vmap=1`: one seed after another)."""
    if seeds_per_vmap is None:
        return jax.vmap(fn)(*xs)
    return jax.lax.map(lambda args: fn(*args), xs, batch_size=seeds_per_vmap if seeds_per_vmap > 1 else None)


@partial(jax.jit, static_argnames='seeds_per_vmap')
def _group_update(agents, batch, seeds_per_vmap):
    return _over_seeds(lambda agent, b: agent.update(b), seeds_per_vmap, agents, batch)


@partial(jax.jit, static_argnames='seeds_per_vmap')
def _group_batch_update(agents, batch, seeds_per_vmap):
    return _over_seeds(lambda agent, b: agent.batch_update(b), seeds_per_vmap, agents, batch)


# The replay storage is donated: each call writes its steps' transitions in place.
_plain_replay_steps = partial(jax.jit, static_argnames='layout', donate_argnums=1)(replay_steps)


@partial(jax.jit, static_argnames=('layout', 'seeds_per_vmap'), donate_argnums=1)
def _group_replay_steps(agents, storage, data, packed, layout, seeds_per_vmap):
    def seed_steps(agent, seed_storage, seed_packed):
        return replay_steps(agent, seed_storage, data, seed_packed, layout)

    return _over_seeds(seed_steps, seeds_per_vmap, agents, storage, packed)


def chunk_key(key_seed, index):
    """The key of chunk `index` of an actor whose key seed is `key_seed`: `fold_in(PRNGKey(key_seed), index)`."""
    return jax.random.fold_in(jax.random.PRNGKey(key_seed), index)


def _sample_chunk(agent, observation, key_seed, index):
    return agent.sample_actions(observation, rng=chunk_key(key_seed, index))


_plain_sample_chunk = jax.jit(_sample_chunk)


@partial(jax.jit, static_argnames='seeds_per_vmap')
def _group_sample_episode_chunks(agents, observations, seeds, indices, chunks, seeds_per_vmap):
    return _over_seeds(episode_chunks, seeds_per_vmap, agents, observations, seeds, indices, chunks)


@partial(jax.jit, static_argnames='seeds_per_vmap')
def _group_sample_chunks(agents, observations, key_seeds, indices, seeds_per_vmap):
    return _over_seeds(_sample_chunk, seeds_per_vmap, agents, observations, key_seeds, indices)


def default_seeds_per_vmap(num_seeds):
    """Seeds vmapped together by default: all of them on an accelerator, where one wide program fills the device,
    and one at a time on a CPU, where a vmapped matmul runs slower per seed than S plain ones (benchmarks/RESULTS.md)
    while one program for all seeds still saves the per-call overhead."""
    return 1 if jax.default_backend() == 'cpu' else num_seeds


class SeedGroup:
    """The agents of `seeds`: one plain agent for one seed, else one agent pytree with a leading (S,) axis."""

    def __init__(self, agents, seeds, seeds_per_vmap=1):
        self._agents = agents
        self.seeds = tuple(int(s) for s in seeds)
        # Seeds vmapped together (at most all of them); the others loop inside the one program.
        self.seeds_per_vmap = min(seeds_per_vmap, len(self.seeds))
        self._width = None if self.seeds_per_vmap == len(self.seeds) else self.seeds_per_vmap  # `_over_seeds`
        self.fuse_steps = 1  # Online steps whose queued updates run as one call (`queue_updates`).
        # With a `training.device_replay.DeviceReplay`, queued steps are packed steps of its `RowSampler`s.
        self.replay = None
        self._held = []  # Steps whose updates are queued and not run yet: per step, every seed's (U, B, ...) batch.
        self._info = None  # The device info of the last update that ran (None before the first).
        self._host_info = None  # `_info` on the host, once `infos` fetched it.
        self.updates = 0  # Update calls run so far (`update`, `batch_update`; queued steps once they ran).

    @classmethod
    def create(cls, agent_class, seeds, ex_observations, ex_actions, config, seeds_per_vmap=0):
        """Builds the agents of `seeds`; seed `s` is identical to `agent_class.create(s, ...)`. `seeds_per_vmap`: how
        many seeds are vmapped together, as `--seeds_per_vmap` (0: `default_seeds_per_vmap`; 1: each seed on its
        own, one after another, inside the one compiled call; S or more: all of them)."""
        seeds = tuple(int(s) for s in seeds)
        if seeds_per_vmap < 0:
            raise ValueError(f'seeds_per_vmap must be >= 0, got {seeds_per_vmap}')
        seeds_per_vmap = seeds_per_vmap or default_seeds_per_vmap(len(seeds))

        create = _compiled_create(agent_class, config, vmapped=len(seeds) > 1)
        if len(seeds) == 1:
            return cls(create(np.int32(seeds[0]), ex_observations, ex_actions), seeds)
        agents = create(np.asarray(seeds, dtype=np.int32), ex_observations, ex_actions)
        return cls(agents, seeds, seeds_per_vmap=seeds_per_vmap)

    @property
    def num_seeds(self):
        return len(self.seeds)

    @property
    def stacked(self):
        """True when the agents carry a seed axis (more than one seed)."""
        return self.num_seeds > 1

    @property
    def agents(self):
        """The agent pytree (with the seed axis for several seeds), every queued update run."""
        self.run_held()
        return self._agents

    def _updated(self, method, grouped, batches):
        """Runs `method` of the plain agent (one seed) or `grouped` on the stacked ones; keeps the info."""
        if not self.stacked:
            self._agents, info = getattr(self._agents, method)(batches[0])
        else:
            self._agents, info = grouped(self._agents, _stack(batches), seeds_per_vmap=self._width)
        return self._ran(info)

    def _ran(self, info):
        """Keeps the device info of the update call that just ran, and counts the call."""
        self._info, self._host_info = info, None
        self.updates += 1
        return info

    def update(self, batches):
        """One update per seed on `batches[i]` (after any queued ones); returns the info on the device."""
        self.run_held()
        return self._updated('update', _group_update, batches)

    def batch_update(self, batches):
        """`U` fused updates per seed, `batches[i]` with (U, B, ...) leaves (after any queued ones); the info of each
        seed's last update, on the device."""
        self.run_held()
        return self._updated('batch_update', _group_batch_update, batches)

    def queue_updates(self, batches):
        """One online step's updates, `batches[i]` seed i's (U, B, ...) batch (with `replay`, seed i's packed step).
        They run at once with `fuse_steps` 1 (the reference's call per step), else when `fuse_steps` steps are
        queued (one compiled call for them) or when the agents are read next, whichever comes first: the same
        updates on the same batches in the same order either way."""
        if self.replay is not None and self.replay.storage is None:
            self.replay.upload(self.stacked)  # The buffers as this step sampled them.
        self._held.append(batches)
        if len(self._held) >= self.fuse_steps:
            self.run_held()

    def run_held(self):
        """Runs the queued updates in order: one call for `fuse_steps` steps, else one call per step (so the update
        compiles for two batch shapes only)."""
        if not self._held:
            return
        held, self._held = self._held, []
        calls = [held] if len(held) == self.fuse_steps else [[step] for step in held]
        for steps in calls:
            if self.replay is None:
                self.batch_update(join_steps(steps))
            else:
                self._replay_steps(steps)

    def _replay_steps(self, steps):
        """Runs packed steps (`steps[t][i]`: seed i's step t) on the device replay: one transfer, one call."""
        replay = self.replay
        packed = np.stack([np.stack(seed_steps) for seed_steps in zip(*steps, strict=True)])  # (S, T, L)
        if not self.stacked:
            self._agents, replay.storage, info = _plain_replay_steps(
                self._agents, replay.storage, replay.data, to_device(packed[0]), layout=replay.layout
            )
        else:
            self._agents, replay.storage, info = _group_replay_steps(
                self._agents, replay.storage, replay.data, to_device(packed), layout=replay.layout,
                seeds_per_vmap=self._width,
            )  # fmt: skip
        self._ran(info)

    def infos(self):
        """Python-float info dicts, one per seed, of the last update (queued ones run first; one device-to-host
        transfer); None before the first update."""
        self.run_held()
        if self._info is None:
            return None
        if self._host_info is None:
            with jax.transfer_guard_device_to_host('allow'):
                host = jax.device_get(self._info)
            if not self.stacked:
                self._host_info = [{k: float(v) for k, v in host.items()}]
            else:
                self._host_info = [{k: float(v[i]) for k, v in host.items()} for i in range(self.num_seeds)]
        return self._host_info

    def sample_chunks(self, observations, key_seeds, indices):
        """Action chunks of every seed as one (S, H * A) NumPy array: seed i acts on `observations[i]` with the key
        `chunk_key(key_seeds[i], indices[i])`, made inside the one compiled call. Fetching the chunks is the one
        wait on the device of a policy query."""
        agents = self.agents
        if not self.stacked:
            actions = _plain_sample_chunk(agents, *to_device((observations[0], key_seeds[0], indices[0])))
        else:
            inputs = to_device((observations, key_seeds, indices))
            actions = _group_sample_chunks(agents, *inputs, seeds_per_vmap=self._width)
        with jax.transfer_guard_device_to_host('allow'):
            actions = np.asarray(actions)
        return actions if self.stacked else actions[None]

    def sample_episode_chunks(self, observations, seeds, indices, chunks):
        """Evaluation chunks of every seed in one compiled call, as a (S, C, H * A) NumPy array: seed i's C env
        copies act on `observations[i]` with the keys `evaluation.episode_key(seeds[i], indices[i, c], chunks[i, c])`
        (the `sample_chunks` of `evaluation.run_lockstep`)."""
        agents = self.agents
        if not self.stacked:
            actions = _plain_sample_episode_chunks(agents, observations[0], seeds[0], indices[0], chunks[0])
        else:
            actions = _group_sample_episode_chunks(
                agents, observations, seeds, indices, chunks, seeds_per_vmap=self._width
            )
        with jax.transfer_guard_device_to_host('allow'):
            actions = np.asarray(actions)
        return actions if self.stacked else actions[None]

    def agent(self, i):
        """Seed i's agent as an ordinary single-seed agent (evaluation, saving, notebooks)."""
        agents = self.agents
        return agents if not self.stacked else jax.tree_util.tree_map(lambda x: x[i], agents)

    def state_dicts(self):
        """One host state dict per seed, each what a single-seed run of that seed checkpoints."""
        return [jax.device_get(flax.serialization.to_state_dict(self.agent(i))) for i in range(self.num_seeds)]

    def load_state_dicts(self, states):
        """Restores `state_dicts()` output."""
        agents = [flax.serialization.from_state_dict(self.agent(i), s) for i, s in enumerate(states)]
        self._agents = agents[0] if not self.stacked else jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *agents)
