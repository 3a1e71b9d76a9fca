"""Evaluation throughput on cube-single: episodes/s of `evaluate` run sequentially vs over env copies in lockstep.

The policy is the suite's small QC agent (untrained, so every episode runs to the time limit). Also measured: the
raw environment step rate and the latency of one `sample_actions` call, which bound what batching can gain: batched
evaluation only removes policy calls, the environment steps stay sequential.
"""

import time

import jax
import numpy as np

from benchmarks.common import ACTION_DIM, ENV_NAME, make_agent, timed

OBS_FILTERS = ['.*privileged.*', '.*proprio.*']  # As `make_env_and_datasets` wraps OGBench envs.


def make_env(env_name=ENV_NAME, max_episode_steps=None):
    """An OGBench env wrapped like the drivers' evaluation env (`EpisodeMonitor`)."""
    from envs.common import EpisodeMonitor
    from envs.ogbench_utils import make_ogbench_env

    kwargs = {} if max_episode_steps is None else dict(max_episode_steps=max_episode_steps)
    return EpisodeMonitor(make_ogbench_env(env_name, **kwargs), filter_regexes=OBS_FILTERS)


def env_step_rate(env, steps=200, seed=0):
    """Environment steps per second with uniform random actions (resets included)."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, ACTION_DIM).astype(np.float32))
        if terminated or truncated:
            env.reset()
    return steps / (time.perf_counter() - start)


def run(size='small', num_envs=10, num_episodes=20, max_episode_steps=None, agent_name='QC', log=print):
    """Sequential vs batched `evaluate` on the same episodes; returns a dict of rates and the pieces behind them."""
    from evaluation import evaluate

    agent, config = make_agent(agent_name, size)
    envs = [make_env(max_episode_steps=max_episode_steps) for _ in range(num_envs)]
    horizon = config['horizon_length']
    out = dict(agent=agent_name, size=size, num_envs=num_envs, episodes=num_episodes, horizon=horizon)

    out['env_steps_per_s'] = env_step_rate(envs[0])
    obs, _ = envs[0].reset(seed=0)
    key = jax.random.PRNGKey(0)
    timed(agent.sample_actions, observations=obs, rng=key)  # compile
    out['sample_ms'] = 1e3 * min(timed(agent.sample_actions, observations=obs, rng=key)[1] for _ in range(20))

    # Compile the batched sampler before timing: it pads to the number of copies, so one episode is enough.
    warm = time.perf_counter()
    evaluate(agent, envs[0], ACTION_DIM, num_eval_episodes=1, seed=10_000, record_trajectories=False, envs=envs)
    out['warmup_s'] = time.perf_counter() - warm

    start = time.perf_counter()
    seq_stats, _, _ = evaluate(
        agent, envs[0], ACTION_DIM, num_eval_episodes=num_episodes, seed=0, record_trajectories=False
    )
    out['sequential_s'] = time.perf_counter() - start
    start = time.perf_counter()
    bat_stats, _, _ = evaluate(
        agent, envs[0], ACTION_DIM, num_eval_episodes=num_episodes, seed=0, record_trajectories=False, envs=envs
    )
    out['batched_s'] = time.perf_counter() - start

    out['episode_length'] = seq_stats.get('episode.length')
    out['same_returns'] = bool(np.isclose(seq_stats.get('episode.return', 0.0), bat_stats.get('episode.return', 0.0)))
    out['sequential_eps'] = num_episodes / out['sequential_s']
    out['batched_eps'] = num_episodes / out['batched_s']
    out['speedup'] = out['batched_eps'] / out['sequential_eps']
    steps = num_episodes * (out['episode_length'] or 0)
    out['env_share_sequential'] = steps / out['env_steps_per_s'] / out['sequential_s']
    out['env_share_batched'] = steps / out['env_steps_per_s'] / out['batched_s']
    # Best case for batching: every policy call removed, only the environment steps left.
    out['speedup_bound'] = out['sequential_s'] / (steps / out['env_steps_per_s']) if steps else None
    log(
        f'  eval {agent_name} {size}: sequential {out["sequential_eps"]:.2f} ep/s, batched x{num_envs} '
        f'{out["batched_eps"]:.2f} ep/s (x{out["speedup"]:.2f}; env-only bound x{out["speedup_bound"]:.2f})'
    )
    return out
