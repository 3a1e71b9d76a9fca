"""Q-learning with adjoint matching (QAM; Li and Levine, 2026): QAM, QAM-F and QAM-E over action chunks.

The critic is QC's chunked ensemble with the pessimistic target mean - rho * std. The policy is two flows over the
flat chunk (H * A): `actor_slow`, a BC flow on dataset chunks, and `actor_fast`, fine-tuned by adjoint matching toward
pi_beta(a | s) exp(inv_temp * Q(s, a)): a memoryless SDE run with the fine-tuned drift gives a trajectory x_0..x_T,
the terminal adjoint -inv_temp * grad_a Q is carried back through the base drift's vector-Jacobian products, and the
fine-tuned velocity regresses onto the base velocity minus sigma_t^2 / 2 times the adjoint.
QAM-F (`fql_alpha > 0`) adds a one-step policy distilled from the fine-tuned flow while maximising Q (FQL's actor on
top); QAM-E (`edit_scale > 0`) adds a TanhNormal edit policy on (observation, flow chunk) that maximises Q under an
automatically tuned entropy weight. Sampling keeps the best of `best_of_n` chunks by the critic.
"""

import copy
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from utils.config_rules import (
    CHUNKED_CRITIC_RULES,
    at_most_one_positive,
    boolean,
    non_negative,
    number,
    one_of,
    optional,
    positive,
)
from utils.edit_policy import edit_loss, edit_networks, edit_target_entropy, edited_actions
from utils.flax_utils import adam, gradient_step, init_network, nonpytree_field, scan_updates, sum_losses
from utils.flows import (
    best_of_n,
    candidates,
    chunk_actions,
    chunk_td_loss,
    example_chunks,
    flow_matching_pair,
    memoryless_sde,
    summed_flow_actions,
)
from utils.networks import critic_ensemble, flow_field


class QAMAgent(flax.struct.PyTreeNode):
    """QAM agent over action chunks (QAM-F with `fql_alpha > 0`, QAM-E with `edit_scale > 0`)."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    def critic_loss(self, batch, grad_params, rng):
        """TD loss of every critic toward the H-step return bootstrapped with mean - rho * std of the target ensemble
        at the policy's next chunk; chunks that run past an episode end are left out (`valid[..., -1]`)."""
        return chunk_td_loss(self, batch, grad_params, rng)

    def adjoint_pass(self, observations, rng):
        """The memoryless trajectory of the fine-tuned flow and its lean adjoints, neither differentiated.

        Forward (`utils.flows.memoryless_sde`): x_0 ~ N(0, I), then for t = i h (h = 1 / flow_steps) x <- x + h (2 v -
        x / (t + h)) + sqrt(h) sigma_t eps with sigma_t = sqrt(2 (1 - t + h) / (t + h)) and v the fine-tuned velocity
        (plus the base's when `residual`); the last step is an ODE step of the base flow. Backward: the adjoint starts
        at -inv_temp * grad_a Q(s, x_1) and takes h-steps along the vector-Jacobian product of the base drift
        2 v_base - x / (t + h).
        Returns the states x_0..x_{T-1} (T, B, D), their adjoints (T, B, D), the times (T, B, 1) and adjoint stats.
        """
        num_steps = self.config['flow_steps']
        h = 1 / num_steps
        base = self.network.select('target_actor_slow' if self.config['target_actor'] else 'actor_slow')
        xs, ts, _ = memoryless_sde(self.network.select('actor_fast'), base, observations, rng,
                                   self.config['full_action_dim'], num_steps, self.config['residual'])  # fmt: skip
        critic = self.network.select('target_critic' if self.config['use_target_grad'] else 'critic')

        def q_sum(a):
            return critic(observations, jnp.clip(a, -1, 1) if self.config['clip_adj'] else a).mean(axis=0).sum()

        adj = -self.config['inv_temp'] * jax.grad(q_sum)(xs[-1])  # (B, D)
        info = {'adj_max': jnp.abs(adj).max(), 'adj_std': jnp.abs(adj).std(), 'adj_mean': jnp.abs(adj).mean()}
        adjs = [None] * num_steps
        for i in reversed(range(num_steps)):
            t = jnp.full_like(adj[..., :1], i / num_steps)

            def base_drift(xi, t=t):
                return 2 * base(observations, xi, t + h) - xi / (t + h)

            adj = adj + h * jax.vjp(base_drift, xs[i])[1](adj)[0]
            adjs[i] = adj
        return jnp.stack(xs[:-1]), jnp.stack(adjs), jnp.stack(ts), info

    def actor_loss(self, batch, grad_params, rng):
        """BC flow loss of `actor_slow`, adjoint-matching loss of `actor_fast`, and QAM-F's or QAM-E's actor loss."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])  # (B, D), D = H * A or A
        _, noise_rng, time_rng, adj_rng, variant_rng = jax.random.split(rng, 5)
        observations = batch['observations']

        x_t, t, vel = flow_matching_pair(noise_rng, time_rng, actions)
        pred = self.network.select('actor_slow')(observations, x_t, t, params=grad_params)
        flow_loss = jnp.mean(jnp.square(pred - vel).mean(axis=-1) * batch['valid'][..., -1])

        xs, adjs, ts, info = self.adjoint_pass(observations, adj_rng)  # (T, B, D), (T, B, D), (T, B, 1)
        h = 1 / self.config['flow_steps']
        sigmas = jnp.sqrt(2 * (1 - ts + h) / (ts + h))  # (T, B, 1)
        obs_rep = jnp.repeat(observations[None], self.config['flow_steps'], axis=0)  # (T, B, obs)
        v_fine = self.network.select('actor_fast')(obs_rep, xs, ts, params=grad_params)
        if self.config['residual']:
            v_diff = v_fine  # the fine-tuned flow is itself the correction to the base
        else:
            base = self.network.select('target_actor_slow' if self.config['target_actor'] else 'actor_slow')
            v_diff = v_fine - base(obs_rep, xs, ts)
        adj_loss = jnp.sum(jnp.square(2 * v_diff / sigmas + sigmas * adjs), axis=-1)  # (T, B)
        adj_loss = jnp.mean(jnp.sum(adj_loss, axis=0))
        info['adj_loss'] = adj_loss

        variant_loss = 0.0  # QAM: no policy on top of the fine-tuned flow
        if self.config['fql_alpha'] > 0:
            variant_loss, variant_info = self._one_step_loss(observations, grad_params, variant_rng)
            info.update(variant_info)
        elif self.config['edit_scale'] > 0:
            variant_loss, variant_info = self._edit_loss(observations, grad_params, variant_rng)
            info.update(variant_info)
        # `fast_loss` repeats `adj_loss` under the reference's second log name.
        return flow_loss + variant_loss + adj_loss, {'flow_loss': flow_loss, 'fast_loss': adj_loss, **info}

    def _one_step_loss(self, observations, grad_params, rng):
        """QAM-F: the one-step policy mu(s, z) regresses onto the fine-tuned flow's chunk from the same noise z
        (weight `fql_alpha`) and maximises the mean critic."""
        noise_rng, _ = jax.random.split(rng)
        noises = jax.random.normal(noise_rng, (observations.shape[0], self.config['full_action_dim']))
        flow_actions = self.compute_flow_actions(observations, noises, self._fine_flow())
        os_actions = self.network.select('one_step_actor')(observations, noises, params=grad_params)
        distill_loss = jnp.mean(jnp.square(flow_actions - os_actions))
        qs = self.network.select('critic')(observations, jnp.clip(os_actions, -1, 1))
        q_loss = -qs.mean(axis=0).mean()
        return q_loss + self.config['fql_alpha'] * distill_loss, {
            'fql_distill_loss': distill_loss,
            'fql_q_loss': q_loss,
        }

    def _edit_loss(self, observations, grad_params, rng):
        """QAM-E: the edit policy (`utils.edit_policy`) on chunks of the fine-tuned flow."""
        noise_rng, sample_rng = jax.random.split(rng)
        noises = jax.random.normal(noise_rng, (observations.shape[0], self.config['full_action_dim']))
        flow_actions = self.compute_flow_actions(observations, noises, self._fine_flow())  # (B, D)
        return edit_loss(self, observations, flow_actions, grad_params, sample_rng)

    def total_loss(self, batch, grad_params, rng=None):
        """Critic loss plus actor loss, with `critic/` and `actor/` prefixed infos."""
        rng = rng if rng is not None else self.rng
        _, actor_rng, critic_rng = jax.random.split(rng, 3)
        return sum_losses(
            critic=self.critic_loss(batch, grad_params, critic_rng),
            actor=self.actor_loss(batch, grad_params, actor_rng),
        )

    def _update(self, batch):
        return gradient_step(self, batch, targets=('critic', 'actor_slow'))

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

    def _fine_flow(self):
        """The fine-tuned policy's flows: `actor_fast`, on top of `actor_slow` when `residual`."""
        return ('actor_slow', 'actor_fast') if self.config['residual'] else ('actor_fast',)

    def compute_flow_actions(self, observations, noises, flows=('actor_slow',)):
        """Integrates the sum of the velocities of `flows` from `noises` with `flow_steps` Euler steps, clipped."""
        return summed_flow_actions(self.network, flows, observations, noises, self.config['flow_steps'])

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """Action chunks (..., H * A) (or single actions (..., A)) for one observation or a batch, in [-1, 1].

        QAM-F runs the one-step policy; otherwise the fine-tuned flow (the BC flow when inv_temp = 0), refined by the
        edit policy for QAM-E. Of `best_of_n` such chunks per observation the critic's best is kept.
        """
        rng = rng if rng is not None else self.rng
        noise_rng, edit_rng = jax.random.split(rng)
        # (..., N, *obs), (..., N, D)
        obs_rep, noises = candidates(observations, self.config, self.config['best_of_n'], noise_rng)
        if self.config['fql_alpha'] > 0:
            actions = jnp.clip(self.network.select('one_step_actor')(obs_rep, noises), -1, 1)
        else:
            flows = self._fine_flow() if self.config['inv_temp'] > 0 else ('actor_slow',)
            actions = self.compute_flow_actions(obs_rep, noises, flows)
            if self.config['edit_scale'] > 0:
                actions = edited_actions(self, obs_rep, actions, edit_rng)
            actions = jnp.clip(actions, -1, 1)
        q = self.network.select('critic')(obs_rep, actions).mean(axis=0)  # (..., N)
        return best_of_n(actions, q)

    @classmethod
    def create(cls, seed, ex_observations, ex_actions, config):
        """Builds the agent from one example observation (obs_shape) and single-step action (A,), or a batch of each,
        and a `get_config()` with `horizon_length` set; `seed` fixes the initial params and the agent's key."""
        config = dict(config)
        if config['fql_alpha'] > 0 and config['edit_scale'] > 0:
            raise ValueError('fql_alpha and edit_scale exclude each other: set only one > 0')

        rng = jax.random.PRNGKey(seed)
        rng, init_rng = jax.random.split(rng)
        ex_observations, ex_actions, full_actions = example_chunks(config, ex_observations, ex_actions)
        action_dim = ex_actions.shape[-1]
        full_action_dim = full_actions.shape[-1]  # H * A, or A without chunking
        ex_times = ex_actions[..., :1]
        config['edit_target_entropy'] = edit_target_entropy(config, full_action_dim)

        critic_def = critic_ensemble(config)
        actor_def = flow_field(config, full_action_dim)
        network_info = dict(
            critic=(critic_def, (ex_observations, full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
            actor_fast=(copy.deepcopy(actor_def), (ex_observations, full_actions, ex_times)),
            actor_slow=(copy.deepcopy(actor_def), (ex_observations, full_actions, ex_times)),
            target_actor_slow=(copy.deepcopy(actor_def), (ex_observations, full_actions, ex_times)),
        )
        if config['fql_alpha'] > 0:
            network_info['one_step_actor'] = (copy.deepcopy(actor_def), (ex_observations, full_actions))
        if config['edit_scale'] > 0:
            network_info.update(edit_networks(config, ex_observations, full_actions))
        network_tx = adam(config['lr'], clip_norm=1.0 if config['clip_grad'] else None)
        network = init_network(network_info, init_rng, network_tx, targets=('critic', 'actor_slow'))

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = action_dim
        config['full_action_dim'] = full_action_dim
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


# The paper that defines this agent: the drivers compare a run with its protocol unless --protocol says otherwise.
PROTOCOL = 'qam'


def paper_method(config, protocol='qam'):
    """The QAM paper's name of this config's variant; none in the QC paper, which has no QAM."""
    if protocol != 'qam':
        return None
    if config.get('fql_alpha'):
        return 'QAM-F'
    return 'QAM-E' if config.get('edit_scale') else 'QAM'


# What each key of `get_config()` may hold; the drivers check a run's config against them before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('qam'),
    **CHUNKED_CRITIC_RULES,
    flow_steps=positive(int),
    best_of_n=positive(int),
    inv_temp=non_negative(),
    fql_alpha=non_negative(),
    edit_scale=non_negative(),
    target_actor=boolean(),
    residual=boolean(),
    clip_adj=boolean(),
    clip_grad=boolean(),
    use_target_grad=boolean(),
    edit_target_entropy=optional(number()),
    edit_target_entropy_multiplier=number(),
)
CONFIG_CHECKS = (at_most_one_positive('fql_alpha', 'edit_scale'),)


def get_config():
    """Default QAM hyperparameters (the authors' `agents/qam.py`, with action chunking on as every command of theirs
    runs it); `fql_alpha > 0` gives QAM-F, `edit_scale > 0` QAM-E."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='qam',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Adam learning rate of every network.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the flows, the one-step and the edit policy.
            actor_layer_norm=False,  # Layer norm in the flows and the one-step policy.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of each critic.
            value_layer_norm=True,  # Layer norm in the critics.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked policy and critic (QAM); False gives n-step returns on single actions.
            num_qs=10,  # Critic ensemble size.
            rho=0.5,  # Pessimistic target: ensemble mean - rho * ensemble std.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic and the target BC flow.
            flow_steps=10,  # Euler (and memoryless SDE) steps of every flow.
            best_of_n=1,  # Chunks sampled per observation (targets and acting); the critic keeps the best.
            inv_temp=0.3,  # Inverse temperature of exp(inv_temp * Q) that the fine-tuned flow targets; 0: BC flow.
            fql_alpha=0.0,  # > 0: QAM-F, a one-step policy distilled (this weight) from the fine-tuned flow.
            edit_scale=0.0,  # > 0: QAM-E, an edit policy refines the flow's chunk by up to this scale.
            target_actor=True,  # The adjoint pass uses the EMA target of the BC flow as the base flow.
            residual=False,  # The fine-tuned flow is a correction added to the base flow instead of a full flow.
            clip_adj=True,  # The terminal adjoint takes Q's gradient at the chunk clipped to [-1, 1].
            clip_grad=True,  # Clip every update's gradient to global norm 1.
            use_target_grad=True,  # The terminal adjoint takes the target critic's gradient.
            edit_target_entropy=ml_collections.config_dict.placeholder(float),  # QAM-E entropy target; unset: auto.
            edit_target_entropy_multiplier=0.5,  # Unset target: -multiplier * chunk dimension.
        )
    )
