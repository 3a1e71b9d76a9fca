"""FEdit: a BC flow policy refined by EXPO's edit policy (Dong et al. 2025, arXiv 2507.07986), over action chunks, as
the QAM paper's baseline (Li and Levine, 2026; the authors' `agents/fedit.py`).

The critic is QC's chunked ensemble with the pessimistic target mean - rho * std. The policy is a BC flow on dataset
chunks (`actor_bc_flow`), never steered by Q, and a TanhNormal edit policy pi_e(e | s, a) on (observation, flow
chunk) that moves the chunk to clip(a + edit_scale * e) to maximise Q under an automatically tuned entropy weight
(`utils.edit_policy`, shared with QAM-E). Acting and the target's next chunks keep the best of `best_of_n` edited
chunks by the critic.
"""

import copy
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from utils.config_rules import (
    CHUNKED_CRITIC_RULES,
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
    euler_flow,
    example_chunks,
    flow_matching_pair,
)
from utils.networks import critic_ensemble, flow_field


class FEditAgent(flax.struct.PyTreeNode):
    """BC flow plus an edit policy over action chunks, with QC's chunked critic ensemble."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    def critic_loss(self, batch, grad_params, rng):
        """TD loss of every critic toward the H-step return bootstrapped with mean - rho * std of the target ensemble
        at the edited policy's next chunk; chunks that run past an episode end are left out (`valid[..., -1]`)."""
        _, sample_rng = jax.random.split(rng)  # the reference's split
        return chunk_td_loss(self, batch, grad_params, sample_rng)

    def actor_loss(self, batch, grad_params, rng):
        """The BC flow's flow-matching loss on dataset chunks plus the edit policy's loss on its chunks."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])  # (B, D), D = H * A or A
        observations = batch['observations']
        rng, noise_rng, time_rng = jax.random.split(rng, 3)
        x_t, t, vel = flow_matching_pair(noise_rng, time_rng, actions)
        pred = self.network.select('actor_bc_flow')(observations, x_t, t, params=grad_params)
        bc_flow_loss = jnp.mean(jnp.square(pred - vel).mean(axis=-1) * batch['valid'][..., -1])

        _, noise_rng, sample_rng = jax.random.split(rng, 3)
        noises = jax.random.normal(noise_rng, actions.shape)
        flow_actions = self.compute_flow_actions(observations, noises)  # (B, D), no gradient into the flow
        loss, info = edit_loss(self, observations, flow_actions, grad_params, sample_rng)
        return bc_flow_loss + loss, {'actor_loss': bc_flow_loss + loss, 'bc_flow_loss': bc_flow_loss, **info}

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

    def compute_flow_actions(self, observations, noises):
        """The BC flow's chunks from `noises` (..., D): `flow_steps` Euler steps, clipped to [-1, 1]."""
        flow = self.network.select('actor_bc_flow')
        return euler_flow(lambda x, t: flow(observations, x, t), noises, self.config['flow_steps'])

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """Action chunks (..., H * A) (or single actions (..., A)) for one observation or a batch, in [-1, 1]: BC flow
        chunks moved by the edit policy, the critic's best of `best_of_n` per observation."""
        rng = rng if rng is not None else self.rng
        noise_rng, edit_rng = jax.random.split(rng)
        # (..., N, *obs), (..., N, D)
        obs_rep, noises = candidates(observations, self.config, self.config['best_of_n'], noise_rng)
        actions = edited_actions(self, obs_rep, self.compute_flow_actions(obs_rep, noises), edit_rng)
        actions = jnp.clip(actions, -1, 1)
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
        config['edit_target_entropy'] = edit_target_entropy(config, full_action_dim)

        critic_def = critic_ensemble(config)
        flow_def = flow_field(config, full_action_dim)
        network_info = dict(
            actor_bc_flow=(flow_def, (ex_observations, full_actions, ex_actions[..., :1])),
            critic=(critic_def, (ex_observations, full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
            **edit_networks(config, ex_observations, full_actions),
        )
        network = init_network(network_info, init_rng, adam(config['lr']), targets=('critic',))

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = ex_actions.shape[-1]
        config['full_action_dim'] = full_action_dim
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


# The paper whose baseline this is: the drivers compare a run with its protocol unless --protocol says otherwise.
PROTOCOL = 'qam'


def paper_method(config, protocol='qam'):
    """'FEdit' in the QAM paper; the QC paper has no such method."""
    return 'FEdit' if protocol == 'qam' else None


# What each key of `get_config()` may hold; the drivers check a run's config against them before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('fedit'),
    **CHUNKED_CRITIC_RULES,
    flow_steps=positive(int),
    best_of_n=positive(int),
    edit_scale=non_negative(),
    edit_target_entropy=optional(number()),
    edit_target_entropy_multiplier=number(),
)


def get_config():
    """Default FEdit hyperparameters (the authors' `agents/fedit.py`, with action chunking on as every command of
    theirs runs it); the QAM paper sets `edit_scale` per domain (`sweeps/presets.py`)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='fedit',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Adam learning rate of every network.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of the BC flow and the edit policy.
            actor_layer_norm=False,  # Layer norm in the BC flow.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of each critic.
            value_layer_norm=True,  # Layer norm in the critics.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked policy and critic; False gives n-step returns on single actions.
            num_qs=10,  # Critic ensemble size.
            rho=0.5,  # Pessimistic target: ensemble mean - rho * ensemble std.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic.
            flow_steps=10,  # Euler steps of the BC flow.
            best_of_n=1,  # Edited chunks sampled per observation (targets and acting); the critic keeps the best.
            edit_scale=0.0,  # How far an edit may move each action (0: the BC flow alone; the paper: 0.1-0.8).
            edit_target_entropy=ml_collections.config_dict.placeholder(float),  # Edit entropy target; unset: auto.
            edit_target_entropy_multiplier=0.5,  # Unset target: -multiplier * chunk dimension.
        )
    )
