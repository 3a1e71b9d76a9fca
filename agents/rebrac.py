"""ReBRAC (Tarasov et al. 2023, revisited behaviour-regularised actor-critic) over action chunks, as the QAM paper's
baseline (Li and Levine, 2026; the authors' `agents/rebrac.py`): TD3+BC with layer norm and separate penalties.

The critic is QC's chunked ensemble with the pessimistic target mean - rho * std, bootstrapped at the target actor's
chunk plus clipped Gaussian noise (TD3's target smoothing). The actor is deterministic, a(s) = tanh(f(s)) over the
flat chunk, and maximises Q normalised by its mean magnitude minus `alpha_actor` times the squared distance to the
dataset chunk (left out for chunks that run past an episode end). The target critic and target actor move on every
`actor_freq`-th update only; the actor itself learns on every update, as the reference's code does (its driver's
`full_update` gates the target updates). Acting adds the same clipped noise.
"""

import copy
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from utils.config_rules import CHUNKED_CRITIC_RULES, non_negative, one_of, positive
from utils.flax_utils import adam, gradient_step, init_network, nonpytree_field, scan_updates, sum_losses
from utils.flows import chunk_actions, chunk_td_loss, example_chunks
from utils.networks import DeterministicActor, aggregate_q, critic_ensemble


class ReBRACAgent(flax.struct.PyTreeNode):
    """ReBRAC over action chunks with a critic ensemble and delayed target updates."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    def critic_loss(self, batch, grad_params, rng):
        """TD loss of every critic toward the H-step return bootstrapped with mean - rho * std of the target ensemble
        at the target actor's smoothed next chunk; chunks that run past an episode end are left out."""
        _, noise_rng = jax.random.split(rng)
        next_actions = self.network.select('target_actor')(batch['next_observations'][..., -1, :])  # (B, D)
        return chunk_td_loss(self, batch, grad_params, None, next_actions=self._smoothed(next_actions, noise_rng))

    def actor_loss(self, batch, grad_params, rng):
        """-Q(s, a(s)) / E|Q| (the scale held fixed) plus alpha_actor |a(s) - a_data|^2 on chunks inside one episode."""
        actions = self.network.select('actor')(batch['observations'], params=grad_params)  # (B, D)
        q = aggregate_q(self.network.select('critic')(batch['observations'], actions), 'mean', self.config['rho'])
        dataset_actions = chunk_actions(batch['actions'], self.config['action_chunking'])
        mse = jnp.square(actions - dataset_actions).sum(axis=-1) * batch['valid'][..., -1]  # (B,)
        scale = jax.lax.stop_gradient(1 / jnp.abs(q).mean())
        q_loss = -(scale * q).mean()
        bc_loss = (self.config['alpha_actor'] * mse).mean()
        return q_loss + bc_loss, {
            'total_loss': q_loss + bc_loss,
            'actor_loss': q_loss,
            'bc_loss': bc_loss,
            'mse': mse.mean(),
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
        return gradient_step(self, batch, targets=('critic', 'actor'), target_period=self.config['actor_freq'])

    @jax.jit
    def update(self, batch):
        """One gradient step of the critic and the actor; on every `actor_freq`-th update also a soft update of the
        target critic and target actor. Returns (agent, info)."""
        return self._update(batch)

    @jax.jit
    def batch_update(self, batch):
        """`U` sequential updates fused in one `lax.scan`; every leaf of `batch` has a leading (U,) axis.

        Equivalent to U calls of `update` (the targets move on the updates whose count is a multiple of
        `actor_freq`); the returned info is the last update's.
        """
        return scan_updates(lambda agent, b: agent._update(b), self, batch)

    def _smoothed(self, actions, rng):
        """clip(actions + clip(actor_noise * N(0, I), +-actor_noise_clip), -1, 1)."""
        noise = jax.random.normal(rng, actions.shape) * self.config['actor_noise']
        noise = jnp.clip(noise, -self.config['actor_noise_clip'], self.config['actor_noise_clip'])
        return jnp.clip(actions + noise, -1, 1)

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """The actor's chunks (..., H * A) (or single actions (..., A)) plus clipped exploration noise, in [-1, 1]."""
        rng = rng if rng is not None else self.rng
        return self._smoothed(self.network.select('actor')(observations), rng)

    @classmethod
    def create(cls, seed, ex_observations, ex_actions, config):
        """Builds the agent from one example observation (obs_shape) and single-step action (A,), or a batch of each,
        and a `get_config()` with `horizon_length` set; `seed` fixes the initial params and the agent's key."""
        config = dict(config)
        rng = jax.random.PRNGKey(seed)
        rng, init_rng = jax.random.split(rng)
        ex_observations, ex_actions, full_actions = example_chunks(config, ex_observations, ex_actions)

        critic_def = critic_ensemble(config)
        actor_def = DeterministicActor(
            hidden_dims=tuple(config['actor_hidden_dims']),
            action_dim=full_actions.shape[-1],
            layer_norm=config['actor_layer_norm'],
            final_fc_init_scale=config['actor_fc_scale'],
        )
        network_info = dict(
            critic=(critic_def, (ex_observations, full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
            actor=(actor_def, (ex_observations,)),
            target_actor=(copy.deepcopy(actor_def), (ex_observations,)),
        )
        network = init_network(network_info, init_rng, adam(config['lr']), targets=('critic', 'actor'))

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = ex_actions.shape[-1]
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


# The paper whose baseline this is: the drivers compare a run with its protocol unless --protocol says otherwise.
PROTOCOL = 'qam'


def paper_method(config, protocol='qam'):
    """'ReBRAC' in the QAM paper; the QC paper has no such method."""
    return 'ReBRAC' if protocol == 'qam' else None


# What each key of `get_config()` may hold; the drivers check a run's config against them before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('rebrac'),
    **CHUNKED_CRITIC_RULES,
    actor_noise=non_negative(),
    alpha_actor=non_negative(),
    actor_freq=positive(int),
    actor_fc_scale=positive(float),
    actor_noise_clip=non_negative(),
)


def get_config():
    """Default ReBRAC hyperparameters (the authors' `agents/rebrac.py`, with action chunking on as every command of
    theirs runs it); the QAM paper sets `alpha_actor` and `actor_noise` per domain (`sweeps/presets.py`)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='rebrac',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Adam learning rate of the critic and the actor.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the actor.
            actor_layer_norm=False,  # Layer norm in the actor.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of each critic.
            value_layer_norm=True,  # Layer norm in the critics.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked policy and critic; False gives n-step returns on single actions.
            num_qs=10,  # Critic ensemble size.
            rho=0.5,  # Pessimism: target and actor use the ensemble mean - rho * ensemble std.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic and target actor (on their updates).
            actor_noise=0.2,  # Std of the Gaussian noise on the target's next chunk and on acting.
            alpha_actor=0.0,  # Weight of the actor's squared distance to the dataset chunk.
            actor_freq=2,  # The targets move on every actor_freq-th update.
            actor_fc_scale=0.01,  # Initial scale of the actor's last layer.
            actor_noise_clip=0.5,  # The noise is clipped to +-actor_noise_clip.
        )
    )
