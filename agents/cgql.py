"""CGQL: classifier-guidance Q-learning over action chunks, the QAM paper's baseline (Li and Levine, 2026; the
authors' `agents/cgql.py`): a BC flow steered while it integrates by the critic's action gradient, the critic
standing in for the classifier.

The critic is QC's chunked ensemble with the pessimistic target mean - rho * std, here a function of the time too,
Q(s, x_t, t), with t = 1 the clean chunk the TD loss trains. Sampling runs the (target) BC flow and adds, at every
step after the first, guidance_coef * (inv_temp (1 - t) grad_x Q + x) / t to the velocity. The score comes from
- 'simple' (CGQL): Q at t = 1 evaluated at the noisy x_t;
- 'mse' (CGQL-M) and 'linex' (CGQL-L): the time-conditioned Q(s, x_t, t), trained (weight `noisy_coef`) on the
  flow's noisy chunks x_t = (1 - t) z + t a toward the target Q of the clean chunk, by squared error or by the
  Itakura-Saito (linex) loss on exp(inv_temp Q) (clipped at `isd_clip`).
The critic keeps the best of `best_of_n` guided chunks.
"""

import copy
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from utils.config_rules import CHUNKED_CRITIC_RULES, boolean, non_negative, one_of, positive
from utils.flax_utils import adam, gradient_step, init_network, nonpytree_field, scan_updates, sum_losses
from utils.flows import best_of_n, candidates, chunk_actions, chunk_td_loss, example_chunks, flow_matching_pair
from utils.networks import critic_ensemble, flow_field


class CGQLAgent(flax.struct.PyTreeNode):
    """A BC flow guided by a (time-conditioned) critic's action gradient: CGQL, CGQL-M or CGQL-L (`mode`)."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    def critic_loss(self, batch, grad_params, rng):
        """QC's chunked TD loss on clean chunks (t = 1) at the guided policy's next chunks; with 'mse' or 'linex'
        plus `noisy_coef` times the time-conditioned critic's loss on the flow's noisy chunks."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])  # (B, D), D = H * A or A
        observations = batch['observations']
        _, sample_rng, time_rng, noise_rng = jax.random.split(rng, 4)
        t1 = jnp.ones_like(actions[..., :1])  # (B, 1): the clean chunk
        td_loss, info = chunk_td_loss(self, batch, grad_params, sample_rng, times=t1)
        if self.config['mode'] == 'simple':
            return td_loss, info
        valid = batch['valid'][..., -1]

        t = jax.random.uniform(time_rng, t1.shape)
        noisy = (1 - t) * jax.random.normal(noise_rng, actions.shape) + t * actions  # (B, D)
        clean_q = self.network.select('target_critic')(observations, actions, t1)  # (num_qs, B)
        noisy_q = self.network.select('critic')(observations, noisy, t, params=grad_params)  # (num_qs, B)
        if self.config['mode'] == 'mse':
            noisy_loss = (jnp.square(noisy_q - clean_q) * valid).mean()
        else:  # linex: exp(d) - d up to a constant, d = inv_temp (Q_clean - Q_t), linear beyond isd_clip
            inv_temp, clip = self.config['inv_temp'], self.config['isd_clip']
            delta = (clean_q - noisy_q) * inv_temp
            beyond = delta > clip
            linex = jnp.where(beyond, delta, jnp.exp(jnp.where(beyond, clip, delta)) + noisy_q * inv_temp)
            noisy_loss = (linex * valid).mean()
            info['exp_bias'] = jnp.mean(jnp.exp(noisy_q * inv_temp) - jnp.exp(clean_q * inv_temp))
        info['noisy_critic_loss'] = noisy_loss
        return td_loss + self.config['noisy_coef'] * noisy_loss, info

    def actor_loss(self, batch, grad_params, rng):
        """The BC flow's flow-matching loss on dataset chunks (left out past an episode end)."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])
        _, noise_rng, time_rng = jax.random.split(rng, 3)
        x_t, t, vel = flow_matching_pair(noise_rng, time_rng, actions)
        pred = self.network.select('actor')(batch['observations'], x_t, t, params=grad_params)
        flow_loss = jnp.mean(jnp.square(pred - vel).mean(axis=-1) * batch['valid'][..., -1])
        return flow_loss, {'flow_loss': flow_loss}

    def total_loss(self, batch, grad_params, rng=None):
        """Critic loss plus actor loss, with `critic/` and `actor/` prefixed infos."""
        rng = rng if rng is not None else self.rng
        _, actor_rng, critic_rng = jax.random.split(rng, 3)
        return sum_losses(
            critic=self.critic_loss(batch, grad_params, critic_rng),
            actor=self.actor_loss(batch, grad_params, actor_rng),
        )

    def _update(self, batch):
        return gradient_step(self, batch, targets=('critic', 'actor'))

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
        """Guided Euler integration of the (target) BC flow from `noises` (..., D), clipped to [-1, 1]: after the
        first step the velocity gains guidance_coef * (inv_temp (1 - t) grad_x Q(s, x, t') + x) / t, t' = 1 for
        'simple', t otherwise."""
        flow = self.network.select('target_actor' if self.config['target_guidance'] else 'actor')
        critic = self.network.select('critic')
        steps, x = self.config['flow_steps'], noises
        for i in range(steps):
            t = jnp.full((*x.shape[:-1], 1), i / steps)
            vel = flow(observations, x, t)
            if self.config['inv_temp'] > 0 and i > 0:
                score_time = jnp.ones_like(t) if self.config['mode'] == 'simple' else t
                score = jax.grad(lambda a, tt=score_time: critic(observations, a, tt).mean(axis=0).sum())(x)
                vel = vel + (score * (1 - t) * self.config['inv_temp'] + x) * self.config['guidance_coef'] / t
            x = x + vel / steps
        return jnp.clip(x, -1, 1)

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """Guided chunks (..., H * A) (or single actions (..., A)), the critic's best (at t = 1) of `best_of_n`."""
        rng = rng if rng is not None else self.rng
        # (..., N, *obs), (..., N, D)
        obs_rep, noises = candidates(observations, self.config, self.config['best_of_n'], rng)
        actions = self.compute_flow_actions(obs_rep, noises)
        q = self.network.select('critic')(obs_rep, actions, jnp.ones_like(actions[..., :1])).mean(axis=0)
        return best_of_n(actions, q)

    @classmethod
    def create(cls, seed, ex_observations, ex_actions, config):
        """Builds the agent from one example observation (obs_shape) and single-step action (A,), or a batch of each,
        and a `get_config()` with `horizon_length` set; `seed` fixes the initial params and the agent's key."""
        config = dict(config)
        if config['num_qs'] < 2:
            raise ValueError('CGQL needs num_qs >= 2 (its critic has no ensemble axis with one)')
        rng = jax.random.PRNGKey(seed)
        rng, init_rng = jax.random.split(rng)
        ex_observations, ex_actions, full_actions = example_chunks(config, ex_observations, ex_actions)
        ex_times = ex_actions[..., :1]

        critic_def = critic_ensemble(config)
        flow_def = flow_field(config, full_actions.shape[-1])
        network_info = dict(
            actor=(flow_def, (ex_observations, full_actions, ex_times)),
            target_actor=(copy.deepcopy(flow_def), (ex_observations, full_actions, ex_times)),
            critic=(critic_def, (ex_observations, full_actions, ex_times)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions, ex_times)),
        )
        network = init_network(network_info, init_rng, adam(config['lr']), targets=('critic', 'actor'))

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = ex_actions.shape[-1]
        config['full_action_dim'] = full_actions.shape[-1]
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


# The paper whose baselines these are: the drivers compare a run with its protocol unless --protocol says otherwise.
PROTOCOL = 'qam'


def paper_method(config, protocol='qam'):
    """'CGQL', 'CGQL-M' or 'CGQL-L' in the QAM paper (by `mode`); the QC paper has none of them."""
    if protocol != 'qam':
        return None
    return {'simple': 'CGQL', 'mse': 'CGQL-M', 'linex': 'CGQL-L'}.get(config.get('mode'), 'CGQL')


# What each key of `get_config()` may hold; the drivers check a run's config against them before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('cgql'),
    **CHUNKED_CRITIC_RULES,
    flow_steps=positive(int),
    best_of_n=positive(int),
    mode=one_of('simple', 'mse', 'linex'),
    noisy_coef=non_negative(),
    inv_temp=non_negative(),
    guidance_coef=non_negative(),
    isd_clip=positive(float),
    target_guidance=boolean(),
)


def get_config():
    """Default CGQL hyperparameters (the authors' `agents/cgql.py`, with action chunking on as every command of theirs
    runs it); the QAM paper sets `mode`, `inv_temp`, `guidance_coef` and `noisy_coef` per domain
    (`sweeps/presets.py`)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='cgql',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Adam learning rate of every network.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the BC flow.
            actor_layer_norm=False,  # Layer norm in the BC flow.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of each (time-conditioned) critic.
            value_layer_norm=True,  # Layer norm in the critics.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked policy and critic; False gives n-step returns on single actions.
            num_qs=10,  # Critic ensemble size (at least 2).
            rho=0.5,  # Pessimistic target: ensemble mean - rho * ensemble std.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic and the target BC flow.
            flow_steps=10,  # Euler steps of the guided flow.
            best_of_n=1,  # Guided chunks sampled per observation (targets and acting); the critic keeps the best.
            mode='simple',  # The score: 'simple' (Q at t = 1), 'mse' or 'linex' (a time-conditioned Q, so trained).
            noisy_coef=0.001,  # Weight of the time-conditioned critic's loss ('mse', 'linex').
            inv_temp=1.0,  # Inverse temperature of exp(inv_temp Q) that guidance targets (0: no guidance).
            guidance_coef=0.1,  # Scale of the guidance term added to the flow's velocity.
            isd_clip=5.0,  # 'linex': the exponent is linear beyond this, for numerical stability.
            target_guidance=True,  # Guide the EMA target of the BC flow (else the learning flow).
        )
    )
