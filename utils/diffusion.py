"""DDPM pieces of the diffusion agents (QSM and DAC, `agents/dcgql.py`): the noise schedules, the noise-prediction
network eps(s, x_t, t) and the reverse sampler."""

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from utils.networks import MLP, FourierFeatures


def mish(x):
    """x tanh(softplus(x)), the activation of the noise network."""
    return x * jnp.tanh(nn.softplus(x))


def beta_schedule(name, steps):
    """The betas of a `steps`-step schedule ('vp', 'cosine' or 'linear') with a 0 in front, so that index t = 1..T
    is step t: shape (T + 1,)."""
    if name == 'vp':  # variance preserving, beta in [0.1, 10] over unit time
        t = jnp.arange(1, steps + 1)
        betas = 1 - jnp.exp(-0.1 / steps - 0.5 * (10.0 - 0.1) * (2 * t - 1) / steps**2)
    elif name == 'cosine':  # Nichol and Dhariwal 2021, s = 0.008
        t = jnp.linspace(0, steps, steps + 1) / steps
        alpha_bars = jnp.cos((t + 0.008) / 1.008 * jnp.pi * 0.5) ** 2
        betas = jnp.clip(1 - alpha_bars[1:] / alpha_bars[:-1], 0, 0.999)
    elif name == 'linear':
        betas = jnp.linspace(1e-4, 2e-2, steps)
    else:
        raise ValueError(f"beta_schedule must be 'vp', 'cosine' or 'linear', got {name!r}")
    return jnp.concatenate([jnp.zeros((1,)), betas])


def schedule(name, steps):
    """(alphas, alpha_bars) of a schedule, each (T + 1,): alpha_t = 1 - beta_t and their running products."""
    alphas = 1 - beta_schedule(name, steps)
    return alphas, jnp.cumprod(alphas)


class NoiseNetwork(nn.Module):
    """eps(s, x_t, t): an MLP on (x_t, s, an MLP of learned Fourier features of t), all with mish."""

    hidden_dims: Sequence[int]
    action_dim: int
    time_dim: int = 64
    layer_norm: bool = False

    @nn.compact
    def __call__(self, observations, actions, times):
        time_features = FourierFeatures(self.time_dim, learnable=True)(times)
        cond = MLP(tuple(self.hidden_dims), activations=mish, activate_final=False)(time_features)
        reverse = MLP((*self.hidden_dims, self.action_dim), activations=mish, layer_norm=self.layer_norm,
                      activate_final=False)  # fmt: skip
        return reverse(jnp.concatenate([actions, observations, cond], axis=-1))


def ddpm_sample(eps, noise, rng, alphas, alpha_bars, clip_before=False, clip_after=False):
    """Runs the reverse chain t = T..1 from `noise` (B, D): x0 = (x - sqrt(1 - abar_t) eps(x, t)) / sqrt(abar_t),
    then x <- the posterior mean of x_{t-1} given clip(x0) and x (`clip_before`), or x <- x0 itself (otherwise, as the
    reference's QSM); plus sqrt(beta_t) z for t > 1, clipped to [-1, 1] when `clip_after`. `eps(x, t)` takes t as
    (B, 1). Returns x_0 (B, D)."""
    steps = alphas.shape[0] - 1
    times = jnp.ones((*noise.shape[:-1], 1))

    def step(carry, t):
        x, key = carry
        eps_pred = eps(x, times * t)
        x0 = (x - jnp.sqrt(1 - alpha_bars[t]) * eps_pred) / jnp.sqrt(alpha_bars[t])
        if clip_before:
            x0 = jnp.clip(x0, -1, 1)
            x = (jnp.sqrt(alpha_bars[t - 1]) * (1 - alphas[t]) * x0
                 + jnp.sqrt(alphas[t]) * (1 - alpha_bars[t - 1]) * x) / (1 - alpha_bars[t])  # fmt: skip
        else:
            x = x0
        key, z_key = jax.random.split(key)
        x = x + (t > 1) * jnp.sqrt(1 - alphas[t]) * jax.random.normal(z_key, x.shape)
        if clip_after:
            x = jnp.clip(x, -1, 1)
        return (x, key), None

    _, key = jax.random.split(rng)
    (x, _), _ = jax.lax.scan(step, (noise, key), jnp.arange(steps, 0, -1), unroll=steps)
    return x
