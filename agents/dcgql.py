"""QSM and DAC: diffusion policies over action chunks guided by the critic's action gradient, as the QAM paper's
baselines (Li and Levine, 2026; the authors' `agents/dcgql.py`, after Psenka et al. 2024, Q-score matching, and Fang
et al. 2025, diffusion actor-critic).

The critic is QC's chunked ensemble with the pessimistic target mean - rho * std. The policy is a DDPM
eps(s, x_t, t) over the flat chunk, trained on noised dataset chunks x_t = sqrt(abar_t) a + sqrt(1 - abar_t) eps
with two terms: `alpha` times the DDPM loss |eps - eps(s, x_t, t)|^2 (behaviour cloning), and
- QSM (`actor_loss_type='qsm'`): |-inv_temp grad_a Q(s, x_t) - eps(s, x_t, t)|^2, the noise prediction matched to
  the critic's score, so that denoising climbs Q;
- DAC (`actor_loss_type='dac'`): sqrt(1 - abar_t) grad_a Q(s, x_t) . eps(s, x_t, t), the noise prediction pushed
  against the critic's gradient.
Q's gradient is taken at the noised chunk, by the target critic (`use_target_critic_grad`). Both terms leave out
chunks that run past an episode end. Actions come from the reverse chain (`utils.diffusion.ddpm_sample`).
"""

import copy
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from utils.config_rules import CHUNKED_CRITIC_RULES, boolean, non_negative, one_of, positive
from utils.diffusion import NoiseNetwork, ddpm_sample, schedule
from utils.flax_utils import adam, gradient_step, init_network, nonpytree_field, scan_updates, sum_losses
from utils.flows import chunk_actions, chunk_td_loss, example_chunks
from utils.networks import critic_ensemble


class DCGQLAgent(flax.struct.PyTreeNode):
    """Diffusion classifier-guidance Q-learning over action chunks: QSM or DAC (`actor_loss_type`)."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    def critic_loss(self, batch, grad_params, rng):
        """TD loss of every critic toward the H-step return bootstrapped with mean - rho * std of the target ensemble
        at the diffusion policy's next chunk; chunks that run past an episode end are left out (`valid[..., -1]`)."""
        loss, info = chunk_td_loss(self, batch, grad_params, rng)
        return loss, {'critic_loss': loss, 'q': info['q_mean'], 'q_max': info['q_max'], 'q_min': info['q_min']}

    def actor_loss(self, batch, grad_params, rng):
        """`alpha` times the DDPM loss plus QSM's score-matching or DAC's gradient term at noised dataset chunks."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])  # (B, D), D = H * A or A
        observations = batch['observations']
        time_rng, rng = jax.random.split(rng)
        noise_rng, _ = jax.random.split(rng)
        t = jax.random.randint(time_rng, actions.shape[:-1], 1, self.config['diffusion_steps'] + 1)  # (B,)
        noise = jax.random.normal(noise_rng, actions.shape)  # (B, D)
        _, alpha_bars = self._schedule()
        signal, noise_scale = jnp.sqrt(alpha_bars[t])[:, None], jnp.sqrt(1 - alpha_bars[t])[:, None]  # (B, 1)
        noisy = signal * actions + noise_scale * noise  # (B, D)

        critic = self.network.select('target_critic' if self.config['use_target_critic_grad'] else 'critic')
        q_grad = jax.grad(lambda a: critic(observations, a).mean(axis=0).sum())(noisy)  # (B, D)
        eps_pred = self.network.select('actor')(observations, noisy, t[:, None], params=grad_params)  # (B, D)
        valid = batch['valid'][..., -1]
        bc_loss = jnp.mean(jnp.square(noise - eps_pred).mean(axis=-1) * valid)
        if self.config['actor_loss_type'] == 'qsm':
            guidance_loss = jnp.mean(jnp.square(-self.config['inv_temp'] * q_grad - eps_pred).mean(axis=-1) * valid)
        else:
            guidance_loss = jnp.mean((noise_scale * q_grad * eps_pred).mean(axis=-1) * valid)
        return self.config['alpha'] * bc_loss + guidance_loss, {'actor_loss': guidance_loss, 'bc_loss': bc_loss}

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

    def _schedule(self):
        """(alphas, alpha_bars) of the config's schedule, (T + 1,) each (constants of the compiled programs)."""
        return schedule(self.config['beta_schedule'], self.config['diffusion_steps'])

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """Action chunks (..., H * A) (or single actions (..., A)) for one observation or a batch, from the reverse
        diffusion chain."""
        rng = rng if rng is not None else self.rng
        ob_ndim = len(self.config['ob_dims'])
        batch_shape = observations.shape[: observations.ndim - ob_ndim]
        flat_obs = observations.reshape(-1, *observations.shape[observations.ndim - ob_ndim:])  # (B, *obs)
        noise_rng, sampler_rng = jax.random.split(rng)
        noise = jax.random.normal(noise_rng, (flat_obs.shape[0], self.config['full_action_dim']))  # (B, D)
        actor = self.network.select('actor')
        alphas, alpha_bars = self._schedule()
        actions = ddpm_sample(
            lambda x, t: actor(flat_obs, x, t), noise, sampler_rng, alphas, alpha_bars,
            clip_before=self.config['clip_sampler_before'], clip_after=self.config['clip_sampler_after'],
        )  # fmt: skip
        return actions.reshape(*batch_shape, -1)

    @classmethod
    def create(cls, seed, ex_observations, ex_actions, config):
        """Builds the agent from one example observation (obs_shape) and single-step action (A,), or a batch of each,
        and a `get_config()` with `horizon_length` set; `seed` fixes the initial params and the agent's key."""
        config = dict(config)
        schedule(config['beta_schedule'], 1)  # refuses an unknown schedule
        rng = jax.random.PRNGKey(seed)
        rng, init_rng = jax.random.split(rng)
        ex_observations, ex_actions, full_actions = example_chunks(config, ex_observations, ex_actions)
        full_action_dim = full_actions.shape[-1]  # H * A, or A without chunking

        critic_def = critic_ensemble(config)
        actor_def = NoiseNetwork(
            hidden_dims=tuple(config['actor_hidden_dims']),
            action_dim=full_action_dim,
            time_dim=config['time_dim'],
            layer_norm=config['actor_layer_norm'],
        )
        network_info = dict(
            critic=(critic_def, (ex_observations, full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
            actor=(actor_def, (ex_observations, full_actions, ex_actions[..., :1])),  # a time (B, 1)
        )
        network = init_network(network_info, init_rng, adam(config['lr'], clip_norm=config['clip_grad_norm']),
                               targets=('critic',))  # fmt: skip

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = ex_actions.shape[-1]
        config['full_action_dim'] = full_action_dim
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


# The paper whose baselines these are: the drivers compare a run with its protocol unless --protocol says otherwise.
PROTOCOL = 'qam'


def paper_method(config, protocol='qam'):
    """'QSM' or 'DAC' in the QAM paper (by `actor_loss_type`); the QC paper has neither."""
    if protocol != 'qam':
        return None
    return 'DAC' if config.get('actor_loss_type') == 'dac' else 'QSM'


# What each key of `get_config()` may hold; the drivers check a run's config against them before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('dcgql'),
    **CHUNKED_CRITIC_RULES,
    diffusion_steps=positive(int),
    time_dim=positive(int),
    beta_schedule=one_of('vp', 'cosine', 'linear'),
    actor_loss_type=one_of('qsm', 'dac'),
    clip_sampler_before=boolean(),
    clip_sampler_after=boolean(),
    inv_temp=non_negative(),
    alpha=non_negative(),
    use_target_critic_grad=boolean(),
    clip_grad_norm=positive(float),
)


def get_config():
    """Default QSM/DAC hyperparameters (the authors' `agents/dcgql.py`, with action chunking on as every command of
    theirs runs it); the QAM paper sets the loss type, `inv_temp`, `alpha` and the sampler's clipping per domain
    (`sweeps/presets.py`)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='dcgql',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Adam learning rate of every network.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the noise network (and of its time MLP).
            actor_layer_norm=False,  # Layer norm in the noise network.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of each critic.
            value_layer_norm=True,  # Layer norm in the critics.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked policy and critic; False gives n-step returns on single actions.
            num_qs=10,  # Critic ensemble size.
            rho=0.5,  # Pessimistic target: ensemble mean - rho * ensemble std.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic.
            diffusion_steps=10,  # Steps T of the diffusion chain.
            time_dim=64,  # Learned Fourier features of the diffusion step.
            beta_schedule='vp',  # Noise schedule: 'vp', 'cosine' or 'linear'.
            actor_loss_type='qsm',  # 'qsm' (score matching to -inv_temp grad Q) or 'dac' (grad Q . eps).
            clip_sampler_before=False,  # Clip the predicted clean chunk and step to the posterior mean (DAC's sampler).
            clip_sampler_after=False,  # Clip the chain to [-1, 1] after every step (QSM's sampler).
            inv_temp=1.0,  # QSM: the scale of grad Q the noise prediction matches.
            alpha=0.0,  # Weight of the DDPM (behaviour cloning) loss.
            use_target_critic_grad=True,  # Take grad Q from the target critic.
            clip_grad_norm=1.0,  # Clip every update's gradient to this global norm.
        )
    )
