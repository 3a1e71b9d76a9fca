"""Encodes pixel observations into a small latent before a state-based network (actor or critic)."""

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from rlpd_networks.mlp import default_init


def _bottleneck(x, latent_dim):
    # Dense -> LayerNorm -> tanh keeps the latent bounded whatever the encoder's scale.
    x = nn.Dense(latent_dim, kernel_init=default_init())(x)
    return nn.tanh(nn.LayerNorm()(x))


class PixelMultiplexer(nn.Module):
    """Runs one encoder per pixel key (uint8 images (..., h, w, c), scaled to [0, 1]) and feeds the joined latents
    (plus an embedded `state` entry when present) to `network_cls`, with `actions` too when given (critics).

    Observations are either a mapping holding `pixel_keys` (and optionally 'state') or a single image array.

    Attributes:
        encoder_cls: Encoder constructor, e.g. D4PGEncoder.
        network_cls: Network on the latent, e.g. a TanhNormal actor or a StateActionValue critic.
        latent_dim: Width of each bottleneck.
        stop_gradient: Block this network's gradients from the encoders (e.g. an actor sharing a critic's features).
        pixel_keys: Image entries of a mapping observation.
    """

    encoder_cls: type[nn.Module]
    network_cls: type[nn.Module]
    latent_dim: int
    stop_gradient: bool = False
    pixel_keys: tuple[str, ...] = ('pixels',)

    @nn.compact
    def __call__(self, observations, actions=None, training=False):
        if not isinstance(observations, Mapping):
            observations = {self.pixel_keys[0]: observations}
        latents = []
        for i, key in enumerate(self.pixel_keys):
            x = observations[key].astype(jnp.float32) / 255.0
            x = self.encoder_cls(name=f'encoder_{i}')(x)
            if self.stop_gradient:
                x = jax.lax.stop_gradient(x)
            latents.append(_bottleneck(x, self.latent_dim))
        if 'state' in observations:
            latents.append(_bottleneck(observations['state'], self.latent_dim))
        x = jnp.concatenate(latents, axis=-1)
        if actions is None:
            return self.network_cls()(x, training=training)
        return self.network_cls()(x, actions, training=training)
