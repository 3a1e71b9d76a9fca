"""Policy heads: a tanh-squashed diagonal Gaussian and a deterministic tanh output."""

import distrax
import flax.linen as nn
import jax.numpy as jnp

from rlpd_distributions.tanh_transformed import TanhTransformed
from rlpd_networks.mlp import default_init


class TanhNormal(nn.Module):
    """tanh(N(mean(s), diag(exp(log_std(s)))^2)) with both heads on a shared trunk `base_cls`.

    The log-std is clipped to [log_std_min, log_std_max] so that the scale can neither vanish nor explode.
    """

    base_cls: type[nn.Module]
    action_dim: int
    log_std_min: float = -20.0
    log_std_max: float = 2.0

    @nn.compact
    def __call__(self, inputs, *args, **kwargs):
        x = self.base_cls()(inputs, *args, **kwargs)
        means = nn.Dense(self.action_dim, kernel_init=default_init(), name='OutputDenseMean')(x)
        log_stds = nn.Dense(self.action_dim, kernel_init=default_init(), name='OutputDenseLogStd')(x)
        log_stds = jnp.clip(log_stds, self.log_std_min, self.log_std_max)
        return TanhTransformed(distrax.MultivariateNormalDiag(loc=means, scale_diag=jnp.exp(log_stds)))


class TanhDeterministic(nn.Module):
    """A deterministic action tanh(Dense(base_cls()(s))) in (-1, 1)."""

    base_cls: type[nn.Module]
    action_dim: int

    @nn.compact
    def __call__(self, inputs, *args, **kwargs):
        x = self.base_cls()(inputs, *args, **kwargs)
        return jnp.tanh(nn.Dense(self.action_dim, kernel_init=default_init(), name='OutputDenseMean')(x))
