"""Does it reproduce the paper? One published point checked on one GPU node in about twenty minutes.

    bash scripts/paper_check.sh                       # GPU node: QC paper, cube-double task1, 100k offline steps
    bash scripts/paper_check.sh --paper=qam           # the QAM paper's point: QAM and QAM-F there
    bash scripts/paper_check.sh --budget_minutes=30   # more seeds of the second method, or a later point
    bash scripts/paper_check.sh --tiny                # CPU: the whole chain on a tiny dataset in about a minute

What it runs: OGBench's cube-double-play-v0 generated with OGBench's own oracles if missing (`envs.generate_ogbench`
on all cores), then, through the sweep machinery (`sweep.py launch`, several seeds in one process), the paper's two
methods (`--paper=qc`: QC-FQL with 8 seeds, then QC; `--paper=qam`: QAM with 8 seeds, then QAM-F, with the QAM
protocol's settings) with as many seeds as the budget allows, offline only, each seed evaluated on 50 episodes at the
end; then `sweep.py table` (our success next to the published one at the same step, `!` where the 95% intervals do
not overlap; for the QAM paper, which released its 12 seeds, a permutation p-value of ours against them) and the
learning-curve plot with the published curve dashed.

The budget is spent by a plan made before anything starts (and printed): data generation if the data is missing,
then the first method, then the second, each estimated from the rates measured on an H200 (`benchmarks/RESULTS.md`;
QAM's are estimated from its CPU cost relative to QC-FQL until a GPU measures them); steps are the largest multiple
of the published spacing that fits 8 seeds of the first method (at least 100k), then the second gets the seeds that
fit in what is left. A slower GPU overruns the plan; the runs checkpoint, so launching again continues them.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

from analysis import paper
from training.paper_settings import domain_flags
from utils.errors import UserError, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_NAME = 'cube-double-play-singletask-task1-v0'
DATASET = 'cube-double-play-v0'
MIN_STEPS = 100_000  # The early point both papers publish (QC: every 100k steps; QAM: every 50k).
# What each paper's check runs: (first method, which gets its seeds first; second method).
CHECK_METHODS = {'qc': ('QC-FQL', 'QC'), 'qam': ('QAM', 'QAM-F')}
# QAM's fused update rate relative to QC-FQL's on this project's 2-core CPU at paper size (benchmarks/RESULTS.md,
# "QAM updates/s": 2.93 against 15.81): until a GPU measures QAM, its planned GPU rates are QC-FQL's H200 rates
# times this.
QAM_RATE_RATIO = 0.19


@dataclasses.dataclass(frozen=True)
class Scale:
    """The sizes of a check and the rates its plan assumes."""

    data_episodes: int  # Training episodes generated (plus a tenth for validation) when the data is missing.
    episode_length: int
    gen_steps_per_core_s: float  # Data-collection steps per second per core.
    max_seeds: dict  # Seeds per method at most.
    rates: dict  # {method: {seeds: seed-updates/s}}, interpolated linearly in between.
    startup_s: float  # Imports, data, compiles per process.
    eval_s: float  # Evaluation of one seed (50 episodes), per process and seed.
    min_steps: int
    eval_episodes: int
    flags: dict  # Extra flags of every run (the tiny networks).
    method_flags: dict  # Extra flags of one method's runs (keys only its agent has).
    rates_source: str  # Where the rates come from, for the printed plan.


def scaled(rates, ratio):
    return {seeds: rate * ratio for seeds, rate in rates.items()}


# Offline fused updates on one H200 at paper size (benchmarks/gpu/seeds_h200.json, updates_h200.json).
H200_RATES = {'QC-FQL': {1: 644.0, 8: 1676.0}, 'QC': {1: 411.0, 8: 503.0}}
PAPER = Scale(
    data_episodes=1000, episode_length=1001, gen_steps_per_core_s=400.0,
    max_seeds={'QC-FQL': 8, 'QC': 8, 'QAM': 8, 'QAM-F': 8},
    rates={**H200_RATES, 'QAM': scaled(H200_RATES['QC-FQL'], QAM_RATE_RATIO),
           'QAM-F': scaled(H200_RATES['QC-FQL'], QAM_RATE_RATIO)},
    startup_s=90.0, eval_s=10.0, min_steps=MIN_STEPS, eval_episodes=50, flags={}, method_flags={},
    rates_source='H200 rates, benchmarks/RESULTS.md; QAM: QC-FQL\'s times its CPU rate ratio to QC-FQL, '
                 f'{QAM_RATE_RATIO:g}, no GPU has measured it',
)  # fmt: skip
TINY = Scale(
    data_episodes=3, episode_length=60, gen_steps_per_core_s=400.0,
    max_seeds={'QC-FQL': 2, 'QC': 1, 'QAM': 2, 'QAM-F': 1},
    rates={'QC-FQL': {1: 100.0, 8: 400.0}, 'QC': {1: 50.0, 8: 200.0}, 'QAM': {1: 50.0, 8: 200.0},
           'QAM-F': {1: 50.0, 8: 200.0}},
    startup_s=20.0, eval_s=2.0, min_steps=200, eval_episodes=1,
    flags={'agent.actor_hidden_dims': [16, 16], 'agent.value_hidden_dims': [16, 16], 'agent.batch_size': 8,
           'agent.flow_steps': 2, 'log_interval': 100},
    method_flags={'QC': {'agent.actor_num_samples': 2}, 'QAM': {'agent.num_qs': 2}, 'QAM-F': {'agent.num_qs': 2}},
    rates_source='rough CPU rates of the tiny networks',
)  # fmt: skip


def rate(scale, method, seeds):
    """Seed-updates/s of `seeds` seeds of `method` in one process."""
    table = scale.rates[method]
    (s0, r0), (s1, r1) = sorted(table.items())
    return r0 + (r1 - r0) * (min(seeds, s1) - s0) / (s1 - s0)


def process_seconds(scale, method, seeds, steps):
    """Estimated wall time of one process training `seeds` seeds of `method` for `steps` steps."""
    return scale.startup_s + seeds * steps / rate(scale, method, seeds) + seeds * scale.eval_s


def generation_seconds(scale, cores):
    total = scale.data_episodes + max(1, scale.data_episodes // 10)
    return total * scale.episode_length / (scale.gen_steps_per_core_s * cores)


@dataclasses.dataclass(frozen=True)
class Plan:
    generate: bool
    steps: int
    seeds: dict  # {method: seeds}, the first method first; 0 seeds: not run.
    seconds: dict  # {part: estimated seconds}
    notes: tuple = ()  # Lines the plan adds about what it runs.

    def lines(self, budget_s, scale):
        eval_episodes = scale.eval_episodes
        parts = [f'plan (times estimated from {scale.rates_source}):']
        if self.generate:
            parts.append(f'  generate {DATASET} on all cores: {self.seconds["data"] / 60:.1f} min')
        used = self.seconds['data']
        for method, seeds in self.seeds.items():
            if seeds:
                used += self.seconds[method]
                parts.append(f'  {method}: {seeds} seed{"s" * (seeds > 1)} in one process, {self.steps:,} offline '
                             f'steps, {eval_episodes} evaluation episodes per seed at the end: '
                             f'{self.seconds[method] / 60:.1f} min')  # fmt: skip
            else:
                parts.append(f'  {method}: not run (one seed takes {self.seconds[method] / 60:.1f} min, '
                             f'{(budget_s - used) / 60:.1f} min are left)')  # fmt: skip
        parts.append(f'  total {used / 60:.1f} of {budget_s / 60:g} min')
        return parts + [f'  note: {line}' for line in self.notes]


def make_plan(scale, budget_s, generate, cores, name='qc'):
    """The steps and seeds that fit `budget_s` for the check of paper `name`: the first method's seeds first (its 8
    seeds are the check), at the largest multiple of the paper's point spacing that fits (at least `min_steps`),
    then the second method's seeds in the rest."""
    seconds = {'data': generation_seconds(scale, cores) if generate else 0.0}
    left = budget_s - seconds['data']
    first, second = CHECK_METHODS[name]
    spacing = paper.protocol(name).spacing
    steps = scale.min_steps
    fql_seeds = next((s for s in range(scale.max_seeds[first], 0, -1)
                      if process_seconds(scale, first, s, steps) <= left), 0)  # fmt: skip
    if fql_seeds == 0:
        need = (seconds['data'] + process_seconds(scale, first, 1, steps)) / 60
        raise UserError(f'--budget_minutes={budget_s / 60:g} cannot fit one seed of {first} for {steps:,} steps '
                        f'(about {need:.0f} minutes with the data); give a larger budget')  # fmt: skip
    if fql_seeds == scale.max_seeds[first] and scale.min_steps == MIN_STEPS:
        while process_seconds(scale, first, fql_seeds, steps + spacing) <= left / 2:
            steps += spacing  # More steps only while the second method keeps half of the time.
    seconds[first] = process_seconds(scale, first, fql_seeds, steps)
    left -= seconds[first]
    qc_seeds = next((s for s in range(scale.max_seeds[second], 0, -1)
                     if process_seconds(scale, second, s, steps) <= left), 0)  # fmt: skip
    seconds[second] = process_seconds(scale, second, max(qc_seeds, 1), steps)
    notes = ()
    if domain_flags(first, ENV_NAME, name) == domain_flags(second, ENV_NAME, name):
        notes = (f"the {paper.protocol(name).title}'s {second} on this domain is {first}'s setting (the same "
                 f'per-domain values), so its seeds are more seeds of that setting, faced with the published {second} '
                 'seeds',)  # fmt: skip
    return Plan(generate=generate, steps=steps, seeds={first: fql_seeds, second: qc_seeds}, seconds=seconds,
                notes=notes)  # fmt: skip


def spec(method, seeds, steps, scale, data_dir, name='qc'):
    """The SPEC of one method's process (all its seeds together) in the protocol of paper `name`."""
    flags = dict(dataset_dir=data_dir, online_steps=0, eval_interval=0, eval_episodes=scale.eval_episodes,
                 **scale.flags)  # fmt: skip
    methods = [{'name': method, 'preset': method, 'flags': scale.method_flags.get(method, {})}]
    return dict(protocol=name, methods=methods, envs=[ENV_NAME], seeds=seeds, seeds_per_process=seeds, flags=flags,
                driver_flags={'main.py': {'offline_steps': steps}})  # fmt: skip


def has_gpu():
    """Whether JAX sees an accelerator, asked in a child process: JAX in this one would take the GPU's memory
    (preallocation) from the training processes it launches."""
    probe = [sys.executable, '-c', 'import jax; print(jax.default_backend())']
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE='false')
    out = subprocess.run(probe, env=env, capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip().splitlines()[-1:] != ['cpu']


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--budget_minutes', type=float, default=20.0, help='wall time to plan for (default 20)')
    p.add_argument('--paper', choices=tuple(CHECK_METHODS), default='qc',
                   help="whose point: qc (QC-FQL and QC, the QC paper's protocol; default) or qam (QAM and QAM-F, "
                   "the QAM paper's protocol)")  # fmt: skip
    p.add_argument('--out', default=None, help='sweep folder (default exp/paper_check[_qam][_tiny])')
    p.add_argument('--data_dir', default=None, help=f'where {DATASET}.npz is or is generated (default '
                   '~/.ogbench/data; <out>/data with --tiny)')  # fmt: skip
    p.add_argument('--tiny', action='store_true', help='CPU smoke run: tiny dataset, networks and steps')
    args = p.parse_args(argv)
    scale = TINY if args.tiny else PAPER
    folder = 'paper_check' + ('_qam' if args.paper == 'qam' else '') + ('_tiny' if args.tiny else '')
    out = os.path.abspath(args.out or os.path.join(ROOT, 'exp', folder))
    default_data = os.path.join(out, 'data') if args.tiny else '~/.ogbench/data'
    data_dir = os.path.abspath(os.path.expanduser(args.data_dir or default_data))
    if args.budget_minutes <= 0:
        raise UserError(f'--budget_minutes must be positive, got {args.budget_minutes:g}')
    if not args.tiny and not has_gpu():
        raise UserError('no GPU is visible to JAX: the check is planned for one GPU node (its time plan uses GPU '
                        'rates); on a CPU run it with --tiny')  # fmt: skip
    cores = os.cpu_count() or 1
    generate = not os.path.exists(os.path.join(data_dir, f'{DATASET}.npz'))
    plan = make_plan(scale, args.budget_minutes * 60, generate, cores, args.paper)
    print('\n'.join(plan.lines(args.budget_minutes * 60, scale)), flush=True)

    start = time.time()
    if generate:
        gen = [sys.executable, '-m', 'envs.generate_ogbench', f'--env_name={DATASET}', f'--save_dir={data_dir}',
               f'--num_episodes={scale.data_episodes}', f'--episode_length={scale.episode_length}',
               f'--workers={cores}']  # fmt: skip
        subprocess.run(gen, cwd=ROOT, check=True)
        print(f'data: {time.time() - start:.0f} s', flush=True)

    from sweeps.launch import launch
    from sweeps.report import plot_tasks, table_markdown

    sweep_dir = os.path.join(out, 'sweep')
    os.makedirs(out, exist_ok=True)
    for method, seeds in plan.seeds.items():
        if not seeds:
            continue
        path = os.path.join(out, f'{method}.json')
        with open(path, 'w') as f:
            json.dump(spec(method, seeds, plan.steps, scale, data_dir, args.paper), f, indent=1)
        began = time.time()
        launch(path, sweep_dir, 'local', max_parallel=1)
        print(f'{method}: {time.time() - began:.0f} s', flush=True)
    text = table_markdown(sweep_dir)
    with open(os.path.join(out, 'results.md'), 'w') as f:
        f.write(text + '\n')
    plots = plot_tasks(sweep_dir, os.path.join(out, 'plots'))
    print(text)
    for path in plots or []:
        print(f'plot: {path}')
    print(f'paper check: {(time.time() - start) / 60:.1f} min (budget {args.budget_minutes:g})')


if __name__ == '__main__':
    run_cli(main)
