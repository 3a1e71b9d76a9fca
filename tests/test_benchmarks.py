"""The benchmark suite: its matmul accounting, and a `--quick` run end to end (what CI runs)."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
from helpers import ROOT, subprocess_env

from benchmarks.updates import dot_flops, dot_ops


def test_dot_ops_follow_nested_calls():
    inner = jax.jit(lambda x, w: jnp.tanh(x @ w))

    def f(x, w, v):
        return inner(inner(x, w), w) @ v  # the nested jit is one private function called twice

    x, w, v = jnp.ones((8, 4)), jnp.ones((4, 4)), jnp.ones((4, 3))
    ops = dot_ops(jax.jit(f).lower(x, w, v).as_text())
    total = sum(dot_flops(k) * n for k, n in ops.items())
    assert total == 2 * (2 * 8 * 4 * 4) + 2 * 8 * 4 * 3
    assert sum(ops.values()) == 3


def test_dot_flops_with_batch_dims():
    x, w = jnp.ones((2, 8, 4)), jnp.ones((2, 4, 5))
    ops = dot_ops(jax.jit(lambda a, b: jnp.einsum('bij,bjk->bik', a, b)).lower(x, w).as_text())
    assert sum(dot_flops(k) * n for k, n in ops.items()) == 2 * 2 * 8 * 4 * 5


def test_quick_suite_runs(tmp_path):
    out = tmp_path / 'results.json'
    proc = subprocess.run(
        [sys.executable, '-m', 'benchmarks.run', '--quick', f'--out={out}'],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results['quick'] and results['matmul_flops_per_s'] > 0
    for row in results['updates']:
        assert row['per_step_ups'] > 0 and row['fused_ups'] > 0 and row['flops'] > 0
    assert results['eval'][0]['sequential_eps'] > 0 and results['eval'][0]['batched_eps'] > 0
    assert results['online'][0]['steps_per_s'] > 0
    assert results['memory']['duplicated']['bytes_per_transition'] > 0
    assert [r['seeds'] for r in results['seeds']['updates']] == [1, 2]
    assert all(r['seed_ups'] > 0 for r in results['seeds']['updates'])
    assert results['seeds']['replay'][-1]['shared_start_mb'] < results['seeds']['replay'][-1]['copies_mb']
    assert 'Targets' in proc.stdout or results['targets'] is not None
