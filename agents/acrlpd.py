"""ACRLPD: soft actor-critic over flattened action chunks with a large critic ensemble (RLPD + Q-chunking)."""

import copy
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections

from rlpd_distributions import TanhNormal
from rlpd_networks import MLP, Ensemble, StateActionValue
from utils import networks as qam_networks
from utils.config_rules import boolean, fraction, non_negative, number, one_of, optional, positive, widths
from utils.flax_utils import adam, gradient_step, init_network, nonpytree_field, scan_updates, sum_losses
from utils.flows import chunk_actions, example_chunks
from utils.networks import Temperature, aggregate_q, temperature_loss

# Dataset chunks are pulled this far inside (-1, 1) before the BC log-prob, where atanh is finite.
BC_ACTION_CLIP = 1e-5


class ACRLPDAgent(flax.struct.PyTreeNode):
    """SAC with an ensemble of critics on chunks Q(s, a_0:H), trained on chunked n-step returns.

    With `action_chunking=False` the actor and critic act on single actions while the backup stays H steps long
    (the n-step return baseline).
    """

    rng: Any
    network: Any
    config: Any = nonpytree_field()

    # Keys of the reference's config that nothing reads (there either; the temperature is learned from
    # `init_temp`, the actor has no layer norm): accepted so reference command lines run; a driver warns when one
    # is set.
    INERT_CONFIG_KEYS = ('alpha', 'actor_layer_norm')

    def critic_loss(self, batch, grad_params, rng):
        """Squared TD error of every critic toward the H-step backup, weighted by the chunk's validity."""
        next_obs = batch['next_observations'][..., -1, :]  # (B, obs): the state after the chunk
        next_actions = self.network.select('actor')(next_obs).sample(seed=rng)  # (B, H*A)
        next_qs = self.network.select('target_critic')(next_obs, next_actions)  # (num_qs, B)
        next_q = aggregate_q(next_qs, self.config['q_agg'], self.config['rho'])  # (B,)
        # rewards[..., -1] already holds the discounted sum of the H rewards; masks[..., -1] is 0 after a termination.
        discount = self.config['discount'] ** self.config['horizon_length']
        target_q = batch['rewards'][..., -1] + discount * batch['masks'][..., -1] * next_q  # (B,)

        actions = chunk_actions(batch['actions'], self.config['action_chunking'])
        q = self.network.select('critic')(batch['observations'], actions, params=grad_params)  # (num_qs, B)
        loss = (jnp.square(q - target_q) * batch['valid'][..., -1]).mean()
        return loss, {
            'critic_loss': loss,
            'q_mean': q.mean(),
            'q_max': q.max(),
            'q_min': q.min(),
            'target_q_mean': target_q.mean(),
        }

    def actor_loss(self, batch, grad_params, rng):
        """E[alpha * log pi(a|s) - (mean_i - rho * std_i) Q_i(s, a)] plus bc_alpha times the NLL of the dataset
        chunk."""
        dist = self.network.select('actor')(batch['observations'], params=grad_params)
        actions, log_probs = dist.sample_and_log_prob(seed=rng)  # (B, H*A), (B,)
        qs = self.network.select('critic')(batch['observations'], actions)  # (num_qs, B)
        q = aggregate_q(qs, 'mean', self.config['rho'])  # (B,)
        alpha = self.network.select('temp')()
        actor_loss = (alpha * log_probs - q).mean()

        dataset_actions = chunk_actions(batch['actions'], self.config['action_chunking'])
        dataset_actions = jnp.clip(dataset_actions, -1 + BC_ACTION_CLIP, 1 - BC_ACTION_CLIP)
        log_likelihood = dist.log_prob(dataset_actions)  # (B,)
        if self.config['bc_mask'] == 'chunk':
            log_likelihood = log_likelihood * batch['valid'][..., -1]  # The QAM paper's RLPD: no chunk past an end.
        bc_nll = -log_likelihood.mean()
        bc_loss = self.config['bc_alpha'] * bc_nll

        loss = actor_loss + bc_loss
        return loss, {
            'actor_loss': actor_loss,
            'bc_loss': bc_loss,
            'bc_nll': bc_nll,
            'entropy': -log_probs.mean(),
            'q': q.mean(),
        }

    def temperature_loss(self, batch, grad_params, rng):
        """alpha * (H[pi] - target_entropy): raises alpha while the policy entropy is below the target. Called with
        the actor loss's key, it sees the actor loss's sample, without its gradient (the reference reuses it)."""
        _, log_probs = self.network.select('actor')(batch['observations']).sample_and_log_prob(seed=rng)  # (B,)
        alpha = self.network.select('temp')(params=grad_params)
        loss, entropy = temperature_loss(alpha, log_probs, self.config['target_entropy'])
        return loss, {'alpha_loss': loss, 'alpha': alpha, 'entropy': entropy}

    def total_loss(self, batch, grad_params, rng):
        """Sum of the critic, actor and temperature losses; info keys are prefixed by component."""
        critic_rng, actor_rng = jax.random.split(rng)
        return sum_losses(
            critic=self.critic_loss(batch, grad_params, critic_rng),
            actor=self.actor_loss(batch, grad_params, actor_rng),
            alpha=self.temperature_loss(batch, grad_params, actor_rng),  # the actor's sample (same key, no gradient)
        )

    def _update(self, batch):
        return gradient_step(self, batch, targets=('critic',))

    @jax.jit
    def update(self, batch):
        """One gradient step on all losses, then a Polyak step of the target critic. Returns (agent, info)."""
        return self._update(batch)

    @jax.jit
    def batch_update(self, batch):
        """`update` over the leading UTD axis of `batch` (leaves (U, B, ...)); returns the last update's info."""
        return scan_updates(lambda agent, b: agent._update(b), self, batch)

    @jax.jit
    def sample_actions(self, observations, rng=None):
        """Samples from the actor for (obs_dim,) or (B, obs_dim) observations; (..., H*A) or (..., A) in [-1, 1]."""
        rng = self.rng if rng is None else rng
        actions = self.network.select('actor')(observations).sample(seed=rng)
        return jnp.clip(actions, -1, 1)

    @classmethod
    def create(cls, seed, ex_observations, ex_actions, config):
        """Builds the agent.

        Args:
            seed: Random seed.
            ex_observations: One example observation, (obs_dim,), or a batch of them, (B, obs_dim).
            ex_actions: One example single-step action, (A,), or a batch, (B, A), matching `ex_observations`.
            config: The `get_config()` dict with `horizon_length` set.
        """
        config = ml_collections.ConfigDict(config).to_dict()
        if config['q_agg'] not in ('mean', 'min'):
            raise ValueError(f"q_agg must be 'mean' or 'min', got {config['q_agg']!r}")
        if config['network_style'] == 'qam' and config['num_qs'] < 2:
            raise ValueError("network_style='qam' needs num_qs >= 2 (its critic has no ensemble axis with one)")

        rng = jax.random.PRNGKey(seed)
        rng, init_rng = jax.random.split(rng)

        ex_observations, ex_actions, ex_full_actions = example_chunks(config, ex_observations, ex_actions)
        action_dim = ex_actions.shape[-1]
        full_action_dim = ex_full_actions.shape[-1]  # H * A, or A without chunking
        if config['target_entropy'] is None:
            config['target_entropy'] = -config['target_entropy_multiplier'] * full_action_dim

        if config['network_style'] == 'qam':  # The QAM reference's networks: GELU, layer norm after it.
            critic_def = qam_networks.Value(
                hidden_dims=tuple(config['value_hidden_dims']), layer_norm=config['layer_norm'],
                num_ensembles=config['num_qs'],
            )  # fmt: skip
            actor_trunk = qam_networks.MLP
        else:  # The QC reference's (RLPD's) networks: ReLU, layer norm before it.
            critic_base_cls = functools.partial(
                MLP, hidden_dims=config['value_hidden_dims'], activate_final=True, use_layer_norm=config['layer_norm']
            )
            critic_def = Ensemble(functools.partial(StateActionValue, base_cls=critic_base_cls), num=config['num_qs'])
            actor_trunk = MLP
        actor_base_cls = functools.partial(
            actor_trunk, hidden_dims=tuple(config['actor_hidden_dims']), activate_final=True
        )
        actor_def = TanhNormal(actor_base_cls, full_action_dim)
        network_info = dict(
            critic=(critic_def, (ex_observations, ex_full_actions)),
            target_critic=(copy.deepcopy(critic_def), (ex_observations, ex_full_actions)),
            actor=(actor_def, (ex_observations,)),
            temp=(Temperature(config['init_temp']), ()),
        )
        network = init_network(network_info, init_rng, adam(config['lr']), targets=('critic',))

        config['action_dim'] = action_dim
        config['ob_dims'] = tuple(ex_observations.shape[1:])
        return cls(rng, network=network, config=ml_collections.FrozenConfigDict(config))


def paper_method(config, protocol='qc'):
    """The name of this config's method in the QC paper: RLPD with one-step returns, QC-RLPD with the BC term,
    RLPD-AC without it; in the QAM paper (`protocol='qam'`) all of them are its RLPD (chunked, BC weight per
    domain)."""
    if protocol == 'qam':
        return 'RLPD'
    if (config.get('horizon_length') or 1) == 1:
        return 'RLPD'
    return 'QC-RLPD' if config.get('bc_alpha') else 'RLPD-AC'


# What each key of `get_config()` may hold; the drivers check a run's config against it before loading anything.
CONFIG_RULES = dict(
    agent_name=one_of('acrlpd'),
    lr=positive(float),
    batch_size=positive(int),
    actor_hidden_dims=widths(),
    value_hidden_dims=widths(),
    layer_norm=boolean(),
    discount=fraction(),
    tau=fraction(),
    num_qs=positive(int),
    target_entropy=optional(number()),
    target_entropy_multiplier=number(),
    bc_alpha=non_negative(),
    q_agg=one_of('mean', 'min'),
    rho=non_negative(),
    bc_mask=one_of('none', 'chunk'),
    network_style=one_of('qc', 'qam'),
    horizon_length=optional(positive(int)),
    action_chunking=boolean(),
    init_temp=positive(float),
    alpha=optional(number()),
    actor_layer_norm=optional(boolean()),
)


def get_config():
    """Default ACRLPD hyperparameters (Q-chunking paper, RLPD-style SAC)."""
    return ml_collections.ConfigDict(
        dict(
            agent_name='acrlpd',  # Key of this agent in agents.agents.
            lr=3e-4,  # Adam learning rate, shared by critic, actor and temperature.
            batch_size=256,  # Transitions (chunks) per gradient step.
            actor_hidden_dims=(512, 512, 512, 512),  # Actor MLP widths (no layer norm, as in the reference).
            value_hidden_dims=(512, 512, 512, 512),  # Critic MLP widths.
            layer_norm=True,  # Layer norm in the critic MLPs.
            discount=0.99,  # Per-step discount; the chunk backup uses discount ** horizon_length.
            tau=0.005,  # Polyak rate of the target critic.
            num_qs=10,  # Critics in the ensemble; all of them enter the target and the actor loss.
            target_entropy=ml_collections.config_dict.placeholder(float),  # None: -multiplier * full action dim.
            target_entropy_multiplier=0.5,  # Target entropy per action dimension (negated) when target_entropy=None.
            bc_alpha=0.0,  # Weight of the dataset-chunk negative log-likelihood in the actor loss.
            q_agg='mean',  # How target critics are combined in the backup: 'mean' or 'min'.
            rho=0.0,  # Pessimism: target and actor use the aggregate minus rho * ensemble std (QAM paper: 0.5).
            bc_mask='none',  # BC on every chunk ('none', QC) or only on chunks inside one episode ('chunk', QAM).
            network_style='qc',  # Whose MLPs: 'qc' (ReLU, layer norm before it) or 'qam' (GELU, layer norm after it).
            horizon_length=ml_collections.config_dict.placeholder(int),  # Chunk length H; set by the launcher.
            action_chunking=True,  # Act with chunks of H actions; False: single actions with an H-step backup.
            init_temp=1.0,  # Initial temperature alpha.
            alpha=ml_collections.config_dict.placeholder(float),  # No effect (INERT_CONFIG_KEYS).
            actor_layer_norm=ml_collections.config_dict.placeholder(bool),  # No effect (INERT_CONFIG_KEYS).
        )
    )
