"""IFQL: implicit flow Q-learning, the flow version of IDQL (Hansen-Estruch et al. 2023; Park et al. 2025's FQL
codebase), over action chunks, as the QAM paper's baseline (Li and Levine, 2026; the authors' `agents/ifql.py`).

In-sample learning: a value V(s) regresses onto the pessimistic target ensemble mean - rho * std at dataset chunks
by the expectile loss (`kappa`), the critic ensemble regresses onto r_0:H + gamma^H V(s_H), and a BC flow is trained
on dataset chunks. Acting draws `num_samples` flow chunks per observation and keeps the one the critic ensemble's
minimum ranks highest.
"""

import copy
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from utils.config_rules import CHUNKED_CRITIC_RULES, fraction, one_of, positive
from utils.flax_utils import adam, gradient_step, init_network, nonpytree_field, scan_updates, sum_losses
from utils.flows import best_of_n, candidates, chunk_actions, euler_flow, example_chunks, flow_matching_pair
from utils.networks import Value, aggregate_q, flow_field


def expectile_loss(diff, expectile):
    """|expectile - 1(diff < 0)| * diff^2, elementwise: the asymmetric square whose minimiser is the expectile."""
    return jnp.where(diff >= 0, expectile, 1 - expectile) * jnp.square(diff)


class IFQLAgent(flax.struct.PyTreeNode):
    """Expectile value, in-sample chunked critic and a BC flow with best-of-N acting."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    def value_loss(self, batch, grad_params, rng):
        """Expectile regression of V(s) onto mean - rho * std of the target critics at the dataset chunk."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])  # (B, D), D = H * A or A
        qs = self.network.select('target_critic')(batch['observations'], actions)  # (num_qs, B)
        q = aggregate_q(qs, 'mean', self.config['rho'])
        v = self.network.select('value')(batch['observations'], params=grad_params)  # (B,)
        loss = expectile_loss(q - v, self.config['kappa']).mean()
        return loss, {'value_loss': loss, 'v_mean': v.mean(), 'v_max': v.max(), 'v_min': v.min()}

    def critic_loss(self, batch, grad_params, rng):
        """Every critic regresses onto the H-step return bootstrapped with V(s_H); chunks past an episode end are
        left out (`valid[..., -1]`)."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])
        next_v = self.network.select('value')(batch['next_observations'][..., -1, :])  # (B,)
        discount = self.config['discount'] ** self.config['horizon_length']
        target_q = batch['rewards'][..., -1] + discount * batch['masks'][..., -1] * next_v
        qs = self.network.select('critic')(batch['observations'], actions, params=grad_params)  # (num_qs, B)
        loss = (jnp.square(qs - target_q) * batch['valid'][..., -1]).mean()
        return loss, {'critic_loss': loss, 'q_mean': target_q.mean(), 'q_max': target_q.max(), 'q_min': target_q.min()}

    def actor_loss(self, batch, grad_params, rng):
        """The BC flow's flow-matching loss on dataset chunks (left out past an episode end)."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])
        _, noise_rng, time_rng = jax.random.split(rng, 3)
        x_t, t, vel = flow_matching_pair(noise_rng, time_rng, actions)
        pred = self.network.select('actor_flow')(batch['observations'], x_t, t, params=grad_params)
        loss = jnp.mean(jnp.square(pred - vel).mean(axis=-1) * batch['valid'][..., -1])
        return loss, {'actor_loss': loss}

    def total_loss(self, batch, grad_params, rng=None):
        """Value, critic and actor losses, with `value/`, `critic/` and `actor/` prefixed infos."""
        rng = rng if rng is not None else self.rng
        _, actor_rng = jax.random.split(rng)
        return sum_losses(
            value=self.value_loss(batch, grad_params, None),
            critic=self.critic_loss(batch, grad_params, None),
            actor=self.actor_loss(batch, grad_params, actor_rng),
        )

    def _update(self, batch):
        return gradient_step(self, batch, targets=('critic',))

    @jax.jit
    def update(self, batch):
        """One gradient step on a batch from `sample_sequence`, then a soft update of the target critic. Returns
        (agent, info)."""
        return self._update(batch)

    @jax.jit
    def batch_update(self, batch):
        """`U` sequential updates fused in one `lax.scan`; every leaf of `batch` has a leading (U,) axis.

        Equivalent to U calls of `update`; the returned info is the last update's.
        """
        return scan_updates(lambda agent, b: agent._update(b), self, batch)

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """Chunks (..., H * A) (or single actions (..., A)): of `num_samples` BC flow chunks per observation, the one
        with the highest minimum over the critic ensemble."""
        rng = rng if rng is not None else self.rng
        # (..., N, *obs), (..., N, D)
        obs_rep, noises = candidates(observations, self.config, self.config['num_samples'], rng)
        flow = self.network.select('actor_flow')
        actions = euler_flow(lambda x, t: flow(obs_rep, x, t), noises, self.config['flow_steps'])
        return best_of_n(actions, self.network.select('critic')(obs_rep, actions).min(axis=0))

    @classmethod
    def create(cls, seed, ex_observations, ex_actions, config):
        """Builds the agent from one example observation (obs_shape) and single-step action (A,), or a batch of each,
        and a `get_config()` with `horizon_length` set; `seed` fixes the initial params and the agent's key."""
        config = dict(config)
        rng = jax.random.PRNGKey(seed)
        rng, init_rng = jax.random.split(rng)
        ex_observations, ex_actions, full_actions = example_chunks(config, ex_observations, ex_actions)
        value = dict(hidden_dims=tuple(config['value_hidden_dims']), layer_norm=config['value_layer_norm'])
        critic_def = Value(**value, num_ensembles=config['num_qs'])
        flow_def = flow_field(config, full_actions.shape[-1])
        network_info = dict(
            value=(Value(**value, num_ensembles=1), (ex_observations,)),
            critic=(critic_def, (ex_observations, full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
            actor_flow=(flow_def, (ex_observations, full_actions, ex_actions[..., :1])),
        )  # fmt: skip
        network = init_network(network_info, init_rng, adam(config['lr']), targets=('critic',))

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = ex_actions.shape[-1]
        config['full_action_dim'] = full_actions.shape[-1]
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


# The paper whose baseline this is: the drivers compare a run with its protocol unless --protocol says otherwise.
PROTOCOL = 'qam'


def paper_method(config, protocol='qam'):
    """'IFQL' in the QAM paper; the QC paper has no such method."""
    return 'IFQL' if protocol == 'qam' else None


# What each key of `get_config()` may hold; the drivers check a run's config against them before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('ifql'),
    **CHUNKED_CRITIC_RULES,
    flow_steps=positive(int),
    kappa=fraction(),
    num_samples=positive(int),
)


def get_config():
    """Default IFQL hyperparameters (the authors' `agents/ifql.py`, with action chunking on as every command of theirs
    runs it); the QAM paper sets `kappa` per domain (`sweeps/presets.py`)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='ifql',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Adam learning rate of the value, the critics and the flow.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the BC flow.
            actor_layer_norm=False,  # Layer norm in the BC flow.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the value and of each critic.
            value_layer_norm=True,  # Layer norm in the value and the critics.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked policy and critic; False gives n-step returns on single actions.
            num_qs=10,  # Critic ensemble size.
            rho=0.5,  # The value's target: ensemble mean - rho * ensemble std.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic.
            flow_steps=10,  # Euler steps of the BC flow.
            kappa=0.9,  # Expectile of the value regression (0.5: the mean; toward 1: the maximum).
            num_samples=32,  # Flow chunks drawn per observation when acting; the critics' minimum picks one.
        )
    )
