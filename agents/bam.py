"""BAM: basic adjoint matching over action chunks, the QAM paper's baseline (Li and Levine, 2026; the authors'
`agents/bam.py`): the fine-tuned flow of QAM trained by backpropagation through its memoryless SDE instead of by
lean adjoints.

The critic is QC's chunked ensemble with the pessimistic target mean - rho * std. `actor_slow` is a BC flow (with an
EMA target, the base); `actor_fast` runs the memoryless SDE (`utils.flows.memoryless_sde`, shared with QAM) and is
trained, through every step, on -inv_temp * (mean - rho * std of Q at the SDE's end) plus the path's KL penalty
sum_t 2 |v_fast - v_base|^2 / sigma_t^2 to the base. Acting runs the fine-tuned flow as an ODE (the BC flow at
inv_temp = 0) and keeps the critic's best of `best_of_n`.
"""

import copy
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from utils.config_rules import CHUNKED_CRITIC_RULES, boolean, non_negative, one_of, positive
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
from utils.networks import aggregate_q, critic_ensemble, flow_field


class BAMAgent(flax.struct.PyTreeNode):
    """A BC flow and a flow fine-tuned through its memoryless SDE toward exp(inv_temp Q), over action chunks."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    def critic_loss(self, batch, grad_params, rng):
        """TD loss of every critic toward the H-step return bootstrapped with mean - rho * std of the target ensemble
        at the fine-tuned flow's next chunk; chunks that run past an episode end are left out (`valid[..., -1]`)."""
        _, sample_rng = jax.random.split(rng)  # the reference's split
        return chunk_td_loss(self, batch, grad_params, sample_rng)

    def actor_loss(self, batch, grad_params, rng):
        """The BC flow's flow-matching loss plus the fine-tuned flow's BPTT loss through the memoryless SDE."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])  # (B, D), D = H * A or A
        observations = batch['observations']
        _, noise_rng, time_rng, sde_rng = jax.random.split(rng, 4)
        x_t, t, vel = flow_matching_pair(noise_rng, time_rng, actions)
        pred = self.network.select('actor_slow')(observations, x_t, t, params=grad_params)
        flow_loss = jnp.mean(jnp.square(pred - vel).mean(axis=-1) * batch['valid'][..., -1])

        fast = self.network.select('actor_fast')
        base = self.network.select('target_actor_slow' if self.config['target_actor'] else 'actor_slow')
        xs, _, penalty = memoryless_sde(
            lambda o, x, t: fast(o, x, t, params=grad_params), base, observations, sde_rng,
            self.config['full_action_dim'], self.config['flow_steps'], self.config['residual'],
        )  # fmt: skip
        q = aggregate_q(self.network.select('critic')(observations, xs[-1]), 'mean', self.config['rho']).mean()
        bc_loss = penalty.mean()
        bam_loss = -self.config['inv_temp'] * q + bc_loss
        return flow_loss + bam_loss, {'flow_loss': flow_loss, 'bam_loss': bam_loss, 'bc_loss': bc_loss}

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

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """Chunks (..., H * A) (or single actions (..., A)) of the fine-tuned flow (on its base when `residual`; the
        BC flow at inv_temp = 0), the critic's best of `best_of_n` per observation."""
        rng = rng if rng is not None else self.rng
        # (..., N, *obs), (..., N, D)
        obs_rep, noises = candidates(observations, self.config, self.config['best_of_n'], rng)
        if self.config['inv_temp'] == 0:
            flows = ('actor_slow',)
        else:
            flows = ('actor_slow', 'actor_fast') if self.config['residual'] else ('actor_fast',)
        actions = summed_flow_actions(self.network, flows, obs_rep, noises, self.config['flow_steps'])
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
        flow_inputs = (ex_observations, full_actions, ex_actions[..., :1])
        network_info = dict(
            critic=(critic_def, (ex_observations, full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
            actor_fast=(copy.deepcopy(flow_def), flow_inputs),
            actor_slow=(copy.deepcopy(flow_def), flow_inputs),
            target_actor_slow=(copy.deepcopy(flow_def), flow_inputs),
        )
        network = init_network(network_info, init_rng, adam(config['lr'], clip_norm=1.0),
                               targets=('critic', 'actor_slow'))  # fmt: skip

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = ex_actions.shape[-1]
        config['full_action_dim'] = full_actions.shape[-1]
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


# The paper whose baseline this is: the drivers compare a run with its protocol unless --protocol says otherwise.
PROTOCOL = 'qam'


def paper_method(config, protocol='qam'):
    """'BAM' in the QAM paper; the QC paper has no such method."""
    return 'BAM' if protocol == 'qam' else None


# What each key of `get_config()` may hold; the drivers check a run's config against them before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('bam'),
    **CHUNKED_CRITIC_RULES,
    flow_steps=positive(int),
    best_of_n=positive(int),
    inv_temp=non_negative(),
    target_actor=boolean(),
    residual=boolean(),
)


def get_config():
    """Default BAM hyperparameters (the authors' `agents/bam.py`, with action chunking on as every command of theirs
    runs it; gradients clipped to global norm 1, as theirs always are); the QAM paper sets `inv_temp` per domain
    (`sweeps/presets.py`)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='bam',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Adam learning rate of every network.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of both flows.
            actor_layer_norm=False,  # Layer norm in the flows.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of each critic.
            value_layer_norm=True,  # Layer norm in the critics.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked policy and critic; False gives n-step returns on single actions.
            num_qs=10,  # Critic ensemble size.
            rho=0.5,  # Pessimism: target and fine-tuning objective use the ensemble mean - rho * ensemble std.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic and the target BC flow.
            flow_steps=10,  # Euler (and SDE) steps of both flows.
            best_of_n=1,  # Chunks sampled per observation (targets and acting); the critic keeps the best.
            inv_temp=0.3,  # Inverse temperature of exp(inv_temp * Q) that the fine-tuned flow targets; 0: BC flow.
            target_actor=True,  # The SDE's base is the EMA target of the BC flow.
            residual=False,  # The fine-tuned flow is a correction added to the base flow instead of a full flow.
        )
    )
