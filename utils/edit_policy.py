"""The edit policy of EXPO (Dong et al. 2025, arXiv 2507.07986), shared by FEdit and QAM-E: a TanhNormal pi_e(e | s, a)
on an observation and a base policy's chunk a, whose edit e moves the chunk to clip(a + edit_scale * e) so as to
maximise the mean critic, under SAC's entropy term with a tuned weight. The agent holds it as the modules
`edit_actor` and `edit_alpha` and reads `edit_scale` and `edit_target_entropy` from its config."""

import functools

import jax.numpy as jnp

from rlpd_distributions import TanhNormal
from utils.networks import MLP, Temperature, temperature_loss


def edit_networks(config, ex_observations, full_actions):
    """The `network_info` entries of the edit policy (widths `actor_hidden_dims`) and its entropy weight (1 at
    first), for example observations (B, *obs) and chunks (B, D)."""
    trunk = functools.partial(MLP, hidden_dims=tuple(config['actor_hidden_dims']), activate_final=True)
    full_action_dim = full_actions.shape[-1]
    return dict(
        edit_actor=(TanhNormal(trunk, full_action_dim), (jnp.concatenate([ex_observations, full_actions], axis=-1),)),
        edit_alpha=(Temperature(), ()),
    )


def edit_target_entropy(config, full_action_dim):
    """The entropy target: `edit_target_entropy`, else -`edit_target_entropy_multiplier` * chunk dimension."""
    if config['edit_target_entropy'] is not None:
        return config['edit_target_entropy']
    return -config['edit_target_entropy_multiplier'] * full_action_dim


def edited_actions(agent, observations, actions, rng):
    """Chunks (..., D) moved by a sampled edit: actions + edit_scale * e, e ~ pi_e(. | s, a) (not clipped)."""
    edit_dist = agent.network.select('edit_actor')(jnp.concatenate([observations, actions], axis=-1))
    edit, _ = edit_dist.sample_and_log_prob_event_first(rng)  # TFP's layout of the draws, as the reference
    return actions + agent.config['edit_scale'] * edit


def edit_loss(agent, observations, base_actions, grad_params, rng):
    """-Q(s, clip(a + edit_scale e)) + alpha log pi_e(e | s, a) for e ~ pi_e on the base chunks `base_actions` (B, D)
    (no gradient into them), plus the weight's loss alpha (H[pi_e] - target), which raises alpha while the entropy
    is below its target. Returns (loss, info)."""
    edit_dist = agent.network.select('edit_actor')(
        jnp.concatenate([observations, base_actions], axis=-1), params=grad_params
    )
    edit, log_probs = edit_dist.sample_and_log_prob_event_first(rng)  # (B, D), (B,)
    edited = jnp.clip(base_actions + agent.config['edit_scale'] * edit, -1, 1)
    q_loss = -agent.network.select('critic')(observations, edited).mean(axis=0).mean()
    entropy_loss = (log_probs * agent.network.select('edit_alpha')()).mean()
    alpha = agent.network.select('edit_alpha')(params=grad_params)
    alpha_loss, entropy = temperature_loss(alpha, log_probs, agent.config['edit_target_entropy'])
    info = {
        'edit_q_loss': q_loss,
        'edit_entropy_loss': entropy_loss,
        'edit_alpha_loss': alpha_loss,
        'edit_entropy': entropy,
        'edit_alpha': alpha,
    }
    return q_loss + entropy_loss + alpha_loss, info
