"""The small convolutional encoder used by D4PG/DrQ-style pixel agents."""

from collections.abc import Sequence

import flax.linen as nn

from rlpd_networks.mlp import default_init


class D4PGEncoder(nn.Module):
    """Conv + ReLU layers over float images (..., h, w, c); returns the flattened feature map (..., features)."""

    features: Sequence[int] = (32, 32, 32, 32)
    filters: Sequence[int] = (2, 1, 1, 1)
    strides: Sequence[int] = (2, 1, 1, 1)
    padding: str = 'VALID'

    @nn.compact
    def __call__(self, x):
        if not len(self.features) == len(self.filters) == len(self.strides):
            raise ValueError('features, filters and strides need one entry per layer.')
        for features, filter_size, stride in zip(self.features, self.filters, self.strides):
            x = nn.Conv(
                features,
                kernel_size=(filter_size, filter_size),
                strides=(stride, stride),
                kernel_init=default_init(),
                padding=self.padding,
            )(x)
            x = nn.relu(x)
        return x.reshape((*x.shape[:-3], -1))
