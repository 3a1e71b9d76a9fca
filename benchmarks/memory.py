"""Dataset memory: peak and resident memory, and bytes per transition, of an OGBench-shaped dataset.

Each layout is built in its own child process (`python -m benchmarks.memory --child LAYOUT N`), so that the peak
resident set (`ru_maxrss`) of one does not hide the other's. The child reports its resident memory after the imports
(baseline), the peak while the input arrays and the dataset coexist, the resident memory once the inputs are
dropped (peaks from /proc/self/status `VmHWM`, see `child`), `Dataset.nbytes()` and the time of one
`sample_sequence` batch (256 chunks of 5).
"""

import gc
import json
import os
import resource
import subprocess
import sys
import time

LAYOUTS = ('duplicated', 'compact')


def _status_bytes(field):
    """A memory field of /proc/self/status (VmRSS: resident now, VmHWM: peak resident), in bytes."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _rss_bytes():
    """Current resident set size of this process, in bytes."""
    return _status_bytes('VmRSS')


def _nbytes(dataset):
    if hasattr(dataset, 'nbytes'):
        return int(dataset.nbytes())
    # Before `Dataset.nbytes` existed: every stored field once.
    return int(sum(dataset[k].nbytes for k in dataset))


def child(layout, num_transitions):
    """Builds one dataset layout and returns its measurements (runs inside the child process)."""
    from benchmarks.common import ogbench_like_fields
    from training.data import LOSS_FIELDS
    from utils.datasets import Dataset

    out = dict(layout=layout, transitions=num_transitions, baseline_rss=_rss_bytes())
    fields = ogbench_like_fields(num_transitions)
    out['input_bytes'] = int(sum(v.nbytes for v in fields.values()))
    kwargs = {}
    if layout == 'compact':
        if 'compact' not in Dataset.create.__code__.co_varnames:
            return dict(out, error='Dataset.create has no compact option')
        kwargs['compact'] = True
    start = time.perf_counter()
    dataset = Dataset.create(seed=0, **kwargs, **fields)
    out['create_s'] = time.perf_counter() - start
    del fields
    gc.collect()
    # Peak of this process image. `ru_maxrss` is reported too, but Linux carries the parent's peak into it across
    # fork + exec, so it overstates the child's peak when the parent (the suite) is large.
    out['peak_rss'] = _status_bytes('VmHWM')
    out['ru_maxrss'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB.
    out['resident_rss'] = _rss_bytes()
    out['nbytes'] = _nbytes(dataset)
    out['bytes_per_transition'] = out['nbytes'] / dataset.size
    out['resident_per_transition'] = (out['resident_rss'] - out['baseline_rss']) / dataset.size
    dataset.sample_sequence(256, 5, 0.99, fields=LOSS_FIELDS)
    start = time.perf_counter()
    for _ in range(50):
        dataset.sample_sequence(256, 5, 0.99, fields=LOSS_FIELDS)
    out['sample_ms'] = 1e3 * (time.perf_counter() - start) / 50
    return out


def run(num_transitions=1_000_000, log=print):
    """Runs every layout in a child process; returns {layout: measurements} plus the compact/duplicated ratios."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=root + os.pathsep + os.environ.get('PYTHONPATH', ''))
    results = {}
    for layout in LAYOUTS:
        proc = subprocess.run(
            [sys.executable, '-m', 'benchmarks.memory', '--child', layout, str(num_transitions)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise RuntimeError(f'memory child {layout} failed:\n{proc.stderr[-2000:]}')
        results[layout] = json.loads(proc.stdout.strip().splitlines()[-1])
    dup, comp = results['duplicated'], results['compact']
    if 'error' not in comp:
        results['bytes_ratio'] = comp['bytes_per_transition'] / dup['bytes_per_transition']
        results['resident_ratio'] = comp['resident_per_transition'] / dup['resident_per_transition']
        results['peak_ratio'] = (comp['peak_rss'] - comp['baseline_rss']) / (dup['peak_rss'] - dup['baseline_rss'])
        log(
            f'  memory {num_transitions} transitions: {dup["bytes_per_transition"]:.1f} -> '
            f'{comp["bytes_per_transition"]:.1f} B/transition (x{results["bytes_ratio"]:.3f}), resident '
            f'x{results["resident_ratio"]:.3f}, peak above baseline x{results["peak_ratio"]:.3f}'
        )
    else:
        log(f'  memory: {comp["error"]}')
    return results


if __name__ == '__main__':
    if len(sys.argv) == 4 and sys.argv[1] == '--child':
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]))))
    else:
        sys.exit('usage: python -m benchmarks.memory --child LAYOUT NUM_TRANSITIONS (run.py drives this module)')
