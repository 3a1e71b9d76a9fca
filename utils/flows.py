"""What the flow agents share: chunk reshaping, the example chunks of `create`, QC's chunked TD loss, the
flow-matching regression pair, Euler integration of a flow (or of a residual flow on its base), adjoint matching's
memoryless SDE and best-of-N selection by a critic; each agent file keeps only its method's math."""

import jax
import jax.numpy as jnp

from utils.networks import aggregate_q, batched_examples


def chunk_actions(actions, action_chunking):
    """Dataset chunks (..., H, A) as a policy or critic sees them: the flat chunk (..., H * A) when chunking, else the
    first action (..., A) (the n-step baselines act on single actions)."""
    if action_chunking:
        return jnp.reshape(actions, (*actions.shape[:-2], -1))
    return actions[..., 0, :]


def example_chunks(config, ex_observations, ex_actions):
    """What `create` initialises the networks with: the examples with one batch axis (`batched_examples`) and the
    example chunk, (B, H * A) when `action_chunking`, else (B, A). Refuses a config without a chunk length."""
    horizon = config.get('horizon_length')
    if horizon is None or horizon < 1:
        raise ValueError(f'horizon_length must be a positive integer, got {horizon} (the backup is H steps long)')
    ex_observations, ex_actions = batched_examples(ex_observations, ex_actions)  # (B, *obs), (B, A)
    full_actions = jnp.concatenate([ex_actions] * (horizon if config['action_chunking'] else 1), axis=-1)
    return ex_observations, ex_actions, full_actions


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


def summed_flow_actions(network, names, observations, noises, num_steps):
    """Euler integration (`euler_flow`) of the sum of the velocities of the flows `names` of `network` from
    `noises` (..., D): a flow alone, or a residual flow on top of its base."""
    nets = [network.select(name) for name in names]
    return euler_flow(lambda x, t: sum(net(observations, x, t) for net in nets), noises, num_steps)


def memoryless_sde(fine, base, observations, rng, full_action_dim, num_steps, residual=False):
    """The memoryless SDE of adjoint matching run with the velocity `fine` (a correction added to `base` when
    `residual`), differentiable in whatever `fine` closes over.

    x_0 ~ N(0, I) drawn from `rng`; then for t = i h (h = 1 / num_steps) x <- x + h (2 v - x / (t + h)) + sqrt(h)
    sigma_t eps, sigma_t = sqrt(2 (1 - t + h) / (t + h)), eps from the i-th of `num_steps` keys split from `rng`; the
    last step is an ODE step of `base`. Returns the states x_0..x_T (T + 1, each (B, D)), the times (T, each (B, 1))
    and the path's KL penalty sum_t 2 |v - v_base|^2 / sigma_t^2 (B,) over the SDE steps.
    """
    h = 1 / num_steps
    x = jax.random.normal(rng, (*observations.shape[:-1], full_action_dim))  # (B, D)
    xs, ts, penalty = [x], [], 0.0
    for i, key in enumerate(jax.random.split(rng, num_steps)):
        t = jnp.full_like(x[..., :1], i / num_steps)  # (B, 1)
        sigma = jnp.sqrt(2 * (1 - t + h) / (t + h))
        eps = jax.random.normal(key, x.shape)
        if i < num_steps - 1:
            v, v_base = fine(observations, x, t), base(observations, x, t)
            gap = v if residual else v - v_base
            v = v + v_base if residual else v
            penalty = penalty + jnp.sum(jnp.square(gap), axis=-1) * 2 / jnp.square(sigma[..., 0])
            x = x + h * (2 * v - x / (t + h)) + jnp.sqrt(h) * sigma * eps
        else:
            x = x + h * base(observations, x, t)
        xs.append(x)
        ts.append(t)
    return xs, ts, penalty


def candidates(observations, config, num, rng):
    """Inputs of best-of-N sampling for observations (..., *obs) (`config['ob_dims']` their shape): the observations
    repeated on a new candidate axis, (..., N, *obs), and N(0, I) noise (..., N, D), D = `config['full_action_dim']`,
    drawn from `rng`."""
    batch_shape = observations.shape[: observations.ndim - len(config['ob_dims'])]
    noises = jax.random.normal(rng, (*batch_shape, num, config['full_action_dim']))
    return jnp.repeat(jnp.expand_dims(observations, len(batch_shape)), num, axis=len(batch_shape)), noises


def best_of_n(candidates, q):
    """The candidate (..., N, D) with the highest score q (..., N), per leading index: (..., D)."""
    best = jnp.argmax(q, axis=-1)
    return jnp.take_along_axis(candidates, best[..., None, None], axis=-2)[..., 0, :]


def chunk_td_loss(agent, batch, grad_params, rng, q_agg='mean', next_actions=None, times=None):
    """QC's chunked TD loss: every critic of `agent`'s ensemble regresses onto the H-step return bootstrapped with
    the target ensemble's aggregate (`q_agg`, minus `config['rho']` times its std) at the policy's next chunk
    (`agent.sample_actions` on the last next observation with `rng`, unless `next_actions` gives them); chunks that
    run past an episode end are left out (`valid[..., -1]`). `times` (B, 1), when given, is a further input of both
    critics (a time-conditioned critic). Returns (loss, info)."""
    config = agent.config
    actions = chunk_actions(batch['actions'], config['action_chunking'])  # (B, H * A) or (B, A)
    last_next_obs = batch['next_observations'][..., -1, :]
    if next_actions is None:
        next_actions = agent.sample_actions(last_next_obs, rng=rng)
    critic_times = () if times is None else (times,)
    next_qs = agent.network.select('target_critic')(last_next_obs, next_actions, *critic_times)  # (num_qs, B)
    next_q = aggregate_q(next_qs, q_agg, config['rho'])
    discount = config['discount'] ** config['horizon_length']
    target_q = batch['rewards'][..., -1] + discount * batch['masks'][..., -1] * next_q

    q = agent.network.select('critic')(batch['observations'], actions, *critic_times, params=grad_params)  # (num_qs, B)
    critic_loss = (jnp.square(q - target_q) * batch['valid'][..., -1]).mean()
    return critic_loss, {'critic_loss': critic_loss, 'q_mean': q.mean(), 'q_max': q.max(), 'q_min': q.min()}
