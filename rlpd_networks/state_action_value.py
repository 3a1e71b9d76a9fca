"""A Q-function head: a trunk over concat(observation, action) followed by a scalar output."""

import flax.linen as nn
import jax.numpy as jnp

from rlpd_networks.mlp import default_init


class StateActionValue(nn.Module):
    """Q(s, a) = Dense(1)(base_cls()(concat(s, a))), squeezed to shape (...,)."""

    base_cls: type[nn.Module]

    @nn.compact
    def __call__(self, observations, actions, *args, **kwargs):
        x = jnp.concatenate([observations, actions], axis=-1)
        x = self.base_cls()(x, *args, **kwargs)
        return jnp.squeeze(nn.Dense(1, kernel_init=default_init())(x), -1)
