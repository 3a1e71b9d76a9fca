"""Milliseconds per online step of the device replay's compiled call (`training.device_replay`) for small and large
replay storages: the call writes one transition into the storage it donates, so the storage's size should not show
(a copy per call of 1M rows would take tens of milliseconds).

    python -m benchmarks.device_replay [--rows 1000 1000000] [--steps 200]

Tiny QC (32x32), cube-triple shapes (46-dim observations, 5-dim actions), B = 16, H = 5, one packed step per call,
on random data.
"""

import argparse
import time

import numpy as np

H, OBS, ACTION = 5, 46, 5


def random_dataset(n=10_000, seed=0):
    from utils.datasets import Dataset

    rng = np.random.default_rng(seed)
    return Dataset.create(
        compact=True, seed=1, observations=rng.normal(size=(n, OBS)).astype(np.float32),
        actions=rng.uniform(-1, 1, size=(n, ACTION)).astype(np.float32), rewards=np.zeros(n, np.float32),
        terminals=(np.arange(n) % 100 == 99).astype(np.float32), masks=np.ones(n, np.float32),
        next_observations=rng.normal(size=(n, OBS)).astype(np.float32),
    )  # fmt: skip


def ms_per_step(rows, steps=200, log=print):
    """Milliseconds per call of one packed step on a replay storage of `rows` rows."""
    import jax

    from agents.acfql import ACFQLAgent, get_config
    from training.device_replay import DeviceReplay, RowSampler
    from training.seeds import SeedGroup
    from utils.datasets import ReplayBuffer

    data = random_dataset()
    config = get_config()
    config.update(horizon_length=H, batch_size=16, actor_hidden_dims=(32, 32), value_hidden_dims=(32, 32),
                  actor_num_samples=4, flow_steps=3)  # fmt: skip
    agents = SeedGroup.create(ACFQLAgent, (0,), data['observations'][:1], data['actions'][:1], config)
    transition = {k: data[k][0] for k in data}
    buffer = ReplayBuffer.create(transition, size=rows, seed=0)
    for i in range(50):
        buffer.add_transition({k: data[k][i] for k in data})
    sampler = RowSampler([('data', data, 8), ('replay', buffer, 8)], H, 0.99, data, buffer)
    agents.replay = DeviceReplay(data, [buffer], sampler.layout(1))  # one call per step (`fuse_steps` 1)

    def step():
        buffer.add_transition(transition)
        agents.queue_updates([sampler.sample(1)])

    step()
    jax.block_until_ready(agents.agents)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    jax.block_until_ready(agents.agents)
    ms = 1e3 * (time.perf_counter() - start) / steps
    log(f'  device replay, {rows} storage rows: {ms:.2f} ms per step')
    return ms


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rows', type=int, nargs='+', default=[1000, 1_000_000], help='storage rows to compare')
    parser.add_argument('--steps', type=int, default=200, help='timed steps per size')
    args = parser.parse_args(argv)
    return {rows: ms_per_step(rows, args.steps) for rows in args.rows}


if __name__ == '__main__':
    main()
