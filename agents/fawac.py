"""FAWAC: AWAC with a flow policy over action chunks, the QAM paper's baseline (Li and Levine, 2026; the authors'
`agents/fawac.py`): the BC flow's flow-matching loss weighted by exp(inv_temp * advantage).

The critic is QC's chunked ensemble with the pessimistic target mean - rho * std at the flow's next chunk; a value
V(s) regresses onto the target critics at the dataset chunk. The flow is trained on dataset chunks with each chunk's
flow-matching error weighted by min(exp(inv_temp (Q(s, a) - V(s))), 100), Q the critics' mean. Acting runs the
flow from one noise draw.
"""

import copy
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from utils.config_rules import CHUNKED_CRITIC_RULES, non_negative, one_of, positive
from utils.flax_utils import adam, gradient_step, init_network, nonpytree_field, scan_updates, sum_losses
from utils.flows import chunk_actions, chunk_td_loss, euler_flow, example_chunks, flow_matching_pair
from utils.networks import Value, flow_field

# The largest advantage weight (IQL's cap on exp(inv_temp * A)).
MAX_WEIGHT = 100.0


class FAWACAgent(flax.struct.PyTreeNode):
    """An advantage-weighted BC flow with a chunked critic ensemble and a value."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    def critic_loss(self, batch, grad_params, rng):
        """QC's chunked TD loss at the flow's next chunks, plus the value's squared error to every target critic at
        the dataset chunk (both left out for chunks past an episode end)."""
        td_loss, info = chunk_td_loss(self, batch, grad_params, rng)
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])  # (B, D), D = H * A or A
        target_qs = self.network.select('target_critic')(batch['observations'], actions)  # (num_qs, B)
        v = self.network.select('value')(batch['observations'], params=grad_params)  # (B,)
        value_loss = (jnp.square(target_qs - v) * batch['valid'][..., -1]).mean()
        return td_loss + value_loss, {'value_loss': value_loss, **info}

    def actor_loss(self, batch, grad_params, rng):
        """The flow-matching error of each dataset chunk weighted by min(exp(inv_temp (Q - V)), 100)."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])
        observations = batch['observations']
        _, noise_rng, time_rng = jax.random.split(rng, 3)
        x_t, t, vel = flow_matching_pair(noise_rng, time_rng, actions)
        pred = self.network.select('actor')(observations, x_t, t, params=grad_params)
        q = self.network.select('critic')(observations, actions).mean(axis=0)  # (B,)
        advantage = q - self.network.select('value')(observations)
        weight = jnp.minimum(jnp.exp(advantage * self.config['inv_temp']), MAX_WEIGHT)
        loss = jnp.mean(jnp.square(pred - vel).mean(axis=-1) * weight * batch['valid'][..., -1])
        return loss, {'actor_loss': loss, 'weight_mean': weight.mean()}

    def total_loss(self, batch, grad_params, rng=None):
        """Critic (and value) loss plus actor loss, with `critic/` and `actor/` prefixed infos."""
        rng = rng if rng is not None else self.rng
        _, actor_rng, critic_rng = jax.random.split(rng, 3)
        return sum_losses(
            critic=self.critic_loss(batch, grad_params, critic_rng),
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
        """The flow's chunks (..., H * A) (or single actions (..., A)) from one noise draw per observation."""
        rng = rng if rng is not None else self.rng
        batch_shape = observations.shape[: observations.ndim - len(self.config['ob_dims'])]
        noises = jax.random.normal(rng, (*batch_shape, self.config['full_action_dim']))
        flow = self.network.select('actor')
        return euler_flow(lambda x, t: flow(observations, x, t), noises, self.config['flow_steps'])

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
            critic=(critic_def, (ex_observations, full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
            actor=(flow_def, (ex_observations, full_actions, ex_actions[..., :1])),
            value=(Value(**value, num_ensembles=1), (ex_observations,)),
        )
        network = init_network(network_info, init_rng, adam(config['lr']), targets=('critic',))

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = ex_actions.shape[-1]
        config['full_action_dim'] = full_actions.shape[-1]
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


# The paper whose baseline this is: the drivers compare a run with its protocol unless --protocol says otherwise.
PROTOCOL = 'qam'


def paper_method(config, protocol='qam'):
    """'FAWAC' in the QAM paper; the QC paper has no such method."""
    return 'FAWAC' if protocol == 'qam' else None


# What each key of `get_config()` may hold; the drivers check a run's config against them before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('fawac'),
    **CHUNKED_CRITIC_RULES,
    flow_steps=positive(int),
    inv_temp=non_negative(),
)


def get_config():
    """Default FAWAC hyperparameters (the authors' `agents/fawac.py`, with action chunking on as every command of
    theirs runs it); the QAM paper sets `inv_temp` per domain (`sweeps/presets.py`)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='fawac',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Adam learning rate of the flow, the critics and the value.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the flow.
            actor_layer_norm=False,  # Layer norm in the flow.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the value and of each critic.
            value_layer_norm=True,  # Layer norm in the value and the critics.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked policy and critic; False gives n-step returns on single actions.
            num_qs=10,  # Critic ensemble size.
            rho=0.5,  # Pessimistic target: ensemble mean - rho * ensemble std.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic.
            flow_steps=10,  # Euler steps of the flow.
            inv_temp=10.0,  # Inverse temperature of the advantage weights exp(inv_temp * (Q - V)).
        )
    )
