"""Update throughput (per-step vs fused schedule), FLOPs per update, FLOP efficiency and time to first update.

The per-step schedule is the reference's: sample a batch on the host, then one jitted `agent.update` call per
update (dispatched asynchronously, as the drivers do). The fused schedule is `main.py`'s offline loop: sample K
batches on the host, stacked, one `batch_update` call. Both run in the same process, interleaved, on the
same dataset, so their ratio is not skewed by load changes between them.

FLOPs come from XLA's cost analysis of the compiled update. To say where the time goes, the matrix products of the
update are read from its StableHLO (with their shapes and how often each runs) and replayed alone: their time is the
part of the update a dense-matmul machine would do; the rest is element-wise work (GELU, layer norm, Adam, RNG).
"""

import re
import time
from collections import Counter

import jax
import numpy as np

from benchmarks.common import AGENTS, make_agent, matmul_rate, ogbench_like_fields, timed

_NAME = r'@("[^"]+"|[\w.$-]+)'  # Symbol names are quoted when they hold other characters, e.g. @"<lambda>".
_FUNC_RE = re.compile(r'func\.func\s+(?:public\s+|private\s+)?' + _NAME + r'\(')
_CALL_RE = re.compile(r'\bcall ' + _NAME + r'\(')
_DOT_RE = re.compile(
    r'stablehlo\.dot_general\s+[^,]+,\s*[^,]+,\s*'
    r'(?:batching_dims = \[([\d, ]*)\] x \[([\d, ]*)\],\s*)?'
    r'contracting_dims = \[([\d, ]*)\] x \[([\d, ]*)\]'
    r'.*?:\s*\(tensor<([^>]*)>,\s*tensor<([^>]*)>\)\s*->\s*tensor<([^>]*)>'
)


def _dims(text):
    return tuple(int(x) for x in text.replace(' ', '').split(',') if x)


_DTYPES = {'f32': 'float32', 'f64': 'float64', 'f16': 'float16', 'bf16': 'bfloat16'}


def _tensor_shape(spec):
    parts = spec.split('x')
    return tuple(int(p) for p in parts[:-1]), _DTYPES.get(parts[-1], parts[-1])


def dot_ops(stablehlo_text):
    """Matrix products of a lowered module as a Counter of (lhs_shape, rhs_shape, dims, dtype) -> executions.

    Calls between functions of the module are followed, so a function called twice counts its products twice.
    `dims` is ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)) as `lax.dot_general` takes them.
    """
    funcs = {}
    current = None
    for line in stablehlo_text.splitlines():
        match = _FUNC_RE.search(line)
        if match:
            current = funcs.setdefault(match.group(1), dict(dots=Counter(), calls=Counter()))
            continue
        if current is None:
            continue
        match = _DOT_RE.search(line)
        if match:
            lb, rb, lc, rc, lhs, rhs, _ = match.groups()
            lhs_shape, dtype = _tensor_shape(lhs)
            rhs_shape, _ = _tensor_shape(rhs)
            dims = ((_dims(lc), _dims(rc)), (_dims(lb or ''), _dims(rb or '')))
            current['dots'][(lhs_shape, rhs_shape, dims, dtype)] += 1
        for callee in _CALL_RE.findall(line):
            current['calls'][callee] += 1

    memo = {}

    def total(name, depth=0):
        if name in memo:
            return memo[name]
        out = Counter(funcs[name]['dots'])
        if depth < 50:
            for callee, count in funcs[name]['calls'].items():
                if callee in funcs:
                    for key, n in total(callee, depth + 1).items():
                        out[key] += n * count
        memo[name] = out
        return out

    return total('main') if 'main' in funcs else Counter()


def dot_flops(key):
    """FLOPs of one execution of a product keyed like `dot_ops` (2 per multiply-add)."""
    lhs_shape, rhs_shape, ((lc, rc), (lb, rb)), _ = key
    contracted = int(np.prod([lhs_shape[d] for d in lc]))
    batch = int(np.prod([lhs_shape[d] for d in lb]))
    lhs_free = int(np.prod([s for d, s in enumerate(lhs_shape) if d not in lc and d not in lb]))
    rhs_free = int(np.prod([s for d, s in enumerate(rhs_shape) if d not in rc and d not in rb]))
    return 2 * batch * lhs_free * rhs_free * contracted


def _dispatch_overhead(reps=50):
    f = jax.jit(lambda x: x + 1)
    x = jax.numpy.zeros((1,))
    jax.block_until_ready(f(x))
    return min(timed(f, x)[1] for _ in range(reps))


def replay_dots(ops, min_share=0.002, budget_s=3.0):
    """Times every product of `ops` alone (best of a few runs, less the dispatch cost of a trivial call).

    Products carrying less than `min_share` of the matmul FLOPs are not run; they are charged at the rate of the
    ones that were. Returns the matmul-only seconds per update and the matmul FLOP/s at the update's shapes.
    """
    flops = {key: dot_flops(key) * n for key, n in ops.items()}
    total = sum(flops.values())
    if total == 0:
        return dict(dot_seconds=0.0, dot_flops_per_s=None, dot_shapes=0)
    overhead = _dispatch_overhead()
    rng = np.random.default_rng(0)
    seconds = timed_flops = 0.0
    per_key_budget = budget_s / max(1, sum(1 for f in flops.values() if f >= min_share * total))
    for key, count in sorted(ops.items(), key=lambda kv: -flops[kv[0]]):
        if flops[key] < min_share * total:
            continue
        lhs_shape, rhs_shape, dims, dtype = key
        a = jax.numpy.asarray(rng.standard_normal(lhs_shape), dtype=dtype)
        b = jax.numpy.asarray(rng.standard_normal(rhs_shape), dtype=dtype)
        fn = jax.jit(lambda x, y, dims=dims: jax.lax.dot_general(x, y, dims))
        _, first = timed(fn, a, b)
        reps = int(np.clip(per_key_budget / max(first, 1e-6), 3, 50))
        best = min(timed(fn, a, b)[1] for _ in range(reps))
        seconds += max(best - overhead, 0.0) * count
        timed_flops += flops[key]
    rate = timed_flops / seconds if seconds > 0 else None
    return dict(dot_seconds=total / rate if rate else None, dot_flops_per_s=rate, dot_shapes=len(ops))


def make_dataset(num_transitions, seed=0):
    """An OGBench-shaped `Dataset` (obs 28, act 5, episodes of 1000) for the update benchmarks."""
    from utils.datasets import Dataset

    return Dataset.create(seed=seed, **ogbench_like_fields(num_transitions, seed=seed))


def bench_agent(agent_name, size, dataset, target_s=3.0, rounds=2, max_fused=100, replay=True, matmul_n=2048):
    """All update measurements of one agent at one size; returns a flat dict of numbers (seconds, FLOPs, rates)."""
    from training.data import LOSS_FIELDS

    agent, config = make_agent(agent_name, size)
    batch_size, horizon, discount = config['batch_size'], config['horizon_length'], config['discount']

    def sample():
        return dataset.sample_sequence(batch_size, horizon, discount, fields=LOSS_FIELDS)

    out = dict(agent=agent_name, size=size, actor_type=config.get('actor_type'), horizon=horizon, batch=batch_size)
    out['hidden'] = 'x'.join(str(h) for h in config['value_hidden_dims'])

    # Time to first update: tracing + compilation + the first step, as a fresh run sees it. Later calls repeat until
    # one is fast: an agent whose leaves change weak-typedness across updates compiles `update` more than once.
    batch = sample()
    calls = []
    for _ in range(5):
        start = time.perf_counter()
        agent, info = agent.update(batch)
        jax.block_until_ready((agent, info))
        calls.append(time.perf_counter() - start)
        if len(calls) > 1 and calls[-1] < 0.3 * calls[0]:
            break
    out['first_update_s'] = calls[0]
    out['warmup_update_calls_s'] = calls
    out['update_compiles'] = 1 + sum(1 for t in calls[1:] if t >= 0.3 * calls[0])

    # FLOPs of one update (the executable is already in jit's cache, so compiling here is cheap).
    lowered = type(agent).update.lower(agent, batch)
    cost = lowered.compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    out['flops'] = float(cost.get('flops', 0.0))
    out['transcendentals'] = float(cost.get('transcendentals', 0.0))
    ops = dot_ops(lowered.as_text())
    out['dot_flops'] = float(sum(dot_flops(k) * n for k, n in ops.items()))

    (agent, info), estimate = timed(agent.update, batch)
    steps = int(np.clip(round(target_s / max(estimate, 1e-6)), 3, max_fused))
    out['steps_per_round'] = steps

    # First fused call of this block size compiles `batch_update` for it; one more per-step update warms the
    # signature that the fused call's output has.
    stacked = stack_batches([sample() for _ in range(steps)])
    start = time.perf_counter()
    agent, info = agent.batch_update(stacked)
    jax.block_until_ready((agent, info))
    out['first_fused_call_s'] = time.perf_counter() - start
    (agent, info), out['update_after_fused_s'] = timed(agent.update, batch)

    per_step_times, fused_times = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            agent, info = agent.update(sample())
        jax.block_until_ready((agent, info))
        per_step_times.append(time.perf_counter() - start)

        start = time.perf_counter()
        agent, info = agent.batch_update(stack_batches([sample() for _ in range(steps)]))
        jax.block_until_ready((agent, info))
        fused_times.append(time.perf_counter() - start)

    # Components: host sampling + stacking, and the compiled updates alone on batches already on the device.
    start = time.perf_counter()
    host_batches = [sample() for _ in range(steps)]
    out['sample_ms'] = 1e3 * (time.perf_counter() - start) / steps
    start = time.perf_counter()
    stacked = stack_batches(host_batches)
    out['stack_ms'] = 1e3 * (time.perf_counter() - start) / steps
    stacked = jax.device_put(stacked)
    # The matmul reference right before the compute measurement: the machine is shared, so its rate drifts.
    out['matmul_local_flops_per_s'] = matmul_rate(matmul_n, reps=5)['flops_per_s']
    (agent, info), compute = timed(agent.batch_update, stacked)
    out['compute_ms'] = 1e3 * compute / steps

    out['per_step_ups'] = steps / min(per_step_times)
    out['fused_ups'] = steps / min(fused_times)
    out['fused_speedup'] = out['fused_ups'] / out['per_step_ups']
    out['per_step_rounds_s'] = per_step_times
    out['fused_rounds_s'] = fused_times
    out['per_step_ms'] = 1e3 / out['per_step_ups']
    out['fused_ms'] = 1e3 / out['fused_ups']
    out['compute_flops_per_s'] = out['flops'] / (compute / steps)
    out['fused_flops_per_s'] = out['flops'] * out['fused_ups']
    if replay and out['dot_flops'] > 0:
        out.update(replay_dots(ops))
    return out


def run(
    sizes,
    agents=None,
    num_transitions=100_000,
    target_s=3.0,
    rounds=2,
    replay_sizes=('paper',),
    matmul_n=2048,
    log=print,
):
    """Benchmarks every agent of `agents` (default: all of `AGENTS`) at every size; returns a list of dicts."""
    dataset = make_dataset(num_transitions)
    results = []
    for size in sizes:
        for name in agents or AGENTS:
            start = time.perf_counter()
            row = bench_agent(
                name, size, dataset, target_s=target_s, rounds=rounds, replay=size in replay_sizes, matmul_n=matmul_n
            )
            row['bench_s'] = time.perf_counter() - start
            log(
                f'  updates {name:8s} {size:6s}: per-step {row["per_step_ups"]:.2f}/s, fused {row["fused_ups"]:.2f}/s '
                f'(x{row["fused_speedup"]:.2f}), {row["flops"] / 1e9:.2f} GFLOP/update, '
                f'first update {row["first_update_s"]:.1f}s  [{row["bench_s"]:.0f}s]'
            )
            results.append(row)
    return results


def stack_batches(batches):
    """Stacks a list of batches (dicts of arrays) into one with a leading (U,) axis, as `batch_update` takes."""
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}
