"""Cost of the dataset checks (envs/common.py) on a 1M-transition OGBench-shaped file:

    python -m benchmarks.data_checks [--transitions 1000000] [--obs_dim 46]

Times the checks that run before OGBench reads the file (array headers, the `terminals` array) and the value
checks on the loaded arrays, against one full `np.load` of the same file for scale.
"""

import argparse
import os
import tempfile
import time

import numpy as np

from envs.common import check_episode_ends, check_values, npz_layout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--transitions', type=int, default=1_000_000)
    parser.add_argument('--obs_dim', type=int, default=46)  # cube-triple's observation width.
    parser.add_argument('--action_dim', type=int, default=5)
    args = parser.parse_args(argv)
    n = args.transitions
    rng = np.random.default_rng(0)
    arrays = dict(
        observations=rng.normal(size=(n, args.obs_dim)).astype(np.float32),
        actions=rng.uniform(-1, 1, size=(n, args.action_dim)).astype(np.float32),
        terminals=(np.arange(n) % 1000 == 999),
        qpos=np.zeros((n, 30), np.float32),
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'data.npz')
        np.savez(path, **arrays)
        timings = {}
        start = time.perf_counter()
        npz_layout(path)
        timings['headers'] = time.perf_counter() - start
        start = time.perf_counter()
        check_episode_ends(path, np.load(path)['terminals'])
        timings['episode ends'] = time.perf_counter() - start
        start = time.perf_counter()
        loaded = {k: v for k, v in np.load(path).items()}
        timings['np.load of the whole file (for scale)'] = time.perf_counter() - start
        start = time.perf_counter()
        check_values(path, loaded)
        timings['finite values'] = time.perf_counter() - start
    size = sum(a.nbytes for a in arrays.values()) / 2**20
    print(f'{n} transitions, {size:.0f} MiB')
    for name, seconds in timings.items():
        print(f'  {name:<40} {seconds * 1000:8.1f} ms')
    return timings


if __name__ == '__main__':
    main()
