"""Does it reproduce the paper? One published point checked on one GPU node in about twenty minutes.

    bash scripts/paper_check.sh                       # GPU node: cube-double task1, 100k offline steps
    bash scripts/paper_check.sh --budget_minutes=30   # more seeds of QC, or the 200k point
    bash scripts/paper_check.sh --tiny                # CPU: the whole chain on a tiny dataset in about a minute

What it runs: OGBench's cube-double-play-v0 generated with OGBench's own oracles if missing (`envs.generate_ogbench`
on all cores), then, through the sweep machinery (`sweep.py launch`, several seeds in one process), the paper's QC-FQL
preset with 8 seeds and its QC preset with as many seeds as the budget allows, offline only, each seed evaluated on
50 episodes at the end; then `sweep.py table` (our success next to the published one at the same step, `!` where
the 95% intervals do not overlap) and the learning-curve plot with the published curve dashed.

The budget is spent by a plan made before anything starts (and printed): data generation if the data is missing,
then QC-FQL, then QC, each estimated from the rates measured on an H200 (`benchmarks/RESULTS.md`); steps are the
largest multiple of the published 100k spacing that fits 8 QC-FQL seeds (at least 100k), then QC gets the seeds
that fit in what is left. A slower GPU overruns the plan; the runs checkpoint, so launching again continues them.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

from utils.errors import UserError, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_NAME = 'cube-double-play-singletask-task1-v0'
DATASET = 'cube-double-play-v0'
POINT_SPACING = 100_000  # The published curves have a point every 100k steps.


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
    rates_source: str  # Where the rates come from, for the printed plan.


PAPER = Scale(
    data_episodes=1000, episode_length=1001, gen_steps_per_core_s=400.0, max_seeds={'QC-FQL': 8, 'QC': 8},
    # Offline fused updates on one H200 at paper size (benchmarks/gpu/seeds_h200.json, updates_h200.json).
    rates={'QC-FQL': {1: 644.0, 8: 1676.0}, 'QC': {1: 411.0, 8: 503.0}},
    startup_s=90.0, eval_s=10.0, min_steps=POINT_SPACING, eval_episodes=50, flags={},
    rates_source='H200 rates, benchmarks/RESULTS.md',
)  # fmt: skip
TINY = Scale(
    data_episodes=3, episode_length=60, gen_steps_per_core_s=400.0, max_seeds={'QC-FQL': 2, 'QC': 1},
    rates={'QC-FQL': {1: 100.0, 8: 400.0}, 'QC': {1: 50.0, 8: 200.0}}, startup_s=20.0, eval_s=2.0, min_steps=200,
    eval_episodes=1,
    flags={'agent.actor_hidden_dims': [16, 16], 'agent.value_hidden_dims': [16, 16], 'agent.batch_size': 8,
           'agent.flow_steps': 2, 'agent.actor_num_samples': 2, 'log_interval': 100},
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
    seeds: dict  # {method: seeds}, QC-FQL first; 0 seeds: not run.
    seconds: dict  # {part: estimated seconds}

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
        return parts


def make_plan(scale, budget_s, generate, cores):
    """The steps and seeds that fit `budget_s`: QC-FQL's seeds first (its 8 seeds are the check), at the largest
    multiple of the point spacing that fits (at least `min_steps`), then QC's seeds in the rest."""
    seconds = {'data': generation_seconds(scale, cores) if generate else 0.0}
    left = budget_s - seconds['data']
    first, second = 'QC-FQL', 'QC'
    steps = scale.min_steps
    fql_seeds = next((s for s in range(scale.max_seeds[first], 0, -1)
                      if process_seconds(scale, first, s, steps) <= left), 0)  # fmt: skip
    if fql_seeds == 0:
        need = (seconds['data'] + process_seconds(scale, first, 1, steps)) / 60
        raise UserError(f'--budget_minutes={budget_s / 60:g} cannot fit one seed of {first} for {steps:,} steps '
                        f'(about {need:.0f} minutes with the data); give a larger budget')  # fmt: skip
    if fql_seeds == scale.max_seeds[first] and scale.min_steps == POINT_SPACING:
        while process_seconds(scale, first, fql_seeds, steps + POINT_SPACING) <= left / 2:
            steps += POINT_SPACING  # More steps only while QC keeps half of the time.
    seconds[first] = process_seconds(scale, first, fql_seeds, steps)
    left -= seconds[first]
    qc_seeds = next((s for s in range(scale.max_seeds[second], 0, -1)
                     if process_seconds(scale, second, s, steps) <= left), 0)  # fmt: skip
    seconds[second] = process_seconds(scale, second, max(qc_seeds, 1), steps)
    return Plan(generate=generate, steps=steps, seeds={first: fql_seeds, second: qc_seeds}, seconds=seconds)


def spec(method, seeds, steps, scale, data_dir):
    """The SPEC of one method's process (all its seeds together)."""
    flags = dict(dataset_dir=data_dir, online_steps=0, eval_interval=0, eval_episodes=scale.eval_episodes,
                 **scale.flags)  # fmt: skip
    return dict(methods=[method], envs=[ENV_NAME], seeds=seeds, seeds_per_process=seeds, flags=flags,
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
    p.add_argument('--out', default=None, help='sweep folder (default exp/paper_check, exp/paper_check_tiny)')
    p.add_argument('--data_dir', default=None, help=f'where {DATASET}.npz is or is generated (default '
                   '~/.ogbench/data; <out>/data with --tiny)')  # fmt: skip
    p.add_argument('--tiny', action='store_true', help='CPU smoke run: tiny dataset, networks and steps')
    args = p.parse_args(argv)
    scale = TINY if args.tiny else PAPER
    out = os.path.abspath(args.out or os.path.join(ROOT, 'exp', 'paper_check_tiny' if args.tiny else 'paper_check'))
    default_data = os.path.join(out, 'data') if args.tiny else '~/.ogbench/data'
    data_dir = os.path.abspath(os.path.expanduser(args.data_dir or default_data))
    if args.budget_minutes <= 0:
        raise UserError(f'--budget_minutes must be positive, got {args.budget_minutes:g}')
    if not args.tiny and not has_gpu():
        raise UserError('no GPU is visible to JAX: the check is planned for one GPU node (its time plan uses GPU '
                        'rates); on a CPU run it with --tiny')  # fmt: skip
    cores = os.cpu_count() or 1
    generate = not os.path.exists(os.path.join(data_dir, f'{DATASET}.npz'))
    plan = make_plan(scale, args.budget_minutes * 60, generate, cores)
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
            json.dump(spec(method, seeds, plan.steps, scale, data_dir), f, indent=1)
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
