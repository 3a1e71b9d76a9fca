"""IMPALA ResNet encoders for image observations (uint8 pixels, channels last)."""

import functools
from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp

from utils.networks import MLP


class ResnetStack(nn.Module):
    """A convolution, optional 3x3 max pooling with stride 2, then `num_blocks` residual blocks."""

    num_features: int
    num_blocks: int
    max_pooling: bool = True

    @nn.compact
    def __call__(self, x):
        conv = functools.partial(
            nn.Conv,
            self.num_features,
            kernel_size=(3, 3),
            strides=1,
            padding='SAME',
            kernel_init=nn.initializers.xavier_uniform(),
        )
        x = conv()(x)
        if self.max_pooling:
            x = nn.max_pool(x, window_shape=(3, 3), padding='SAME', strides=(2, 2))
        for _ in range(self.num_blocks):
            residual = x
            x = conv()(nn.relu(x))
            x = conv()(nn.relu(x))
            x = x + residual
        return x


class ImpalaEncoder(nn.Module):
    """IMPALA ResNet followed by an MLP; accepts any leading batch dimensions before (h, w, c)."""

    width: int = 1
    stack_sizes: Sequence[int] = (16, 32, 32)
    num_blocks: int = 2
    mlp_hidden_dims: Sequence[int] = (512,)
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x):
        batch_shape = x.shape[:-3]
        x = x.astype(jnp.float32) / 255.0
        x = x.reshape((-1, *x.shape[-3:]))
        for size in self.stack_sizes:
            x = ResnetStack(num_features=size * self.width, num_blocks=self.num_blocks)(x)
        x = nn.relu(x)
        if self.layer_norm:
            x = nn.LayerNorm()(x)
        x = x.reshape((*batch_shape, -1))
        return MLP(self.mlp_hidden_dims, activate_final=True, layer_norm=self.layer_norm)(x)


encoder_modules = {
    'impala': ImpalaEncoder,
    'impala_debug': functools.partial(ImpalaEncoder, num_blocks=1, stack_sizes=(4, 4)),
    'impala_small': functools.partial(ImpalaEncoder, num_blocks=1),
    'impala_large': functools.partial(ImpalaEncoder, stack_sizes=(64, 128, 128), mlp_hidden_dims=(1024,)),
}
