"""Networks of the flow agents: MLPs, critic ensembles and the flow velocity field."""

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp


def default_init(scale=1.0):
    """Variance-scaling (fan-avg, uniform) initializer used by every dense layer."""
    return nn.initializers.variance_scaling(scale, 'fan_avg', 'uniform')


def ensemblize(cls, num_qs, in_axes=None, out_axes=0, **kwargs):
    """Turns a module class into an ensemble of `num_qs` independent copies (vmapped params, shared inputs)."""
    return nn.vmap(
        cls,
        variable_axes={'params': 0},
        split_rngs={'params': True},
        in_axes=in_axes,
        out_axes=out_axes,
        axis_size=num_qs,
        **kwargs,
    )


class MLP(nn.Module):
    """Dense layers with GELU; layer norm after each hidden activation when `layer_norm`."""

    hidden_dims: Sequence[int]
    activations: Any = nn.gelu
    activate_final: bool = False
    kernel_init: Any = default_init()
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x):
        for i, size in enumerate(self.hidden_dims):
            x = nn.Dense(size, kernel_init=self.kernel_init)(x)
            if i + 1 < len(self.hidden_dims) or self.activate_final:
                x = self.activations(x)
                if self.layer_norm:
                    x = nn.LayerNorm()(x)
        return x


class FourierFeatures(nn.Module):
    """Maps a scalar time to `output_size` cos/sin features: fixed log-spaced frequencies (the reference's), or a
    trained random projection when `learnable`."""

    output_size: int = 64
    learnable: bool = False

    @nn.compact
    def __call__(self, x):
        half = self.output_size // 2
        if self.learnable:
            w = self.param('kernel', nn.initializers.normal(0.2), (half, x.shape[-1]), jnp.float32)
            f = 2 * jnp.pi * x @ w.T
        else:
            scale = jnp.log(10000.0) / (half - 1)
            f = x * jnp.exp(jnp.arange(half) * -scale)
        return jnp.concatenate([jnp.cos(f), jnp.sin(f)], axis=-1)


class Value(nn.Module):
    """Critic ensemble: `num_ensembles` MLPs on concat(encoded observations, actions[, times]), output
    (num_ensembles, ...)."""

    hidden_dims: Sequence[int]
    layer_norm: bool = True
    num_ensembles: int = 2
    encoder: nn.Module | None = None

    def setup(self):
        mlp_class = MLP
        if self.num_ensembles > 1:
            mlp_class = ensemblize(mlp_class, self.num_ensembles)
        self.value_net = mlp_class((*self.hidden_dims, 1), activate_final=False, layer_norm=self.layer_norm)

    def __call__(self, observations, actions=None, times=None):
        inputs = [self.encoder(observations) if self.encoder is not None else observations]
        if actions is not None:
            inputs.append(actions)
        if times is not None:  # a time-conditioned critic Q(s, a_t, t) (CGQL)
            inputs.append(times)
        return self.value_net(jnp.concatenate(inputs, axis=-1)).squeeze(-1)


class ActorVectorField(nn.Module):
    """Flow velocity field v(s, x_t, t); without `times` it is the one-step policy mu(s, z)."""

    hidden_dims: Sequence[int]
    action_dim: int
    layer_norm: bool = False
    encoder: nn.Module | None = None
    use_fourier_features: bool = False
    fourier_feature_dim: int = 64
    learnable_fourier_features: bool = False

    def setup(self):
        self.mlp = MLP((*self.hidden_dims, self.action_dim), activate_final=False, layer_norm=self.layer_norm)
        if self.use_fourier_features:
            self.ff = FourierFeatures(self.fourier_feature_dim, learnable=self.learnable_fourier_features)

    def encode(self, observations):
        """Observation features (the observations themselves without an encoder), to reuse across flow steps."""
        return self.encoder(observations) if self.encoder is not None else observations

    def __call__(self, observations, actions, times=None, is_encoded=False):
        if self.encoder is not None and not is_encoded:
            observations = self.encoder(observations)
        inputs = [observations, actions]
        if times is not None:
            inputs.append(self.ff(times) if self.use_fourier_features else times)
        return self.mlp(jnp.concatenate(inputs, axis=-1))


class DeterministicActor(nn.Module):
    """a(s) = tanh(Dense(MLP(s))), the last layer initialised at `final_fc_init_scale` (the reference's `Actor` with
    a constant std, whose mode is all its agents read)."""

    hidden_dims: Sequence[int]
    action_dim: int
    layer_norm: bool = False
    final_fc_init_scale: float = 1e-2

    def setup(self):
        self.actor_net = MLP(self.hidden_dims, activate_final=True, layer_norm=self.layer_norm)
        self.mean_net = nn.Dense(self.action_dim, kernel_init=default_init(self.final_fc_init_scale))

    def __call__(self, observations):
        return jnp.tanh(self.mean_net(self.actor_net(observations)))


def critic_ensemble(config):
    """The chunked critic ensemble of a config: `num_qs` critics of widths `value_hidden_dims`, layer norm by
    `value_layer_norm`."""
    return Value(
        hidden_dims=tuple(config['value_hidden_dims']), layer_norm=config['value_layer_norm'],
        num_ensembles=config['num_qs'],
    )  # fmt: skip


def flow_field(config, action_dim):
    """A flow velocity field (or one-step policy) over `action_dim` of a config's `actor_hidden_dims` and
    `actor_layer_norm`."""
    return ActorVectorField(
        hidden_dims=tuple(config['actor_hidden_dims']), action_dim=action_dim, layer_norm=config['actor_layer_norm']
    )


def aggregate_q(qs, q_agg, rho=0.0):
    """Aggregates a critic ensemble's outputs (num_qs, ...) by 'mean' or 'min' over the ensemble axis, minus `rho`
    times the ensemble's standard deviation (the QAM paper's pessimistic target `mean - rho * std`; 0 leaves the
    aggregate as it is)."""
    q = qs.min(axis=0) if q_agg == 'min' else qs.mean(axis=0)
    return q - rho * qs.std(axis=0) if rho else q


class Temperature(nn.Module):
    """A positive scalar exp(log_temp), learned in log space (the SAC temperature; QAM-E's edit-policy entropy
    weight)."""

    init_temp: float = 1.0

    @nn.compact
    def __call__(self):
        log_temp = self.param('log_temp', lambda _: jnp.full((), jnp.log(self.init_temp), dtype=jnp.float32))
        return jnp.exp(log_temp)


def temperature_loss(alpha, log_probs, target_entropy):
    """SAC's entropy-weight loss alpha * (H - target), H = -mean log pi(a|s) taken without a gradient into the
    policy: it raises alpha while the entropy is below its target. Returns (loss, H)."""
    entropy = -jax.lax.stop_gradient(log_probs).mean()
    return alpha * (entropy - target_entropy), entropy


def batched_examples(ex_observations, ex_actions):
    """Example observations and actions for `create`, with exactly one leading batch axis.

    Accepts one example (observation `obs_shape`, action `(A,)`) or a batch (`(B, *obs_shape)`, `(B, A)`). The
    action is always a flat vector, so its rank tells whether the examples carry a batch axis.
    """
    ex_observations = jnp.asarray(ex_observations)
    ex_actions = jnp.asarray(ex_actions)
    batch_rank = ex_actions.ndim - 1
    if batch_rank not in (0, 1):
        raise ValueError(f'ex_actions must be (action_dim,) or (batch, action_dim), got shape {ex_actions.shape}')
    if batch_rank == 0:
        return ex_observations[None], ex_actions[None]
    if ex_observations.ndim < 1 or ex_observations.shape[0] != ex_actions.shape[0]:
        raise ValueError(
            f'ex_observations {ex_observations.shape} and ex_actions {ex_actions.shape} need the same batch size'
        )
    return ex_observations, ex_actions
