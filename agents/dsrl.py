"""DSRL: reinforcement learning in the latent-noise space of a BC flow (Wagenmaker et al. 2025, arXiv 2506.15799),
over action chunks, as the QAM paper's baseline (Li and Levine, 2026; the authors' `agents/dsrl.py`).

The critic is QC's chunked ensemble with the pessimistic target mean - rho * std. A BC flow (`actor_bc_flow`, with an
EMA target) maps noise z to chunks a = f(s, z). A second critic ensemble on noise, Q_z(s, z), is distilled from the
critic at the chunks the (target) flow makes of N(0, I) noise, and a TanhNormal noise policy pi(z | s), scaled by
`noise_scale`, maximises Q_z under SAC's entropy term with a tuned weight. Acting and the target's next chunks run the
flow from the noise policy's samples; the critic keeps the best of `best_of_n`.
"""

import copy
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from rlpd_distributions import TanhNormal
from utils.config_rules import (
    CHUNKED_CRITIC_RULES,
    boolean,
    non_negative,
    number,
    one_of,
    optional,
    positive,
)
from utils.flax_utils import adam, gradient_step, init_network, nonpytree_field, scan_updates, sum_losses
from utils.flows import best_of_n, chunk_actions, chunk_td_loss, euler_flow, example_chunks, flow_matching_pair
from utils.networks import MLP, Temperature, critic_ensemble, flow_field, temperature_loss


class DSRLAgent(flax.struct.PyTreeNode):
    """A noise-space SAC policy steering a BC flow over action chunks."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    def critic_loss(self, batch, grad_params, rng):
        """QC's chunked TD loss at the policy's next chunks, plus the noise critic's regression onto the critic at
        the flow's chunks of N(0, I) noise."""
        rng, sample_rng, _ = jax.random.split(rng, 3)  # the reference's splits
        td_loss, info = chunk_td_loss(self, batch, grad_params, sample_rng)

        _, noise_rng = jax.random.split(rng)
        noises = jax.random.normal(noise_rng, chunk_actions(batch['actions'], self.config['action_chunking']).shape)
        chunks = self.compute_flow_actions(batch['observations'], noises)  # (B, D)
        target_qs = self.network.select('critic')(batch['observations'], chunks)  # (num_qs, B), no gradient
        qs = self.network.select('z_critic')(batch['observations'], noises, params=grad_params)
        distill_loss = jnp.mean((qs - target_qs) ** 2)
        return td_loss + distill_loss, {'total_loss': td_loss + distill_loss, 'distill_loss': distill_loss, **info}

    def actor_loss(self, batch, grad_params, rng):
        """The BC flow's flow-matching loss, the noise policy's SAC loss on Q_z and the entropy weight's loss."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])  # (B, D), D = H * A or A
        observations = batch['observations']
        rng, noise_rng, time_rng = jax.random.split(rng, 3)
        x_t, t, vel = flow_matching_pair(noise_rng, time_rng, actions)
        pred = self.network.select('actor_bc_flow')(observations, x_t, t, params=grad_params)
        flow_loss = jnp.mean(jnp.square(pred - vel).mean(axis=-1) * batch['valid'][..., -1])

        dist = self.network.select('actor')(observations, params=grad_params)
        z, log_probs = dist.sample_and_log_prob_event_first(rng)  # (B, D), (B,); TFP's draws, as the reference
        q = self.network.select('z_critic')(observations, z * self.config['noise_scale']).mean(axis=0)  # (B,)
        actor_loss = (log_probs * self.network.select('temp')() - q).mean()
        alpha = self.network.select('temp')(params=grad_params)
        alpha_loss, _ = temperature_loss(alpha, log_probs, self.config['target_entropy'])
        total = flow_loss + actor_loss + alpha_loss
        return total, {
            'total_loss': total,
            'flow_loss': flow_loss,
            'actor_loss': actor_loss,
            'alpha_loss': alpha_loss,
            'alpha': alpha,
            'entropy': -log_probs.mean(),
            'action_std': dist.distribution.stddev().mean(),
            'q': q.mean(),
        }

    def total_loss(self, batch, grad_params, rng=None):
        """Critic loss plus actor loss, with `critic/` and `actor/` prefixed infos."""
        rng = rng if rng is not None else self.rng
        _, actor_rng, critic_rng = jax.random.split(rng, 3)
        return sum_losses(
            critic=self.critic_loss(batch, grad_params, critic_rng),
            actor=self.actor_loss(batch, grad_params, actor_rng),
        )

    def _update(self, batch):
        return gradient_step(self, batch, targets=('critic', 'actor_bc_flow'))

    @jax.jit
    def update(self, batch):
        """One gradient step on a batch from `sample_sequence`, then soft updates of the target critic and target BC
        flow. Returns (agent, info)."""
        return self._update(batch)

    @jax.jit
    def batch_update(self, batch):
        """`U` sequential updates fused in one `lax.scan`; every leaf of `batch` has a leading (U,) axis.

        Equivalent to U calls of `update`; the returned info is the last update's.
        """
        return scan_updates(lambda agent, b: agent._update(b), self, batch)

    def compute_flow_actions(self, observations, noises):
        """The BC flow's chunks from `noises` (..., D) (its EMA target's with `use_target_latent`): `flow_steps`
        Euler steps, clipped to [-1, 1]."""
        flow = self.network.select('target_actor_bc_flow' if self.config['use_target_latent'] else 'actor_bc_flow')
        return euler_flow(lambda x, t: flow(observations, x, t), noises, self.config['flow_steps'])

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """Action chunks (..., H * A) (or single actions (..., A)): the flow run from noise the noise policy samples
        (times `noise_scale`), the critic's best of `best_of_n` per observation."""
        rng = rng if rng is not None else self.rng
        obs_rep = jnp.repeat(jnp.expand_dims(observations, -2), self.config['best_of_n'], axis=-2)  # (..., N, obs)
        z, _ = self.network.select('actor')(obs_rep).sample_and_log_prob_event_first(rng)  # (..., N, D)
        actions = self.compute_flow_actions(obs_rep, jnp.clip(z, -1, 1) * self.config['noise_scale'])
        q = self.network.select('critic')(obs_rep, actions).mean(axis=0)  # (..., N)
        return best_of_n(actions, q)

    @classmethod
    def create(cls, seed, ex_observations, ex_actions, config):
        """Builds the agent from one example observation (obs_shape) and single-step action (A,), or a batch of each,
        and a `get_config()` with `horizon_length` set; `seed` fixes the initial params and the agent's key."""
        config = dict(config)
        rng = jax.random.PRNGKey(seed)
        rng, init_rng = jax.random.split(rng)
        ex_observations, ex_actions, full_actions = example_chunks(config, ex_observations, ex_actions)
        full_action_dim = full_actions.shape[-1]  # H * A, or A without chunking
        if config['target_entropy'] is None:
            config['target_entropy'] = -config['target_entropy_multiplier'] * full_action_dim

        critic_def = critic_ensemble(config)
        flow_def = flow_field(config, full_action_dim)
        trunk = functools.partial(MLP, hidden_dims=tuple(config['actor_hidden_dims']), activate_final=True)
        flow_inputs = (ex_observations, full_actions, full_actions[..., :1])
        network_info = dict(
            critic=(critic_def, (ex_observations, full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
            z_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
            actor_bc_flow=(flow_def, flow_inputs),
            target_actor_bc_flow=(copy.deepcopy(flow_def), flow_inputs),
            actor=(TanhNormal(trunk, full_action_dim), (ex_observations,)),
            temp=(Temperature(), ()),
        )
        network = init_network(network_info, init_rng, adam(config['lr']), targets=('critic', 'actor_bc_flow'))

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = ex_actions.shape[-1]
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


# The paper whose baseline this is: the drivers compare a run with its protocol unless --protocol says otherwise.
PROTOCOL = 'qam'


def paper_method(config, protocol='qam'):
    """'DSRL' in the QAM paper; the QC paper has no such method."""
    return 'DSRL' if protocol == 'qam' else None


# What each key of `get_config()` may hold; the drivers check a run's config against them before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('dsrl'),
    **CHUNKED_CRITIC_RULES,
    flow_steps=positive(int),
    best_of_n=positive(int),
    noise_scale=non_negative(),
    target_entropy=optional(number()),
    target_entropy_multiplier=number(),
    use_target_latent=boolean(),
)


def get_config():
    """Default DSRL hyperparameters (the authors' `agents/dsrl.py`, with action chunking on as every command of
    theirs runs it); the QAM paper sets `noise_scale` per domain (`sweeps/presets.py`)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='dsrl',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Adam learning rate of every network.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the BC flow and the noise policy.
            actor_layer_norm=False,  # Layer norm in the BC flow.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of each critic and noise critic.
            value_layer_norm=True,  # Layer norm in the critics.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked policy and critic; False gives n-step returns on single actions.
            num_qs=10,  # Critic (and noise critic) ensemble size.
            rho=0.5,  # Pessimistic target: ensemble mean - rho * ensemble std.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic and the target BC flow.
            flow_steps=10,  # Euler steps of the BC flow.
            best_of_n=1,  # Chunks sampled per observation (targets and acting); the critic keeps the best.
            noise_scale=1.0,  # The noise policy's tanh output is scaled by this before entering the flow.
            target_entropy=ml_collections.config_dict.placeholder(float),  # Noise policy entropy target; unset: auto.
            target_entropy_multiplier=0.5,  # Unset target: -multiplier * chunk dimension.
            use_target_latent=True,  # The noise space is the EMA target flow's (else the learning flow's).
        )
    )
