"""Several independent seeds of one agent as one program: the agent pytree gets a leading seed axis (S,).

The agent classes stay single-seed; `SeedStack` vmaps their `create`, `update`, `batch_update` and
`sample_actions`, so S seeds train as one compiled program (one GPU launch per step instead of S processes).
Seed `s` of a stack starts from exactly the parameters and key that `create(s, ...)` gives on its own.
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class SeedStack:
    """S agents stacked along a leading axis of every array leaf; `config` stays the one shared static config."""

    agents: object  # An agent pytree whose array leaves have a leading (S,) axis.

    @classmethod
    def create(cls, agent_class, seeds, ex_observations, ex_actions, config):
        """Builds `len(seeds)` agents, seed `s` identical to `agent_class.create(s, ...)`."""
        seeds = jnp.asarray(np.asarray(seeds, dtype=np.int32))
        agents = jax.vmap(lambda seed: agent_class.create(seed, ex_observations, ex_actions, config))(seeds)
        return cls(agents=agents)

    @property
    def num_seeds(self):
        return jax.tree_util.tree_leaves(self.agents.rng)[0].shape[0]

    @jax.jit
    def update(self, batch):
        """One update per seed; leaves of `batch` have a leading (S,) axis. Returns (stack, info with (S,) leaves)."""
        agents, info = jax.vmap(lambda agent, b: agent.update(b))(self.agents, batch)
        return self.replace(agents=agents), info

    @jax.jit
    def batch_update(self, batch):
        """`U` fused updates per seed; leaves of `batch` are (S, U, B, ...). Info is each seed's last update's."""
        agents, info = jax.vmap(lambda agent, b: agent.batch_update(b))(self.agents, batch)
        return self.replace(agents=agents), info

    @jax.jit
    def sample_actions(self, observations, rngs):
        """Per-seed actions: `observations` (S, ...) and one key per seed, `rngs` (S, 2)."""
        return jax.vmap(lambda agent, obs, rng: agent.sample_actions(obs, rng=rng))(self.agents, observations, rngs)

    def seed(self, i):
        """The i-th seed's agent, as an ordinary single-seed agent (for saving, notebooks and tests)."""
        return jax.tree_util.tree_map(lambda x: x[i], self.agents)
