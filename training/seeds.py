"""Several independent seeds of one agent as one program: the agent pytree gets a leading seed axis (S,).

The agent classes stay single-seed; a `SeedGroup` vmaps their `create`, `update`, `batch_update` and
`sample_actions` over a leading seed axis, so S seeds train as one compiled program (one launch per step instead
of S processes). Seed `s` of a group starts from exactly the parameters and key that `create(s, ...)` gives alone,
and each later step agrees with the single-seed agent up to float rounding (vmapped matmuls may be batched
differently). A group of one seed holds the plain agent and runs the single-seed program unchanged.

Batches and observations go in as one entry per seed; infos come back with a leading (S,) axis on every leaf.
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np


def _stack(trees):
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *trees)


def _expand(tree):
    return jax.tree_util.tree_map(lambda x: x[None], tree)


@jax.jit
def _vmapped_update(agents, batch):
    return jax.vmap(lambda agent, b: agent.update(b))(agents, batch)


@jax.jit
def _vmapped_batch_update(agents, batch):
    return jax.vmap(lambda agent, b: agent.batch_update(b))(agents, batch)


@jax.jit
def _vmapped_sample_actions(agents, observations, rngs):
    return jax.vmap(lambda agent, obs, rng: agent.sample_actions(obs, rng=rng))(agents, observations, rngs)


class SeedGroup:
    """The agents of `seeds`: one plain agent for one seed, else one agent pytree with a leading (S,) axis."""

    def __init__(self, agents, seeds):
        self.agents = agents
        self.seeds = tuple(int(s) for s in seeds)

    @classmethod
    def create(cls, agent_class, seeds, ex_observations, ex_actions, config):
        """Builds the agents of `seeds`; seed `s` is identical to `agent_class.create(s, ...)`."""
        seeds = tuple(int(s) for s in seeds)
        if len(seeds) == 1:
            return cls(agent_class.create(seeds[0], ex_observations, ex_actions, config), seeds)
        stacked = jnp.asarray(np.asarray(seeds, dtype=np.int32))
        agents = jax.vmap(lambda seed: agent_class.create(seed, ex_observations, ex_actions, config))(stacked)
        return cls(agents, seeds)

    @property
    def num_seeds(self):
        return len(self.seeds)

    @property
    def stacked(self):
        """True when the agents carry a seed axis (more than one seed)."""
        return self.num_seeds > 1

    def update(self, batches):
        """One update per seed on `batches[i]`; returns the (S,)-leading info."""
        if not self.stacked:
            self.agents, info = self.agents.update(batches[0])
            return _expand(info)
        self.agents, info = _vmapped_update(self.agents, _stack(batches))
        return info

    def batch_update(self, batches):
        """`U` fused updates per seed, `batches[i]` with (U, B, ...) leaves; info of each seed's last update."""
        if not self.stacked:
            self.agents, info = self.agents.batch_update(batches[0])
            return _expand(info)
        self.agents, info = _vmapped_batch_update(self.agents, _stack(batches))
        return info

    def sample_actions(self, observations, rngs):
        """Actions of every seed, `observations[i]` with key `rngs[i]`, as one (S, ...) NumPy array."""
        if not self.stacked:
            return np.asarray(self.agents.sample_actions(observations[0], rng=rngs[0]))[None]
        return np.asarray(_vmapped_sample_actions(self.agents, _stack(observations), jnp.stack(rngs)))

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

    def params(self):
        """The network parameters of all seeds (leading (S,) axis when stacked)."""
        return self.agents.network.params
