"""Several independent seeds of one agent as one program: the agent pytree gets a leading seed axis (S,).

The agent classes stay single-seed; a `SeedGroup` vmaps their `create`, `update`, `batch_update` and
`sample_actions` over a leading seed axis, so S seeds train as one compiled program (one launch per step instead
of S processes). Seed `s` of a group starts from exactly the parameters and key that `create(s, ...)` gives alone,
and each later step agrees with the single-seed agent up to float rounding (vmapped matmuls may be batched
differently). A group of one seed holds the plain agent and runs the single-seed program unchanged.

Batches and observations go in as one entry per seed; infos come back with a leading (S,) axis on every leaf.
"""

from functools import partial

import flax
import jax
import jax.numpy as jnp
import numpy as np

from evaluation import episode_key


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


def chunk_key(key_seed, index):
    """The key of chunk `index` of an actor whose key seed is `key_seed`: `fold_in(PRNGKey(key_seed), index)`."""
    return jax.random.fold_in(jax.random.PRNGKey(key_seed), index)


def _sample_chunk(agent, observation, key_seed, index):
    return agent.sample_actions(observation, rng=chunk_key(key_seed, index))


_plain_sample_chunk = jax.jit(_sample_chunk)


def _sample_episode_chunks(agent, observations, seed, indices, chunks):
    """One seed's evaluation chunks: (C, ...) observations of its env copies, keys `evaluation.episode_key`."""

    def sample(observation, index, chunk):
        return agent.sample_actions(observation, rng=episode_key(seed, index, chunk))

    return jax.vmap(sample)(observations, indices, chunks)


_plain_sample_episode_chunks = jax.jit(_sample_episode_chunks)


@partial(jax.jit, static_argnames='seeds_per_vmap')
def _group_sample_episode_chunks(agents, observations, seeds, indices, chunks, seeds_per_vmap):
    return _over_seeds(_sample_episode_chunks, seeds_per_vmap, agents, observations, seeds, indices, chunks)


@partial(jax.jit, static_argnames='seeds_per_vmap')
def _group_sample_chunks(agents, observations, key_seeds, indices, seeds_per_vmap):
    return _over_seeds(_sample_chunk, seeds_per_vmap, agents, observations, key_seeds, indices)


def default_seeds_per_vmap():
    """Seeds vmapped together by default: all of them on an accelerator, where one wide program fills the device,
    and one at a time on a CPU, where a vmapped matmul runs slower per seed than S plain ones (benchmarks/RESULTS.md)
    while one program for all seeds still saves the per-call overhead."""
    return 1 if jax.default_backend() == 'cpu' else None


class SeedGroup:
    """The agents of `seeds`: one plain agent for one seed, else one agent pytree with a leading (S,) axis."""

    def __init__(self, agents, seeds, seeds_per_vmap=None):
        self.agents = agents
        self.seeds = tuple(int(s) for s in seeds)
        # Seeds vmapped together (None: all); the others loop inside the one program.
        self.seeds_per_vmap = seeds_per_vmap

    @classmethod
    def create(cls, agent_class, seeds, ex_observations, ex_actions, config, seeds_per_vmap='auto'):
        """Builds the agents of `seeds`; seed `s` is identical to `agent_class.create(s, ...)`. `seeds_per_vmap`: how
        many seeds are vmapped together (None: all of them; 1: each seed on its own, one after another, inside the one
        compiled call; 'auto': `default_seeds_per_vmap()`)."""
        seeds = tuple(int(s) for s in seeds)
        seeds_per_vmap = default_seeds_per_vmap() if seeds_per_vmap == 'auto' else seeds_per_vmap
        if seeds_per_vmap is not None and seeds_per_vmap < 1:
            raise ValueError(f'seeds_per_vmap must be >= 1 or None, got {seeds_per_vmap}')
        # One compiled initialization (op by op, creation dispatches hundreds of small ops: seconds on a GPU); the
        # seed is an argument, so the program is the same for every seed and a persistent cache serves it again.
        def create(seed):
            return agent_class.create(seed, ex_observations, ex_actions, config)

        if len(seeds) == 1:
            return cls(jax.jit(create)(np.int32(seeds[0])), seeds)
        agents = jax.jit(jax.vmap(create))(np.asarray(seeds, dtype=np.int32))
        if seeds_per_vmap is not None and seeds_per_vmap >= len(seeds):
            seeds_per_vmap = None
        return cls(agents, seeds, seeds_per_vmap=seeds_per_vmap)

    @property
    def num_seeds(self):
        return len(self.seeds)

    @property
    def stacked(self):
        """True when the agents carry a seed axis (more than one seed)."""
        return self.num_seeds > 1

    def _updated(self, method, grouped, batches):
        """Runs `method` of the plain agent (one seed) or `grouped` on the stacked ones; returns the info on the
        device (read it with `host_infos`)."""
        if not self.stacked:
            self.agents, info = getattr(self.agents, method)(batches[0])
            return info
        self.agents, info = grouped(self.agents, _stack(batches), seeds_per_vmap=self.seeds_per_vmap)
        return info

    def update(self, batches):
        """One update per seed on `batches[i]`; returns the info on the device."""
        return self._updated('update', _group_update, batches)

    def batch_update(self, batches):
        """`U` fused updates per seed, `batches[i]` with (U, B, ...) leaves; the info of each seed's last update, on
        the device."""
        return self._updated('batch_update', _group_batch_update, batches)

    def host_infos(self, info):
        """Python-float info dicts, one per seed, of an `update`/`batch_update` info (one device-to-host transfer)."""
        with jax.transfer_guard_device_to_host('allow'):
            host = jax.device_get(info)
        if not self.stacked:
            return [{k: float(v) for k, v in host.items()}]
        return [{k: float(v[i]) for k, v in host.items()} for i in range(self.num_seeds)]

    def sample_chunks(self, observations, key_seeds, indices):
        """Action chunks of every seed as one (S, H * A) NumPy array: seed i acts on `observations[i]` with the key
        `chunk_key(key_seeds[i], indices[i])`, made inside the one compiled call. Fetching the chunks is the one
        wait on the device of a policy query."""
        if not self.stacked:
            actions = _plain_sample_chunk(self.agents, observations[0], key_seeds[0], indices[0])
        else:
            actions = _group_sample_chunks(
                self.agents, observations, key_seeds, indices, seeds_per_vmap=self.seeds_per_vmap
            )
        with jax.transfer_guard_device_to_host('allow'):
            actions = np.asarray(actions)
        return actions if self.stacked else actions[None]

    def sample_episode_chunks(self, observations, seeds, indices, chunks):
        """Evaluation chunks of every seed in one compiled call, as a (S, C, H * A) NumPy array: seed i's C env
        copies act on `observations[i]` with the keys `evaluation.episode_key(seeds[i], indices[i, c], chunks[i, c])`
        (the `sample_chunks` of `evaluation.run_lockstep`)."""
        if not self.stacked:
            actions = _plain_sample_episode_chunks(self.agents, observations[0], seeds[0], indices[0], chunks[0])
        else:
            actions = _group_sample_episode_chunks(
                self.agents, observations, seeds, indices, chunks, seeds_per_vmap=self.seeds_per_vmap
            )
        with jax.transfer_guard_device_to_host('allow'):
            actions = np.asarray(actions)
        return actions if self.stacked else actions[None]

    def agent(self, i):
        """Seed i's agent as an ordinary single-seed agent (evaluation, saving, notebooks)."""
        if not self.stacked:
            return self.agents
        return jax.tree_util.tree_map(lambda x: x[i], self.agents)

    def state_dicts(self):
        """One host state dict per seed, each what a single-seed run of that seed checkpoints."""
        return [jax.device_get(flax.serialization.to_state_dict(self.agent(i))) for i in range(self.num_seeds)]

    def load_state_dicts(self, states):
        """Restores `state_dicts()` output."""
        agents = [flax.serialization.from_state_dict(self.agent(i), s) for i, s in enumerate(states)]
        self.agents = agents[0] if not self.stacked else jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *agents)
