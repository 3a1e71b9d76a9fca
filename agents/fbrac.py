"""FBRAC: a flow policy trained by behaviour cloning and by Q maximised through the whole flow (backpropagation
through its Euler steps), over action chunks, as the QAM paper's baseline (Li and Levine, 2026; the authors'
`agents/fbrac.py`).

The critic is QC's chunked ensemble with the pessimistic target mean - rho * std. The one flow (`actor_flow`) takes
the flow-matching loss on dataset chunks plus -Q(s, f(s, z)) / alpha, with f(s, z) its own `flow_steps` Euler steps
from noise z, differentiated through every step. Acting keeps the critic's best of `best_of_n` flow chunks.
"""

import copy
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from utils.config_rules import CHUNKED_CRITIC_RULES, one_of, positive
from utils.flax_utils import adam, gradient_step, init_network, nonpytree_field, scan_updates, sum_losses
from utils.flows import (
    best_of_n,
    candidates,
    chunk_actions,
    chunk_td_loss,
    euler_flow,
    example_chunks,
    flow_matching_pair,
)
from utils.networks import critic_ensemble, flow_field


class FBRACAgent(flax.struct.PyTreeNode):
    """A BC flow that also climbs Q by backpropagation through time, over action chunks."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    def critic_loss(self, batch, grad_params, rng):
        """TD loss of every critic toward the H-step return bootstrapped with mean - rho * std of the target ensemble
        at the flow's next chunk; chunks that run past an episode end are left out (`valid[..., -1]`)."""
        _, sample_rng = jax.random.split(rng)  # the reference's split
        return chunk_td_loss(self, batch, grad_params, sample_rng)

    def actor_loss(self, batch, grad_params, rng):
        """The flow-matching loss plus -Q(s, f(s, z)) / alpha, differentiated through the flow's steps."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])  # (B, D), D = H * A or A
        observations = batch['observations']
        rng, noise_rng, time_rng = jax.random.split(rng, 3)
        x_t, t, vel = flow_matching_pair(noise_rng, time_rng, actions)
        pred = self.network.select('actor_flow')(observations, x_t, t, params=grad_params)
        bc_flow_loss = jnp.mean(jnp.square(pred - vel).mean(axis=-1) * batch['valid'][..., -1])

        _, noise_rng = jax.random.split(rng)
        noises = jax.random.normal(noise_rng, actions.shape)
        chunks = self.compute_flow_actions(observations, noises, params=grad_params)  # (B, D), with gradients
        q_loss = -self.network.select('critic')(observations, chunks).mean(axis=0).mean()
        loss = bc_flow_loss + q_loss / self.config['alpha']
        return loss, {'actor_loss': loss, 'bc_flow_loss': bc_flow_loss, 'q_loss': q_loss}

    def total_loss(self, batch, grad_params, rng=None):
        """Critic loss plus actor loss, with `critic/` and `actor/` prefixed infos."""
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

    def compute_flow_actions(self, observations, noises, params=None):
        """The flow's chunks from `noises` (..., D), clipped to [-1, 1]; with `params` differentiable in them."""
        flow = self.network.select('actor_flow')
        return euler_flow(lambda x, t: flow(observations, x, t, params=params), noises, self.config['flow_steps'])

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """Flow chunks (..., H * A) (or single actions (..., A)), the critic's best of `best_of_n` per observation."""
        rng = rng if rng is not None else self.rng
        # (..., N, *obs), (..., N, D)
        obs_rep, noises = candidates(observations, self.config, self.config['best_of_n'], rng)
        actions = self.compute_flow_actions(obs_rep, noises)
        return best_of_n(actions, self.network.select('critic')(obs_rep, actions).mean(axis=0))

    @classmethod
    def create(cls, seed, ex_observations, ex_actions, config):
        """Builds the agent from one example observation (obs_shape) and single-step action (A,), or a batch of each,
        and a `get_config()` with `horizon_length` set; `seed` fixes the initial params and the agent's key."""
        config = dict(config)
        rng = jax.random.PRNGKey(seed)
        rng, init_rng = jax.random.split(rng)
        ex_observations, ex_actions, full_actions = example_chunks(config, ex_observations, ex_actions)
        critic_def = critic_ensemble(config)
        flow_def = flow_field(config, full_actions.shape[-1])
        network_info = dict(
            actor_flow=(flow_def, (ex_observations, full_actions, ex_actions[..., :1])),
            critic=(critic_def, (ex_observations, full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
        )
        network = init_network(network_info, init_rng, adam(config['lr']), targets=('critic',))

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = ex_actions.shape[-1]
        config['full_action_dim'] = full_actions.shape[-1]
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


# The paper whose baseline this is: the drivers compare a run with its protocol unless --protocol says otherwise.
PROTOCOL = 'qam'


def paper_method(config, protocol='qam'):
    """'FBRAC' in the QAM paper; the QC paper has no such method."""
    return 'FBRAC' if protocol == 'qam' else None


# What each key of `get_config()` may hold; the drivers check a run's config against them before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('fbrac'),
    **CHUNKED_CRITIC_RULES,
    flow_steps=positive(int),
    best_of_n=positive(int),
    alpha=positive(float),
)


def get_config():
    """Default FBRAC hyperparameters (the authors' `agents/fbrac.py`, with action chunking on as every command of
    theirs runs it); the QAM paper sets `alpha` per domain (`sweeps/presets.py`)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='fbrac',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Adam learning rate of the flow and the critic.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the flow.
            actor_layer_norm=False,  # Layer norm in the flow.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of each critic.
            value_layer_norm=True,  # Layer norm in the critics.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked policy and critic; False gives n-step returns on single actions.
            num_qs=10,  # Critic ensemble size.
            rho=0.5,  # Pessimistic target: ensemble mean - rho * ensemble std.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic.
            flow_steps=10,  # Euler steps of the flow (each one backpropagated through).
            best_of_n=1,  # Chunks sampled per observation (targets and acting); the critic keeps the best.
            alpha=100.0,  # BC weight: the Q term enters as -Q / alpha.
        )
    )
