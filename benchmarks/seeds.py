"""Several seeds in one process: seed-updates per second of a vmapped `SeedGroup` against single-seed runs, and
the replay memory of S seeds on one shared offline dataset.

Updates: for each agent and size, S single-seed agents run fused blocks of K updates (`batch_update`) one after
another on batches already on the device (S sequential runs), and a `SeedGroup` of S seeds runs the same blocks
for all its seeds in one call, with the runs' default `seeds_per_vmap` (all seeds vmapped on an accelerator, one after
another inside the call on a CPU) and, at the small size, with all seeds vmapped. `ratio` = group seed-updates/s
over sequential seed-updates/s (>= 1: one process of S seeds beats S runs one after another). Memory per S: the
agents' state (parameters, optimizer, targets) and one block of batches, plus the device's peak bytes where the
backend reports them (GPUs; not CPUs).

Replay memory: `main.py` starts every seed's replay buffer with the offline data. A `PrefixReplayBuffer` reads
the shared dataset in place and stores only its seed's online transitions, against one full copy per seed.
"""

import time

import jax
import numpy as np

from benchmarks.common import AGENTS, agent_class, make_config, ogbench_like_fields
from benchmarks.updates import make_dataset, stack_batches


def _tree_bytes(tree):
    return int(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)))


def _peak_device_bytes():
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get('peak_bytes_in_use')


def _seconds(fn):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def bench_seeds(agent_name, size, dataset, seed_counts=(1, 2, 4, 8), steps=10, repeats=3, compare_vmap=False):
    """Rows of seed-updates/s for every S of `seed_counts`: S single-seed agents one after another, and one
    `SeedGroup` of S seeds with the runs' default `seeds_per_vmap` (with `compare_vmap`, also with all seeds vmapped).

    The timings of a row alternate between the two, `repeats` times, and keep the fastest of each, so that load
    from other work on a shared machine affects both alike.
    """
    from training.data import LOSS_FIELDS
    from training.seeds import SeedGroup

    config = make_config(agent_name, size)
    cls = agent_class(AGENTS[agent_name][0])
    example = dataset.example()
    batch_size, horizon, discount = config['batch_size'], config['horizon_length'], config['discount']

    def block():
        batches = [dataset.sample_sequence(batch_size, horizon, discount, fields=LOSS_FIELDS) for _ in range(steps)]
        return jax.device_put(stack_batches(batches))

    rows = []
    for num_seeds in seed_counts:
        singles = [cls.create(s, example['observations'], example['actions'], config) for s in range(num_seeds)]
        blocks = [block() for _ in range(num_seeds)]

        def sequential(singles=singles, blocks=blocks):
            return [agent.batch_update(b) for agent, b in zip(singles, blocks, strict=True)]

        groups = {'seed_ups': 0, 'vmap_seed_ups': num_seeds} if compare_vmap and num_seeds > 1 else {'seed_ups': 0}
        row = dict(agent=agent_name, size=size, seeds=num_seeds, steps=steps)
        calls = {'sequential_ups': sequential}
        for key, per_vmap in groups.items():
            group = SeedGroup.create(
                cls, range(num_seeds), example['observations'], example['actions'], config, seeds_per_vmap=per_vmap
            )
            row[f'first_{key}_call_s'] = _seconds(lambda group=group, blocks=blocks: group.batch_update(blocks))

            def grouped(group=group, blocks=blocks):
                group.batch_update(blocks)
                return group.agents

            calls[key] = grouped
            if key == 'seed_ups':
                row.update(seeds_per_vmap=group.seeds_per_vmap, state_mb=_tree_bytes(group.agents) / 2**20)
        _seconds(sequential)  # Compiles the single-seed block.
        best = {key: _seconds(fn) for key, fn in calls.items()}
        for _ in range(repeats - 1):
            for key, fn in calls.items():
                best[key] = min(best[key], _seconds(fn))
        for key, seconds in best.items():
            row[key] = num_seeds * steps / seconds
        row['batch_mb'] = sum(_tree_bytes(b) for b in blocks) / 2**20
        row['ratio'] = row['seed_ups'] / row['sequential_ups']
        row['vmap_ratio'] = row['vmap_seed_ups'] / row['sequential_ups'] if 'vmap_seed_ups' in row else None
        row['peak_device_bytes'] = _peak_device_bytes()
        rows.append(row)
    return rows


def replay_bytes(num_transitions=1_000_000, seed_counts=(1, 4, 8), online_steps=1_000_000, buffer_size=1_000_000):
    """Replay memory of S seeds of `main.py` on an OGBench-shaped dataset, shared prefix against copies.

    `shared_start` / `shared_end`: the dataset once plus every seed's online rows at the start and at the end of
    an `online_steps` phase; `copies`: the dataset (the offline phase and `main_online.py` batches read it) plus one
    buffer per seed holding a copy of it (the reference's layout), whose size does not change online.
    """
    from training.data import TRANSITION_KEYS
    from utils.datasets import Dataset, PrefixReplayBuffer

    dataset = Dataset.create(seed=0, compact=True, **ogbench_like_fields(num_transitions))
    capacity = max(buffer_size, dataset.size + 1)
    buffer = PrefixReplayBuffer(dataset, capacity, TRANSITION_KEYS, online_capacity=online_steps, seed=0)
    online_row = buffer.transition_nbytes()
    rows = []
    for num_seeds in seed_counts:
        online_end = num_seeds * min(online_steps, capacity) * online_row
        rows.append(
            dict(
                seeds=num_seeds, transitions=num_transitions, online_steps=online_steps,
                dataset_mb=dataset.nbytes() / 2**20, shared_start_mb=dataset.nbytes() / 2**20,
                shared_end_mb=(dataset.nbytes() + online_end) / 2**20,
                copies_mb=(dataset.nbytes() + num_seeds * capacity * online_row) / 2**20,
            )
        )  # fmt: skip
    return rows


def run(sizes=('small', 'paper'), agents=('QC', 'QC-FQL'), seed_counts=(1, 2, 4, 8), steps=None,
        num_transitions=100_000, replay_transitions=1_000_000, replay_online_steps=1_000_000, log=print):  # fmt: skip
    """The `seeds` section: update rows per agent, size and S, and the replay memory rows."""
    dataset = make_dataset(num_transitions)
    updates = []
    for size in sizes:
        for name in agents:
            start = time.perf_counter()
            k = steps or (3 if size == 'paper' else 10)
            vmap = size != 'paper'  # Where pure vmap is slower (CPUs), measuring it at paper size takes minutes.
            rows = bench_seeds(name, size, dataset, seed_counts=seed_counts, steps=k, compare_vmap=vmap)
            for r in rows:
                log(
                    f'  seeds {name:7s} {size:6s} S={r["seeds"]}: {r["seed_ups"]:.1f} seed-updates/s, sequential '
                    f'{r["sequential_ups"]:.1f}/s, ratio {r["ratio"]:.2f}'
                )
            log(f'  [{time.perf_counter() - start:.0f}s]')
            updates.extend(rows)
    replay = replay_bytes(replay_transitions, online_steps=replay_online_steps, buffer_size=replay_transitions)
    return dict(updates=updates, replay=replay)
