"""Fully connected trunks: a plain MLP and a pre-activation residual MLP."""

from collections.abc import Callable, Sequence

import flax.linen as nn


def default_init(scale=1.0):
    """Glorot-uniform kernel initializer (fan-average variance scaling), optionally rescaled."""
    return nn.initializers.variance_scaling(scale, 'fan_avg', 'uniform')


class MLP(nn.Module):
    """Dense layers with ReLU; each activated layer is Dense -> [dropout] -> [layer norm] -> activation.

    Attributes:
        hidden_dims: Width of every layer.
        activations: Nonlinearity.
        activate_final: Also apply dropout/norm/activation after the last layer.
        use_layer_norm: Layer norm before each activation.
        dropout_rate: Dropout before the norm when `training=True` (None or 0: no dropout; needs a 'dropout' rng).
    """

    hidden_dims: Sequence[int]
    activations: Callable = nn.relu
    activate_final: bool = False
    use_layer_norm: bool = False
    dropout_rate: float | None = None

    @nn.compact
    def __call__(self, x, training=False):
        for i, size in enumerate(self.hidden_dims):
            x = nn.Dense(size, kernel_init=default_init())(x)
            if i + 1 < len(self.hidden_dims) or self.activate_final:
                if self.dropout_rate is not None and self.dropout_rate > 0:
                    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=not training)
                if self.use_layer_norm:
                    x = nn.LayerNorm()(x)
                x = self.activations(x)
        return x


class MLPResNetBlock(nn.Module):
    """Pre-activation residual block: x + Dense(act(LN(Dense(act(LN(x)))))), projecting x if widths differ."""

    features: int
    activations: Callable = nn.relu

    @nn.compact
    def __call__(self, x):
        y = nn.Dense(self.features)(self.activations(nn.LayerNorm()(x)))
        y = nn.Dense(self.features)(self.activations(nn.LayerNorm()(y)))
        residual = x if x.shape[-1] == self.features else nn.Dense(self.features)(x)
        return residual + y


class MLPResNet(nn.Module):
    """An input projection, `num_blocks` residual blocks, then a final layer norm and activation."""

    num_blocks: int
    features: int = 256
    activations: Callable = nn.relu

    @nn.compact
    def __call__(self, x, training=False):
        x = nn.Dense(self.features)(x)
        for _ in range(self.num_blocks):
            x = MLPResNetBlock(self.features, activations=self.activations)(x)
        return self.activations(nn.LayerNorm()(x))
