"""What the flow agents share: chunk reshaping, the flow-matching regression pair, Euler integration of a flow and
best-of-N selection by a critic. ACFQL, ACRLPD and QAM read them; each agent file keeps only its method's math."""

import jax
import jax.numpy as jnp


def chunk_actions(actions, action_chunking):
    """Dataset chunks (..., H, A) as a policy or critic sees them: the flat chunk (..., H * A) when chunking, else the
    first action (..., A) (the n-step baselines act on single actions)."""
    if action_chunking:
        return jnp.reshape(actions, (*actions.shape[:-2], -1))
    return actions[..., 0, :]


def flow_matching_pair(noise_rng, time_rng, x_1):
    """The linear-path flow-matching regression pair for targets `x_1` (B, D): (x_t, t, velocity) with
    x_0 ~ N(0, I), t ~ U[0, 1) per row, x_t = (1 - t) x_0 + t x_1 and the velocity x_1 - x_0 a flow should predict."""
    x_0 = jax.random.normal(noise_rng, x_1.shape)
    t = jax.random.uniform(time_rng, (x_1.shape[0], 1))
    return (1 - t) * x_0 + t * x_1, t, x_1 - x_0


def euler_flow(velocity, noises, num_steps):
    """Integrates dx/dt = velocity(x, t) from `noises` at t = 0 to t = 1 in `num_steps` Euler steps; the result is
    clipped to [-1, 1]. `velocity` takes (x (..., D), t (..., 1))."""
    x = noises
    for i in range(num_steps):
        t = jnp.full((*x.shape[:-1], 1), i / num_steps)
        x = x + velocity(x, t) / num_steps
    return jnp.clip(x, -1, 1)


def best_of_n(candidates, q):
    """The candidate (..., N, D) with the highest score q (..., N), per leading index: (..., D)."""
    best = jnp.argmax(q, axis=-1)
    return jnp.take_along_axis(candidates, best[..., None, None], axis=-2)[..., 0, :]
