"""Shared pieces of the benchmarks: timers, machine load, the matmul reference rate, agent configs and data."""

import os
import platform
import statistics
import sys
import time

import numpy as np

OBS_DIM = 28  # cube-single state observation size.
ACTION_DIM = 5  # cube-single action size.
EPISODE_LENGTH = 1000  # OGBench play episodes.
ENV_NAME = 'cube-single-play-singletask-task2-v0'

# Agents of the suite: (agent module, config overrides). FQL is the distilled one-step policy on single actions.
AGENTS = {
    'QC': ('acfql', dict(actor_type='best-of-n', horizon_length=5)),
    'QC-FQL': ('acfql', dict(actor_type='distill-ddpg', horizon_length=5)),
    'FQL': ('acfql', dict(actor_type='distill-ddpg', horizon_length=1)),
    'QC-RLPD': ('acrlpd', dict(horizon_length=5, bc_alpha=0.01)),
    # The QAM paper's methods (their README's cube-triple values).
    'QAM': ('qam', dict(horizon_length=5, inv_temp=3.0)),
    'QAM-F': ('qam', dict(horizon_length=5, inv_temp=10.0, fql_alpha=300.0)),
    'QAM-E': ('qam', dict(horizon_length=5, inv_temp=3.0, edit_scale=0.1)),
    'FQL (QAM paper)': ('acfql', dict(horizon_length=5, num_qs=10, rho=0.5, bc_mask='chunk')),
    # The QAM paper's baselines (their reproduce.py's cube-double values).
    'FEdit': ('fedit', dict(horizon_length=5, edit_scale=0.2)),
    'QSM': ('dcgql', dict(horizon_length=5, actor_loss_type='qsm', inv_temp=1.0, alpha=10.0, clip_sampler_after=True)),
    'ReBRAC': ('rebrac', dict(horizon_length=5, alpha_actor=0.01, actor_noise=0.0)),
    'DSRL': ('dsrl', dict(horizon_length=5, noise_scale=1.0)),
    'CGQL': ('cgql', dict(horizon_length=5, mode='simple', inv_temp=10.0, guidance_coef=0.01)),
    'CGQL-M': ('cgql', dict(horizon_length=5, mode='mse', inv_temp=10.0, guidance_coef=0.01, noisy_coef=0.001)),
    'CGQL-L': ('cgql', dict(horizon_length=5, mode='linex', inv_temp=10.0, guidance_coef=0.01, noisy_coef=0.001)),
    'FBRAC': ('fbrac', dict(horizon_length=5, alpha=0.1)),
    'IFQL': ('ifql', dict(horizon_length=5, kappa=0.9)),
    'BAM': ('bam', dict(horizon_length=5, inv_temp=10.0)),
    'FAWAC': ('fawac', dict(horizon_length=5, inv_temp=0.8)),
    'DAC': ('dcgql', dict(horizon_length=5, actor_loss_type='dac', alpha=3.0, clip_sampler_before=True)),
}

# Network sizes. `paper` is the paper's setting; `tiny` is what `--quick` uses.
SIZES = {
    'paper': dict(hidden=(512, 512, 512, 512), num_samples=32, batch_size=256, flow_steps=10),
    'small': dict(hidden=(256, 256), num_samples=8, batch_size=256, flow_steps=10),
    'tiny': dict(hidden=(32, 32), num_samples=4, batch_size=16, flow_steps=3),
}


def load_average():
    """The 1-minute load average (None where the OS does not report it)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine_info():
    """CPU count, platform, JAX version and backend: the context every number depends on."""
    import jax

    return dict(
        cpu_count=os.cpu_count(),
        platform=platform.platform(),
        python=platform.python_version(),
        jax=jax.__version__,
        backend=jax.default_backend(),
        devices=[str(d) for d in jax.devices()],
    )


def timed(fn, *args, **kwargs):
    """Runs `fn` and blocks on its JAX outputs; returns (output, seconds)."""
    import jax

    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    return out, time.perf_counter() - start


def matmul_rate(n=2048, reps=10, dtype='float32'):
    """Dense matmul rate of this machine in FLOP/s: a jitted (n x n) @ (n x n) product, best of `reps` runs."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype=dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype=dtype)
    dot = jax.jit(jnp.dot)
    jax.block_until_ready(dot(a, b))
    times = [timed(dot, a, b)[1] for _ in range(reps)]
    return dict(
        n=n, dtype=dtype, flops_per_s=2.0 * n**3 / min(times), median_flops_per_s=2.0 * n**3 / statistics.median(times)
    )


def agent_class(module_name):
    """The registered agent class `module_name` (`agents.agents` key)."""
    from agents import agents

    return agents[module_name]


def make_config(agent_name, size):
    """The agent config of one suite entry (`AGENTS` key) at one size (`SIZES` key)."""
    module_name, overrides = AGENTS[agent_name]
    config = sys.modules[agent_class(module_name).__module__].get_config()
    spec = SIZES[size]
    config.actor_hidden_dims = spec['hidden']
    config.value_hidden_dims = spec['hidden']
    config.batch_size = spec['batch_size']
    for key in ('actor_num_samples', 'flow_steps'):
        if key in config:
            setattr(config, key, spec['num_samples' if key == 'actor_num_samples' else key])
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def make_agent(agent_name, size, seed=0):
    """A fresh agent of one suite entry for OGBench-shaped inputs; returns (agent, config)."""
    config = make_config(agent_name, size)
    cls = agent_class(AGENTS[agent_name][0])
    ex_obs = np.zeros((1, OBS_DIM), np.float32)
    ex_act = np.zeros((1, ACTION_DIM), np.float32)
    return cls.create(seed, ex_obs, ex_act, config), config


def ogbench_like_fields(num_transitions, seed=0, obs_dim=OBS_DIM, action_dim=ACTION_DIM, episode_length=EPISODE_LENGTH):
    """Random transitions laid out like an OGBench play dataset: fixed-length episodes, consecutive observations.

    `next_observations[t] == observations[t + 1]` inside an episode; the last step of an episode has its own next
    observation (the one OGBench drops from the next episode's start). Terminals mark every episode end; masks are 1.
    """
    rng = np.random.default_rng(seed)
    n = int(num_transitions)
    # Built in place so that the peak memory is the two observation arrays, nothing more.
    observations = rng.standard_normal((n, obs_dim), dtype=np.float32)
    next_observations = np.empty_like(observations)
    next_observations[:-1] = observations[1:]
    ends = np.arange(episode_length - 1, n, episode_length)
    ends = np.union1d(ends, [n - 1])
    next_observations[ends] = rng.standard_normal((len(ends), obs_dim), dtype=np.float32)
    terminals = np.zeros(n, np.float32)
    terminals[ends] = 1.0
    return dict(
        observations=observations,
        actions=rng.uniform(-1, 1, size=(n, action_dim)).astype(np.float32),
        rewards=rng.standard_normal(n, dtype=np.float32),
        terminals=terminals,
        masks=np.ones(n, np.float32),
        next_observations=next_observations,
    )


def format_table(rows, columns):
    """A plain-text table of `rows` (dicts) with `columns` as (key, header, format) triples."""
    cells = [[header for _, header, _ in columns]]
    for row in rows:
        line = []
        for key, _, fmt in columns:
            value = row.get(key)
            line.append('-' if value is None else (fmt.format(value) if fmt else str(value)))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ['  '.join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(lines)
