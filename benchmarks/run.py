"""Runs the benchmark suite, prints tables and the issue's targets, and writes every number to JSON.

    python -m benchmarks.run                      # full suite (CPU, under 10 minutes)
    python -m benchmarks.run --quick              # CI smoke run: tiny sizes, few iterations (under a minute)
    python -m benchmarks.run --only updates,memory --out /tmp/results.json
    python -m benchmarks.run --only seeds

Sections: `updates` (per-step vs fused updates/s, FLOPs, FLOP/s vs this machine's matmul rate, time to first
update), `eval` (sequential vs batched evaluation), `online` (main.py's online loop and its breakdown), `memory`
(dataset bytes per transition, compact vs duplicated next observations), `seeds` (S seeds vmapped in one process
against single-seed runs, and the replay memory of S seeds).
"""

import argparse
import json
import os
import sys
import time

SECTIONS = ('updates', 'eval', 'online', 'memory', 'seeds')
SEED_TARGET_CPU = 0.95  # S seeds in one process at least as fast per seed as S sequential runs, on a CPU.
SEED_TARGET_GPU = 5.0  # S=8 seed-updates/s over S=1 for QC-FQL at paper size, on a GPU.
PAPER_TOLERANCE = 0.97  # "Never slower" at paper size allows 3% timing noise between the two loops.


# Start-ups of one seed and of 8 (with worker processes, the default, and without).
STARTUP_SEEDS = ((1, -1), (8, -1), (8, 0))


# Online schedules (fuse_online_updates, device_replay): the reference's call per step on host batches, fused chunks
# on host batches, then with chunks gathered on the device: one call per step as its batch exists (pipelined), fused.
SCHEDULES = ((False, False), (True, False), (False, True), (True, True))


def online_rows(agents, size, seed_counts, steps, schedules=SCHEDULES):
    """Online benchmark runs: every agent and seed count, the schedules side by side."""
    return [dict(agent_name=a, size=size, seeds=s, fused=f, device_replay=d, steps=steps) for a in agents
            for s in seed_counts for f, d in schedules]  # fmt: skip


def settings(quick, accelerator=False):
    """The sizes and iteration counts of a quick run, a full CPU run, or a run on an accelerator (`gpu.sh`)."""
    if quick:
        return dict(
            sizes=('tiny',),
            update_agents=('QC', 'QC-RLPD'),  # One per agent class: compilation dominates a quick run.
            update_transitions=10_000,
            update_target_s=0.2,
            update_rounds=1,
            replay_sizes=('tiny',),
            matmul_n=256,
            matmul_reps=3,
            eval=[dict(size='tiny', num_envs=2, num_episodes=2, max_episode_steps=50)],
            online=online_rows(('QC',), 'tiny', (1,), steps=20, schedules=SCHEDULES[1:3]),
            online_startup=[],
            memory_transitions=10_000,
            seeds=dict(sizes=('tiny',), agents=('QC',), seed_counts=(1, 2), steps=2, num_transitions=10_000,
                       replay_transitions=10_000, replay_online_steps=10_000),
        )  # fmt: skip
    if accelerator:  # `benchmarks/gpu.sh`: the paper's size, what a GPU node runs, within minutes.
        return dict(
            sizes=('paper',), update_agents=('QC', 'QC-FQL', 'QAM', 'QAM-F'), update_transitions=100_000,
            update_target_s=2.0,
            update_rounds=1, replay_sizes=(), matmul_n=4096, matmul_reps=10, eval=[],
            online=online_rows(('QC', 'QC-FQL'), 'paper', (1,), steps=400)
            + online_rows(('QC', 'QC-FQL'), 'paper', (8,), steps=400, schedules=SCHEDULES[1:])
            + online_rows(('QC',), 'paper', (4,), 400, schedules=SCHEDULES[1:])
            + [dict(agent_name=a, size='paper', seeds=s, fused=False, steps=400, env_workers=w)
               for a, s, w in (('QC', 1, 1), ('QC-FQL', 8, 0))],
            online_startup=[dict(agent_name='QC', size='paper', seeds=s, env_workers=w) for s, w in STARTUP_SEEDS],
            memory_transitions=10_000,
            seeds=dict(sizes=('paper',), agents=('QC', 'QC-FQL'), seed_counts=(1, 4, 8, 16), num_transitions=100_000,
                       replay_transitions=10_000, replay_online_steps=10_000),
        )  # fmt: skip
    return dict(
        sizes=('small', 'paper'),
        update_agents=None,  # All of benchmarks.common.AGENTS.
        update_transitions=100_000,
        update_target_s=3.0,
        update_rounds=2,
        replay_sizes=('small', 'paper'),
        matmul_n=2048,
        matmul_reps=10,
        eval=[
            dict(size='small', num_envs=10, num_episodes=20),
            dict(size='paper', num_envs=10, num_episodes=10),
        ],
        online=(
            online_rows(('QC',), 'tiny', (1, 4), steps=600) + online_rows(('QC',), 'small', (1,), steps=300)
            + [dict(agent_name='QC', size='tiny', seeds=s, fused=True, steps=600, env_workers=w)
               for s, w in ((1, 1), (4, 0))]  # the other choice of --env_workers than the default
            + online_rows(('QC',), 'paper', (1,), steps=60)
        ),
        online_startup=[dict(agent_name='QC', size='small', seeds=s, env_workers=w) for s, w in STARTUP_SEEDS],
        memory_transitions=1_000_000,
        seeds=dict(sizes=('small', 'paper'), agents=('QC', 'QC-FQL'), seed_counts=(1, 2, 4, 8)),
    )


# The paper's QC run on cube-triple: 1M offline updates, 1M online steps, 50-episode evaluations every 100k steps of
# each phase and before the first (21), episodes of at most 1000 steps, 10 copies in lockstep.
PAPER_RUN = dict(offline_updates=1_000_000, online_steps=1_000_000, evaluations=21, episodes=50, episode_steps=1000,
                 eval_envs=10)  # fmt: skip


def paper_run_hours(online_row, offline_ups):
    """Hours of a paper run from measured rates: the offline updates at `offline_ups` (fused), the online steps at the
    row's steps/s, and the evaluations as an upper bound (every episode to its time limit: one environment step per
    copy and step, as the row's one-seed `env_ms`, and one batched policy call per H steps of the copies)."""
    run = PAPER_RUN
    eval_steps = run['evaluations'] * run['episodes'] * run['episode_steps']
    policy_calls = eval_steps / run['eval_envs'] / online_row['horizon']
    eval_s = eval_steps * online_row['env_ms'] / online_row['seeds'] / 1e3 + policy_calls * online_row[
        'policy_alone_ms'] / 1e3  # fmt: skip
    return (run['offline_updates'] / offline_ups + run['online_steps'] / online_row['steps_per_s'] + eval_s) / 3600


def best_rows(rows):
    """Per (agent, size, seeds, env workers flag), the fastest row over schedules and sampling."""
    best = {}
    for r in rows:
        key = (r['agent'], r['size'], r['seeds'], r['env_workers_flag'])
        if key not in best or r['steps_per_s'] > best[key]['steps_per_s']:
            best[key] = r
    return list(best.values())


def online_targets(results):
    """The online phase's targets: efficiency against the critical path on any machine; on a CPU the host time per
    step besides the environment and the update; on a GPU the rate, device-busy share and paper-run estimate of one
    seed, 8 seeds' rates and start-up."""
    rows, targets = results.get('online') or [], []
    fused = [r for r in rows if r['schedule'] == 'fused']
    if fused:
        targets.append(dict(
            target='online steps/s >= 0.8x the bound of its critical path (fused schedule)',
            met=min(r['efficiency'] for r in fused) >= 0.8,
            value={f'{r["agent"]} {r["size"]} S={r["seeds"]} {r["sampling"]}': round(r['efficiency'], 2)
                   for r in fused},
        ))  # fmt: skip
    tiny = [r for r in rows if r['size'] == 'tiny' and r['seeds'] == 1 and r['backend'] == 'cpu']
    if tiny:
        host = {f'{r["schedule"]}, {r["sampling"]} sampling': round(
            r['step_ms'] - r['env_ms'] - r['update_alone_ms'] - r['policy_alone_ms'] / r['horizon'], 3) for r in tiny}
        targets.append(dict(target='CPU, tiny networks: host ms per online step besides env and compute <= 0.2 '
                                   '(best schedule)', met=min(host.values()) <= 0.2, value=host))  # fmt: skip
    on_gpu = best_rows([r for r in rows if r['backend'] == 'gpu'])
    offline = [r['fused_ups'] for r in results.get('updates') or [] if r['agent'] == 'QC' and r['size'] == 'paper']
    for r in on_gpu:
        if r['agent'] == 'QC' and r['seeds'] == 1 and r['env_workers_flag'] == -1:
            label = f'({r["schedule"]}, {r["sampling"]} sampling)'
            targets.append(dict(target=f'GPU, QC paper size, one seed: online >= 300 steps/s {label}',
                                met=r['steps_per_s'] >= 300, value=round(r['steps_per_s'], 1)))
            targets.append(dict(target=f'GPU, QC paper size, one seed: device busy >= 80% {label}',
                                met=r['device_busy_est'] >= 0.8, value=round(r['device_busy_est'], 3)))
            if offline:
                hours = paper_run_hours(r, offline[0])
                targets.append(dict(target=f'GPU, QC paper run (1M + 1M, evaluations) estimate <= 1.9 h {label}',
                                    met=hours <= 1.9, value=round(hours, 2)))
    for agent, factor in (('QC-FQL', 5.0), ('QC', 1.8)):
        by_seeds = {r['seeds']: r for r in on_gpu if r['agent'] == agent and r['env_workers_flag'] == -1}
        if 1 in by_seeds and 8 in by_seeds:
            ratio = by_seeds[8]['seed_steps_per_s'] / by_seeds[1]['seed_steps_per_s']
            targets.append(dict(target=f'GPU, {agent}: 8 seeds >= {factor}x the seed-steps/s of one (best schedules)',
                                met=ratio >= factor, value=round(ratio, 2)))
    starts = {r['seeds']: r for r in results.get('online_startup') or []
              if r.get('env_workers_flag', -1) == -1 and 'first update s' in r}  # fmt: skip
    if 1 in starts and 8 in starts and results['machine']['backend'] == 'gpu':
        # 'first update' is the time from the start of setup to the end of the first update (every stage after the
        # imports, and the first update's own compile and run).
        ratio = starts[8]['first update s'] / starts[1]['first update s']
        targets.append(dict(target='GPU: start-up of 8 seeds <= 1.5x one seed', met=ratio <= 1.5,
                            value=round(ratio, 2)))  # fmt: skip
    return targets


def check_targets(results, matmul):
    """The issue's targets, each with met / not met and the measured values behind the verdict."""
    targets = []
    rows = results.get('updates') or []
    small = [r for r in rows if r['size'] == 'small']
    paper = [r for r in rows if r['size'] == 'paper']
    if small:
        worst = min(small, key=lambda r: r['fused_speedup'])
        targets.append(
            dict(
                target='fused offline loop >= 3x per-step loop (small size)',
                met=worst['fused_speedup'] >= 3.0,
                value={r['agent']: round(r['fused_speedup'], 3) for r in small},
                bound={r['agent']: round(r['per_step_ms'] / r['compute_ms'], 3) for r in small},
            )
        )
    if paper:
        worst = min(paper, key=lambda r: r['fused_speedup'])
        targets.append(
            dict(
                target=f'fused never slower than per-step (paper size; >= {PAPER_TOLERANCE} allows timing noise)',
                met=worst['fused_speedup'] >= PAPER_TOLERANCE,
                value={r['agent']: round(r['fused_speedup'], 3) for r in paper},
            )
        )
        for r in paper:
            if r['agent'] in ('QC', 'QC-FQL'):
                fraction = r['compute_flops_per_s'] / matmul
                dot_s, dot_rate = r.get('dot_seconds'), r.get('dot_flops_per_s')
                targets.append(
                    dict(
                        target=f'{r["agent"]} paper-size update >= 70% of the matmul rate',
                        met=fraction >= 0.7,
                        value=round(fraction, 3),
                        loop_fraction=round(r['fused_flops_per_s'] / matmul, 3),
                        dot_share_of_time=round(dot_s / (r['compute_ms'] / 1e3), 3) if dot_s else None,
                        dot_rate_fraction=round(dot_rate / matmul, 3) if dot_rate else None,
                    )
                )
    for r in results.get('eval') or []:
        if r['size'] == 'small':
            targets.append(
                dict(
                    target='batched evaluation >= 3x sequential episodes/s (small policy)',
                    met=r['speedup'] >= 3.0,
                    value=round(r['speedup'], 3),
                    bound=round(r['speedup_bound'], 3),
                )
            )
    mem = results.get('memory')
    if mem and 'bytes_ratio' in mem:
        targets.append(
            dict(
                target='compact dataset bytes/transition <= 0.6x duplicated',
                met=mem['bytes_ratio'] <= 0.6,
                value=round(mem['bytes_ratio'], 3),
                resident=round(mem['resident_ratio'], 3),
            )
        )
    targets.extend(online_targets(results))
    seeds = (results.get('seeds') or {}).get('updates') or []
    if seeds:
        several = [r for r in seeds if r['seeds'] > 1]
        on_gpu = results['machine']['backend'] == 'gpu'
        if several and not on_gpu:
            worst = min(several, key=lambda r: r['ratio'])
            targets.append(
                dict(
                    target=f'S seeds in one process >= {SEED_TARGET_CPU}x per seed of S sequential runs (CPU)',
                    met=worst['ratio'] >= SEED_TARGET_CPU,
                    value={f'{r["agent"]} {r["size"]} S={r["seeds"]}': round(r['ratio'], 3) for r in several},
                )
            )
        paper = {r['seeds']: r for r in seeds if r['agent'] == 'QC-FQL' and r['size'] == 'paper'}
        target = f'QC-FQL paper size: S=8 seed-updates/s >= {SEED_TARGET_GPU}x S=1 (GPU)'
        if on_gpu and 8 in paper and 1 in paper:
            gain = paper[8]['seed_ups'] / paper[1]['seed_ups']
            targets.append(dict(target=target, met=gain >= SEED_TARGET_GPU, value=round(gain, 3)))
        else:
            targets.append(dict(target=target, met=None, value='unmeasured (no GPU in this run)'))
    return targets


def print_tables(results, matmul):
    """Prints one table per section that ran."""
    from benchmarks.common import format_table

    if results.get('updates'):
        rows = [
            dict(
                r,
                gflop=r['flops'] / 1e9,
                frac=r['compute_flops_per_s'] / matmul,
                dot_frac=(r['dot_flops_per_s'] / matmul) if r.get('dot_flops_per_s') else None,
                dot_time=(r['dot_seconds'] * 1e3 / r['compute_ms']) if r.get('dot_seconds') else None,
            )
            for r in results['updates']
        ]
        print('\nUpdates (batch, H per agent; ups = updates/s; frac = FLOP/s of the compiled update / matmul rate)')
        print(
            format_table(
                rows,
                [
                    ('agent', 'agent', None),
                    ('size', 'size', None),
                    ('hidden', 'hidden', None),
                    ('per_step_ups', 'per-step ups', '{:.2f}'),
                    ('fused_ups', 'fused ups', '{:.2f}'),
                    ('fused_speedup', 'ratio', '{:.2f}'),
                    ('steps_per_round', 'K', None),
                    ('sample_ms', 'sample ms', '{:.2f}'),
                    ('compute_ms', 'compute ms', '{:.1f}'),
                    ('gflop', 'GFLOP/upd', '{:.2f}'),
                    ('frac', 'frac', '{:.2f}'),
                    ('dot_frac', 'dot rate frac', '{:.2f}'),
                    ('dot_time', 'dot time share', '{:.2f}'),
                    ('first_update_s', 'first update s', '{:.1f}'),
                    ('update_compiles', 'compiles', None),
                ],
            )
        )
    if results.get('eval'):
        print('\nEvaluation on cube-single (episodes/s)')
        print(
            format_table(
                results['eval'],
                [
                    ('agent', 'agent', None),
                    ('size', 'size', None),
                    ('num_envs', 'copies', None),
                    ('episodes', 'episodes', None),
                    ('sequential_eps', 'sequential', '{:.2f}'),
                    ('batched_eps', 'batched', '{:.2f}'),
                    ('speedup', 'ratio', '{:.2f}'),
                    ('speedup_bound', 'env-only bound', '{:.2f}'),
                    ('env_steps_per_s', 'env steps/s', '{:.0f}'),
                    ('sample_ms', 'sample ms', '{:.2f}'),
                ],
            )
        )
    if results.get('online'):
        print('\nOnline loop (main.py; ms per online step: measured parts, then the parts alone and the bound)')
        print(
            format_table(
                results['online'],
                [
                    ('agent', 'agent', None),
                    ('size', 'size', None),
                    ('seeds', 'S', None),
                    ('schedule', 'schedule', None),
                    ('sampling', 'sampling', None),
                    ('env_workers', 'env workers', None),
                    ('steps_per_s', 'steps/s', '{:.1f}'),
                    ('seed_steps_per_s', 'seed-steps/s', '{:.1f}'),
                    ('step_ms', 'step', '{:.2f}'),
                    ('env_ms', 'env', '{:.2f}'),
                    ('policy_ms', 'policy+wait', '{:.2f}'),
                    ('sample_ms', 'sampling', '{:.2f}'),
                    ('dispatch_ms', 'dispatch', '{:.2f}'),
                    ('other_ms', 'other', '{:.2f}'),
                    ('update_alone_ms', 'update alone', '{:.2f}'),
                    ('policy_alone_ms', 'policy alone', '{:.2f}'),
                    ('bound_ms', 'bound', '{:.2f}'),
                    ('efficiency', 'bound/step', '{:.2f}'),
                    ('device_busy_est', 'device busy', '{:.0%}'),
                ],
            )
        )
    if results.get('online_startup'):
        print('\nStart-up of a run (seconds per stage)')
        print(
            format_table(
                results['online_startup'],
                [
                    ('agent', 'agent', None),
                    ('size', 'size', None),
                    ('seeds', 'S', None),
                    ('env_workers', 'env workers', None),
                    ('imports s', 'imports', '{:.1f}'),
                    ('envs and data s', 'envs and data', '{:.1f}'),
                    ('agent s', 'agent', '{:.1f}'),
                    ('worker envs s', 'worker envs', '{:.1f}'),
                    ('first update s', 'first update (from setup)', '{:.1f}'),
                ],
            )
        )
    mem = results.get('memory')
    if mem:
        rows = [mem[k] for k in ('duplicated', 'compact') if k in mem and 'error' not in mem[k]]
        for r in rows:
            r['peak_mb'] = (r['peak_rss'] - r['baseline_rss']) / 2**20
            r['resident_mb'] = (r['resident_rss'] - r['baseline_rss']) / 2**20
        print('\nDataset memory (MiB above the baseline of the child process)')
        print(
            format_table(
                rows,
                [
                    ('layout', 'layout', None),
                    ('transitions', 'transitions', None),
                    ('bytes_per_transition', 'B/transition', '{:.1f}'),
                    ('resident_mb', 'resident MiB', '{:.1f}'),
                    ('peak_mb', 'peak MiB', '{:.1f}'),
                    ('sample_ms', 'sample ms', '{:.3f}'),
                ],
            )
        )


def print_seed_tables(seeds):
    """The `seeds` section's two tables."""
    from benchmarks.common import format_table

    print('\nSeeds in one process (seed-updates/s; ratio = per seed against S sequential single-seed runs)')
    print(
        format_table(
            seeds['updates'],
            [
                ('agent', 'agent', None),
                ('size', 'size', None),
                ('seeds', 'S', None),
                ('sequential_ups', 'sequential seed-ups', '{:.2f}'),
                ('seeds_per_vmap', 'seeds per vmap', None),
                ('seed_ups', 'S-seed seed-ups', '{:.2f}'),
                ('ratio', 'ratio', '{:.2f}'),
                ('vmap_seed_ups', 'all-vmap seed-ups', '{:.2f}'),
                ('vmap_ratio', 'all-vmap ratio', '{:.2f}'),
                ('first_seed_ups_call_s', 'first call s', '{:.1f}'),
                ('state_mb', 'state MiB', '{:.1f}'),
                ('batch_mb', 'batch MiB', '{:.1f}'),
                ('peak_device_bytes', 'peak device B', None),
            ],
        )
    )
    print('\nReplay memory of S seeds (main.py: buffers start with the offline data; MiB)')
    print(
        format_table(
            seeds['replay'],
            [
                ('seeds', 'S', None),
                ('transitions', 'dataset', None),
                ('shared_start_mb', 'shared, start', '{:.0f}'),
                ('shared_end_mb', 'shared, after online', '{:.0f}'),
                ('copies_mb', 'one copy per seed', '{:.0f}'),
            ],
        )
    )


def main(argv=None):
    """Command-line entry point; returns the results dict."""
    parser = argparse.ArgumentParser(description='Q-chunking benchmark suite.')
    parser.add_argument('--quick', action='store_true', help='tiny sizes and few iterations (CI smoke run)')
    parser.add_argument('--out', default='benchmarks/results.json', help='where to write the JSON results')
    parser.add_argument('--only', default=','.join(SECTIONS), help=f'comma-separated sections of {SECTIONS}')
    parser.add_argument('--agents', default='', help="the updates section's agents, comma-separated names of "
                        "benchmarks.common.AGENTS (default: the run's, all of them on a CPU)")  # fmt: skip
    parser.add_argument('--sizes', default='', help="the updates section's sizes, comma-separated (default: the "
                        "run's)")  # fmt: skip
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.only.split(',') if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f'unknown sections {unknown}; choose from {SECTIONS}')
    from benchmarks.common import AGENTS, SIZES

    agents = [a.strip() for a in args.agents.split(',') if a.strip()]
    sizes = [s.strip() for s in args.sizes.split(',') if s.strip()]
    if sorted(set(agents) - set(AGENTS)) or sorted(set(sizes) - set(SIZES)):
        parser.error(f'--agents are of {list(AGENTS)}, --sizes of {list(SIZES)}')

    os.environ.setdefault('JAX_PLATFORMS', 'cpu')
    import jax

    from benchmarks import common

    cfg = settings(args.quick, accelerator=jax.default_backend() != 'cpu')
    cfg.update({k: tuple(v) for k, v in (('update_agents', agents), ('sizes', sizes)) if v})
    started = time.perf_counter()
    results = dict(
        command=' '.join(['python -m benchmarks.run', *(argv if argv is not None else sys.argv[1:])]),
        quick=args.quick,
        machine=common.machine_info(),
        load_before=common.load_average(),
        section_load={},
        section_s={},
    )

    def log(msg):
        print(msg, flush=True)

    matmul_runs = [common.matmul_rate(cfg['matmul_n'], cfg['matmul_reps'])]
    log(f'matmul {cfg["matmul_n"]}^2 float32: {matmul_runs[0]["flops_per_s"] / 1e9:.1f} GFLOP/s')
    for section in sections:
        start = time.perf_counter()
        load = common.load_average()
        if section == 'updates':
            from benchmarks import updates

            results['updates'] = updates.run(
                cfg['sizes'],
                agents=cfg['update_agents'],
                num_transitions=cfg['update_transitions'],
                target_s=cfg['update_target_s'],
                rounds=cfg['update_rounds'],
                replay_sizes=cfg['replay_sizes'],
                matmul_n=cfg['matmul_n'],
                log=log,
            )
            matmul_runs.append(common.matmul_rate(cfg['matmul_n'], cfg['matmul_reps']))
        elif section == 'eval':
            from benchmarks import eval_bench

            results['eval'] = [eval_bench.run(log=log, **kw) for kw in cfg['eval']]
        elif section == 'online':
            from benchmarks import online

            results['online'] = [online.run(log=log, **kw) for kw in cfg['online']]
            results['online_startup'] = [online.startup(log=log, **kw) for kw in cfg['online_startup']]
        elif section == 'memory':
            from benchmarks import memory

            results['memory'] = memory.run(cfg['memory_transitions'], log=log)
        elif section == 'seeds':
            from benchmarks import seeds

            results['seeds'] = seeds.run(log=log, **cfg['seeds'])
        results['section_s'][section] = time.perf_counter() - start
        results['section_load'][section] = [load, common.load_average()]

    # The machine's rate: the best of all measurements (before, during and after the update benchmarks); other load
    # on a shared machine only ever lowers it.
    results['matmul'] = matmul_runs
    local = [r['matmul_local_flops_per_s'] for r in results.get('updates') or []]
    matmul = max([m['flops_per_s'] for m in matmul_runs] + local)
    results['matmul_flops_per_s'] = matmul
    results['targets'] = check_targets(results, matmul)
    results['load_after'] = common.load_average()
    results['total_s'] = time.perf_counter() - started

    print(f'\nMatmul rate: {matmul / 1e9:.1f} GFLOP/s ({cfg["matmul_n"]}x{cfg["matmul_n"]} float32, best run)')
    print_tables(results, matmul)
    if results.get('seeds'):
        print_seed_tables(results['seeds'])
    if results['targets']:
        print('\nTargets')
        for t in results['targets']:
            verdict = 'unmeasured' if t['met'] is None else ('met' if t['met'] else 'NOT met')
            print(f'  [{verdict}] {t["target"]}: {t["value"]}')
    print(
        f'\nTotal {results["total_s"]:.0f} s; 1-min load average before {results["load_before"]}, '
        f'after {results["load_after"]}'
    )

    out_dir = os.path.dirname(args.out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(results, f, indent=1, default=float)
    print(f'Wrote {args.out}')
    return results


if __name__ == '__main__':
    main()
