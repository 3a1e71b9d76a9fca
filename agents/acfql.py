"""Flow Q-learning with action chunking (ACFQL): QC (best-of-n), QC-FQL (distill-ddpg) and their baselines.

With `action_chunking=True` the actor outputs a chunk of H = `horizon_length` actions as one flat (H * A) vector and
the critic scores Q(s, a_0:H); the target is the H-step return plus discount^H times the target Q of the next chunk.
With `action_chunking=False` the actor and critic see only the first action and the same H-step target gives the
n-step baselines (BFN-n, FQL-n); `horizon_length=1` gives plain BFN / FQL.
"""

import copy
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from utils.config_rules import boolean, fraction, non_negative, one_of, optional, positive, widths
from utils.encoders import encoder_modules
from utils.flax_utils import adam, gradient_step, init_network, nonpytree_field, scan_updates, sum_losses
from utils.flows import best_of_n, chunk_actions, chunk_td_loss, euler_flow, example_chunks, flow_matching_pair
from utils.networks import ActorVectorField, Value, aggregate_q

ACTOR_TYPES = ('distill-ddpg', 'best-of-n')
Q_AGGS = ('mean', 'min')
BC_MASKS = ('step', 'chunk')


class ACFQLAgent(flax.struct.PyTreeNode):
    """Flow Q-learning agent over action chunks."""

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    # Keys of the reference's config that no loss reads (there either): accepted so reference command lines run; a
    # driver warns when one is set.
    INERT_CONFIG_KEYS = ('normalize_q_loss',)

    def critic_loss(self, batch, grad_params, rng):
        """TD loss of Q(s, a_0:H) toward the H-step return bootstrapped with the target critic."""
        return chunk_td_loss(self, batch, grad_params, rng, self.config['q_agg'])

    def actor_loss(self, batch, grad_params, rng):
        """Flow-matching BC loss on dataset chunks; for distill-ddpg also the one-step distillation and Q losses."""
        actions = chunk_actions(batch['actions'], self.config['action_chunking'])  # (B, H * A) or (B, A)
        noise_rng, time_rng, distill_rng = jax.random.split(rng, 3)

        x_t, t, vel = flow_matching_pair(noise_rng, time_rng, actions)
        pred = self.network.select('actor_bc_flow')(batch['observations'], x_t, t, params=grad_params)
        if self.config['bc_mask'] == 'chunk':
            # The QAM paper's FQL: a chunk that runs past an episode end is left out whole (single actions too).
            bc_flow_loss = jnp.mean(jnp.square(pred - vel).mean(axis=-1) * batch['valid'][..., -1])
        elif self.config['action_chunking']:
            # Steps after an episode end are not real actions of this episode: mask them out.
            sq_err = jnp.reshape(jnp.square(pred - vel), batch['actions'].shape)  # (B, H, A)
            bc_flow_loss = jnp.mean(sq_err * batch['valid'][..., None])
        else:
            bc_flow_loss = jnp.mean(jnp.square(pred - vel))  # a first action is always the episode's own

        info = {'bc_flow_loss': bc_flow_loss}
        if self.config['actor_type'] == 'distill-ddpg':
            noises = jax.random.normal(distill_rng, actions.shape)
            target_flow_actions = jax.lax.stop_gradient(self.compute_flow_actions(batch['observations'], noises))
            actor_actions = self.network.select('actor_onestep_flow')(batch['observations'], noises, params=grad_params)
            distill_loss = jnp.mean(jnp.square(actor_actions - target_flow_actions))

            actor_actions = jnp.clip(actor_actions, -1, 1)
            q = self.network.select('critic')(batch['observations'], actor_actions).mean(axis=0)
            q_loss = -q.mean()
            actor_loss = bc_flow_loss + self.config['alpha'] * distill_loss + q_loss
            info.update(
                distill_loss=distill_loss,
                q_loss=q_loss,
                q=q.mean(),
                mse=jnp.mean(jnp.square(actor_actions - actions)),
            )
        else:
            # best-of-n acts through the critic at sampling time; only the BC flow is trained.
            actor_loss = bc_flow_loss
        info['actor_loss'] = actor_loss
        return actor_loss, info

    def total_loss(self, batch, grad_params, rng=None):
        """Critic loss plus actor loss, with `critic/` and `actor/` prefixed infos."""
        rng = rng if rng is not None else self.rng
        critic_rng, actor_rng = jax.random.split(rng)
        return sum_losses(
            critic=self.critic_loss(batch, grad_params, critic_rng),
            actor=self.actor_loss(batch, grad_params, actor_rng),
        )

    def _update(self, batch):
        return gradient_step(self, batch, targets=('critic',))

    @jax.jit
    def update(self, batch):
        """One gradient step on a batch from `sample_sequence`, then a soft target update. Returns (agent, info)."""
        return self._update(batch)

    @jax.jit
    def batch_update(self, batch):
        """`U` sequential updates fused in one `lax.scan`; every leaf of `batch` has a leading (U,) axis.

        Equivalent to U calls of `update`; the returned info is the last update's.
        """
        return scan_updates(lambda agent, b: agent._update(b), self, batch)

    def compute_flow_actions(self, observations, noises):
        """Integrates the BC flow from `noises` with `flow_steps` Euler steps; the result is clipped to [-1, 1]."""
        flow = self.network.select('actor_bc_flow')
        features = self.network.select('actor_bc_flow', method_name='encode')(observations)
        return euler_flow(lambda x, t: flow(features, x, t, is_encoded=True), noises, self.config['flow_steps'])

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """Action chunks (..., H * A) (or single actions (..., A)) for one observation or a batch, in [-1, 1].

        distill-ddpg runs the one-step policy once; best-of-n integrates `actor_num_samples` flow samples per
        observation and keeps the one the critic ranks highest.
        """
        rng = rng if rng is not None else self.rng
        ob_ndim = len(self.config['ob_dims'])
        batch_shape = observations.shape[: observations.ndim - ob_ndim]
        action_dim = self.config['full_action_dim']
        if self.config['actor_type'] == 'distill-ddpg':
            noises = jax.random.normal(rng, (*batch_shape, action_dim))
            actions = self.network.select('actor_onestep_flow')(observations, noises)
            return jnp.clip(actions, -1, 1)

        num_samples = self.config['actor_num_samples']
        noises = jax.random.normal(rng, (*batch_shape, num_samples, action_dim))
        obs_rep = jnp.repeat(jnp.expand_dims(observations, len(batch_shape)), num_samples, axis=len(batch_shape))
        candidates = self.compute_flow_actions(obs_rep, noises)  # (..., N, H * A)
        q = aggregate_q(self.network.select('critic')(obs_rep, candidates), self.config['q_agg'])  # (..., N)
        return best_of_n(candidates, q)

    @classmethod
    def create(cls, seed, ex_observations, ex_actions, config):
        """Builds the agent.

        Args:
            seed: Seed of the agent's JAX key (initialization and sampling).
            ex_observations: One example observation, obs_shape, or a batch of them, (B, *obs_shape).
            ex_actions: One example single-step action, (A,), or a batch, (B, A), matching `ex_observations`.
            config: The agent's config (see `get_config`), with `horizon_length` set.
        """
        config = dict(config)
        if config['actor_type'] not in ACTOR_TYPES:
            raise ValueError(f'Unknown actor_type {config["actor_type"]!r}; choose one of {", ".join(ACTOR_TYPES)}')
        if config['q_agg'] not in Q_AGGS:
            raise ValueError(f'Unknown q_agg {config["q_agg"]!r}; choose one of {", ".join(Q_AGGS)}')

        rng = jax.random.PRNGKey(seed)
        rng, init_rng = jax.random.split(rng)
        ex_observations, ex_actions, full_actions = example_chunks(config, ex_observations, ex_actions)
        action_dim = ex_actions.shape[-1]
        full_action_dim = full_actions.shape[-1]  # H * A, or A without chunking
        ex_times = ex_actions[..., :1]

        encoders = {}
        if config['encoder'] is not None:
            encoder_module = encoder_modules[config['encoder']]
            encoders = {name: encoder_module() for name in ('critic', 'actor_bc_flow', 'actor_onestep_flow')}

        critic_def = Value(
            hidden_dims=tuple(config['value_hidden_dims']),
            layer_norm=config['layer_norm'],
            num_ensembles=config['num_qs'],
            encoder=encoders.get('critic'),
        )

        def actor_def(name):
            return ActorVectorField(
                hidden_dims=tuple(config['actor_hidden_dims']),
                action_dim=full_action_dim,
                layer_norm=config['actor_layer_norm'],
                encoder=encoders.get(name),
                use_fourier_features=config['use_fourier_features'],
                fourier_feature_dim=config['fourier_feature_dim'],
                learnable_fourier_features=config['learnable_fourier_features'],
            )

        network_info = dict(
            critic=(critic_def, (ex_observations, full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, full_actions)),
            actor_bc_flow=(actor_def('actor_bc_flow'), (ex_observations, full_actions, ex_times)),
            actor_onestep_flow=(actor_def('actor_onestep_flow'), (ex_observations, full_actions)),
        )
        network = init_network(network_info, init_rng, adam(config['lr'], config['weight_decay']), targets=('critic',))

        config['ob_dims'] = tuple(ex_observations.shape[1:])
        config['action_dim'] = action_dim
        config['full_action_dim'] = full_action_dim
        return cls(rng, network=network, config=flax.core.FrozenDict(**config))


def paper_method(config, protocol='qc'):
    """The name of this config's method in the QC paper: QC or QC-FQL chunked, BFN-n or FQL-n on single actions,
    BFN or FQL with one-step returns; in the QAM paper (`protocol='qam'`): FQL for the distillation actor (their
    chunked FQL), none for best-of-N."""
    if protocol == 'qam':
        return 'FQL' if config['actor_type'] == 'distill-ddpg' else None
    chunked, single = {'best-of-n': ('QC', 'BFN'), 'distill-ddpg': ('QC-FQL', 'FQL')}[config['actor_type']]
    if (config.get('horizon_length') or 1) == 1:
        return single
    return chunked if config.get('action_chunking', True) else f'{single}-n'


# What each key of `get_config()` may hold; the drivers check a run's config against it before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('acfql'),
    lr=positive(float),
    batch_size=positive(int),
    actor_hidden_dims=widths(),
    value_hidden_dims=widths(),
    layer_norm=boolean(),
    actor_layer_norm=boolean(),
    discount=fraction(),
    tau=fraction(),
    q_agg=one_of(*Q_AGGS),
    rho=non_negative(),
    bc_mask=one_of(*BC_MASKS),
    alpha=non_negative(),
    num_qs=positive(int),
    flow_steps=positive(int),
    encoder=optional(one_of(*encoder_modules)),
    horizon_length=optional(positive(int)),
    action_chunking=boolean(),
    actor_type=one_of(*ACTOR_TYPES),
    actor_num_samples=positive(int),
    use_fourier_features=boolean(),
    fourier_feature_dim=positive(int),
    learnable_fourier_features=boolean(),
    weight_decay=non_negative(),
    normalize_q_loss=optional(boolean()),
)


def get_config():
    """Default ACFQL hyperparameters (the paper's QC-FQL setting; `--agent.actor_type=best-of-n` gives QC)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='acfql',  # Key of the agent class in `agents.agents`.
            lr=3e-4,  # Learning rate of every network.
            batch_size=256,  # Chunks per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of both flow actors.
            value_hidden_dims=(512, 512, 512, 512),  # Hidden sizes of each critic.
            layer_norm=True,  # Layer norm in the critics.
            actor_layer_norm=False,  # Layer norm in the actors.
            discount=0.99,  # Per-step discount; the chunk target uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic.
            q_agg='mean',  # How the critic ensemble is aggregated in targets and best-of-n ranking: 'mean' or 'min'.
            rho=0.0,  # Target = aggregate - rho * ensemble std (QAM paper's FQL: 0.5 with num_qs=10); 0 is QC's.
            bc_mask='step',  # BC loss past an episode end: 'step' drops those steps (QC), 'chunk' the chunk (QAM).
            alpha=100.0,  # Weight of the one-step distillation loss (distill-ddpg).
            num_qs=2,  # Critic ensemble size.
            flow_steps=10,  # Euler steps of the BC flow.
            encoder=ml_collections.config_dict.placeholder(str),  # Image encoder name from `encoder_modules`, or None.
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the driver's flag.
            action_chunking=True,  # Chunked actor/critic (QC); False gives n-step returns on single actions.
            actor_type='distill-ddpg',  # 'distill-ddpg' (one-step policy, QC-FQL) or 'best-of-n' (QC).
            actor_num_samples=32,  # Flow samples ranked by the critic in best-of-n.
            use_fourier_features=False,  # Fourier features of the flow time instead of the raw scalar.
            fourier_feature_dim=64,  # Size of those Fourier features.
            learnable_fourier_features=False,  # Trained random-projection frequencies instead of fixed sinusoids.
            weight_decay=0.0,  # AdamW weight decay when > 0, else Adam.
            normalize_q_loss=ml_collections.config_dict.placeholder(bool),  # No effect (INERT_CONFIG_KEYS).
        )
    )
