"""Online environment steps/s of `main.py`'s online loop, and the share of environment, policy and update.

The loop is `training.loops.online_loop` without logging: `OnlineActor.step` (a policy call when the chunk queue is empty,
then one environment step), `ReplayBuffer.add_transition`, then one `batch_update` on a batch sampled like
`main.py`'s `sample_batch` (utd_ratio 1, updates from the first step). It runs twice: as the driver does (JAX calls
dispatched asynchronously, so an update can overlap the next environment steps), then with every part blocked and
timed on its own for the breakdown.
"""

import time

import jax
import numpy as np

from benchmarks.common import ACTION_DIM, make_agent, ogbench_like_fields
from benchmarks.eval_bench import make_env


class _TimedPolicy:
    """Stands in for the agent in `OnlineActor`: forwards `sample_actions`, blocks, and adds up the seconds."""

    def __init__(self, agent):
        self.agent = agent
        self.seconds = 0.0
        self.calls = 0

    def sample_actions(self, observations, rng=None):
        start = time.perf_counter()
        out = jax.block_until_ready(self.agent.sample_actions(observations=observations, rng=rng))
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out


def run(agent_name='QC', size='small', steps=None, target_s=5.0, dataset_size=10_000, log=print):
    """Benchmarks the online loop for one agent; returns steps/s as run and the blocked per-part breakdown."""
    from training.actor import OnlineActor
    from training.data import LOSS_FIELDS, stack_utd
    from utils.datasets import Dataset, ReplayBuffer

    agent, config = make_agent(agent_name, size)
    batch_size, horizon, discount = config['batch_size'], config['horizon_length'], config['discount']
    dataset = Dataset.create(seed=0, **ogbench_like_fields(dataset_size))
    buffer = ReplayBuffer.create_from_initial_dataset(dataset, size=dataset_size + 100_000, seed=0)
    env = make_env()
    actor = OnlineActor(env, ACTION_DIM, seed=0)

    def sample_batch():
        return stack_utd(buffer.sample_sequence(batch_size, horizon, discount, fields=LOSS_FIELDS), 1, batch_size)

    # Warm up: compile sample_actions and batch_update (and let their signatures settle).
    warm = time.perf_counter()
    update_times = []
    for _ in range(4):
        transition, _, _ = actor.step(agent)
        buffer.add_transition(transition)
        start = time.perf_counter()
        agent, info = jax.block_until_ready(agent.batch_update(sample_batch()))
        update_times.append(time.perf_counter() - start)
    warmup_s = time.perf_counter() - warm
    if steps is None:
        steps = int(np.clip(round(target_s / max(update_times[-1], 1e-4)), 2 * horizon, 2000))
        steps = max(horizon, steps // horizon * horizon)  # whole chunks, so both runs call the policy equally often

    # As the driver runs it.
    actor = OnlineActor(env, ACTION_DIM, seed=1)
    start = time.perf_counter()
    for _ in range(steps):
        transition, _, _ = actor.step(agent)
        buffer.add_transition(transition)
        agent, info = agent.batch_update(sample_batch())
    jax.block_until_ready((agent, info))
    loop_s = time.perf_counter() - start

    # Blocked and split.
    actor = OnlineActor(env, ACTION_DIM, seed=2)
    policy = _TimedPolicy(agent)
    parts = dict(env=0.0, policy=0.0, buffer=0.0, sample=0.0, update=0.0)
    start_all = time.perf_counter()
    for _ in range(steps):
        policy.agent = agent
        before = policy.seconds
        start = time.perf_counter()
        transition, _, _ = actor.step(policy)
        parts['env'] += time.perf_counter() - start - (policy.seconds - before)
        start = time.perf_counter()
        buffer.add_transition(transition)
        parts['buffer'] += time.perf_counter() - start
        start = time.perf_counter()
        batch = sample_batch()
        parts['sample'] += time.perf_counter() - start
        start = time.perf_counter()
        agent, info = jax.block_until_ready(agent.batch_update(batch))
        parts['update'] += time.perf_counter() - start
    blocked_s = time.perf_counter() - start_all
    parts['policy'] = policy.seconds

    out = dict(agent=agent_name, size=size, steps=steps, warmup_s=warmup_s, policy_calls=policy.calls)
    out['steps_per_s'] = steps / loop_s
    out['blocked_steps_per_s'] = steps / blocked_s
    for key, value in parts.items():
        out[f'{key}_ms'] = 1e3 * value / steps
        out[f'{key}_share'] = value / blocked_s
    log(
        f'  online {agent_name} {size}: {out["steps_per_s"]:.2f} steps/s (blocked {out["blocked_steps_per_s"]:.2f}); '
        + ', '.join(f'{k} {100 * out[f"{k}_share"]:.0f}%' for k in parts)
    )
    return out
