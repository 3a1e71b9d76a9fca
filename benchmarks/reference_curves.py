"""Learning curves of this project against the reference implementation (github ColinQiyangLi/qc), run side by side
on the same generated data with the same flags: several seeds each, compared at every evaluation step and by the
area under the curve, with bootstrap intervals and a permutation test.

    python -m benchmarks.reference_curves --reference=/path/to/qc            # 12 seeds of each, then the table
    python -m benchmarks.reference_curves --reference=/path/to/qc --seeds=4 --online_steps=5000
    python -m benchmarks.reference_curves --report_only                      # the table of the runs on disk
    python -m benchmarks.reference_curves --preset=qam --reference=/path/to/qam --seeds=8 --offline_steps=5000 \
        --online_steps=5000 --work_dir=/tmp/qam_reference_curves              # QAM, offline then online

`--reference` is a checkout of the reference (bring it with the search tool's fetch; never part of this project).
Runs go to `--work_dir`, one folder per code and seed; a run whose `eval.csv` reaches the last step is kept, so an
interrupted comparison continues where it stopped. Seeds are interleaved (ours 0, reference 0, ours 1, ...) so a
comparison cut short still holds as many seeds of each. `--jobs` runs at once, each pinned to its own CPU core.
Where the folders of an earlier comparison are gone but its JSON is kept (it holds every seed's values), more seeds
are added with `--first_seed=N --earlier=<its JSON>`: seeds N.. are run, and the earlier seeds 0..N-1 are put first.

The data is OGBench's cube-single play data made by `envs.generate_ogbench` (60 episodes unless it is already in
`--data_dir`); the reference finds it through a private HOME (`~/.ogbench/data` links to it), so it downloads
nothing. The reference imports robomimic (whose PyPI package needs mujoco_py) and calls wandb with settings the
installed wandb refuses, so it runs with two stub modules first on its PYTHONPATH (written here); neither changes
what it computes: robomimic is unused for OGBench tasks and wandb only logs.
"""

import argparse
import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from analysis.stats import bootstrap_ci, permutation_p
from benchmarks.common import machine_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASET = 'cube-single-play-v0'
DATA_EPISODES = 60

# Flags both codes accept, per comparison: (driver script, flags). The steps and evaluation settings come from the
# command line.
PRESETS = {
    'qc-rlpd': ('main_online.py', [
        '--env_name=cube-single-play-singletask-task1-v0', '--agent=agents/acrlpd.py', '--agent.bc_alpha=0.01',
        '--horizon_length=5', '--agent.actor_hidden_dims=(128,128)', '--agent.value_hidden_dims=(128,128)',
        '--agent.batch_size=128',
    ]),
    # QAM (github ColinQiyangLi/qam), offline then online; the task of issue 45's command.
    'qam': ('main.py', [
        # action_chunking is passed: their get_config defaults it to False, every command of theirs sets True.
        '--env_name=cube-single-play-singletask-task2-v0', '--agent=agents/qam.py', '--horizon_length=5',
        '--agent.action_chunking=True',
        '--agent.actor_hidden_dims=(128,128)', '--agent.value_hidden_dims=(128,128)', '--agent.batch_size=128',
    ]),
    # The same on task1 with their README's QAM temperature (inv_temp=3), which learns within 10k online steps.
    'qam-task1': ('main.py', [
        '--env_name=cube-single-play-singletask-task1-v0', '--agent=agents/qam.py', '--horizon_length=5',
        '--agent.action_chunking=True', '--agent.inv_temp=3.0',
        '--agent.actor_hidden_dims=(128,128)', '--agent.value_hidden_dims=(128,128)', '--agent.batch_size=128',
    ]),
    # FEdit (their agents/fedit.py) on task1 with reproduce.py's cube-double edit_scale.
    'fedit': ('main.py', [
        '--env_name=cube-single-play-singletask-task1-v0', '--agent=agents/fedit.py', '--horizon_length=5',
        '--agent.action_chunking=True', '--agent.edit_scale=0.2',
        '--agent.actor_hidden_dims=(128,128)', '--agent.value_hidden_dims=(128,128)', '--agent.batch_size=128',
    ]),
    # QSM (their agents/dcgql.py) on task1 with reproduce.py's cube-double values.
    'qsm': ('main.py', [
        '--env_name=cube-single-play-singletask-task1-v0', '--agent=agents/dcgql.py', '--horizon_length=5',
        '--agent.action_chunking=True', '--agent.actor_loss_type=qsm', '--agent.inv_temp=1.0', '--agent.alpha=10.0',
        '--agent.clip_sampler_before=False', '--agent.clip_sampler_after=True',
        '--agent.actor_hidden_dims=(128,128)', '--agent.value_hidden_dims=(128,128)', '--agent.batch_size=128',
    ]),
    # ReBRAC (their agents/rebrac.py) on task1 with reproduce.py's cube-double values.
    'rebrac': ('main.py', [
        '--env_name=cube-single-play-singletask-task1-v0', '--agent=agents/rebrac.py', '--horizon_length=5',
        '--agent.action_chunking=True', '--agent.alpha_actor=0.01', '--agent.actor_noise=0.0',
        '--agent.actor_hidden_dims=(128,128)', '--agent.value_hidden_dims=(128,128)', '--agent.batch_size=128',
    ]),
}  # fmt: skip

# Stub modules the reference imports; see the module docstring.
STUBS = {
    'robomimic/__init__.py': 'DATASET_REGISTRY = {}\n',
    'robomimic/utils/__init__.py': '',
    'robomimic/utils/env_utils.py': '',
    'robomimic/utils/file_utils.py': '',
    'robomimic/utils/obs_utils.py': 'def initialize_obs_modality_mapping_from_dict(*args, **kwargs):\n    pass\n',
    'wandb.py': (
        'class _Run:\n    project = "qc"\n    url = ""\n\n    def save(self, *args, **kwargs):\n        pass\n\n\n'
        'run = None\n\n\ndef init(**kwargs):\n    global run\n    run = _Run()\n    return run\n\n\n'
        'def log(*args, **kwargs):\n    pass\n\n\ndef Settings(**kwargs):\n    return None\n\n\n'
        'class Image:\n    pass\n\n\nclass Video:\n    pass\n\n\nclass Histogram:\n    pass\n'
    ),
}

CODES = ('ours', 'reference')


def run_flags(args):
    """(script, flags) of one run of the comparison, without the seed and the output folder."""
    script, flags = PRESETS[args.preset]
    offline = [f'--offline_steps={args.offline_steps}'] if script == 'main.py' else []
    return script, [
        *flags, *offline, f'--online_steps={args.online_steps}', f'--start_training={args.start_training}',
        f'--eval_interval={args.eval_interval}', f'--eval_episodes={args.eval_episodes}', '--log_interval=5000',
    ]  # fmt: skip


def eval_csv(work_dir, code, seed, name='eval.csv'):
    """The eval.csv (or another log `name`) of a run (None before it exists)."""
    pattern = {'ours': f'Debug/*/{name}', 'reference': f'qc/Debug/*/*/{name}'}[code]
    found = sorted(glob.glob(os.path.join(work_dir, code, f'seed{seed}', pattern)))
    return found[-1] if found else None


# Training metrics both codes log under the same names, compared at each phase's last logged step.
LOSS_KEYS = ('critic/critic_loss', 'critic/q_mean', 'critic/q', 'actor/actor_loss', 'actor/flow_loss', 'actor/adj_loss',
             'actor/bc_flow_loss', 'actor/edit_q_loss', 'actor/edit_entropy')  # `critic/q`: QSM's and DAC's Q


def loss_rows(work_dir, seeds, seed=0):
    """Per phase log and metric both codes logged: each code's mean and sample std over the finished `seeds` at the
    last logged step, and the permutation p-value. A mismatch of settings between the codes shows here first."""
    rng = np.random.default_rng(seed)
    rows = []
    for name in ('offline_agent.csv', 'online_agent.csv'):
        last = {code: [] for code in CODES}
        for code in CODES:
            for s in seeds[code]:
                path = eval_csv(work_dir, code, s, name)
                if path:
                    with open(path) as f:
                        last[code].append(list(csv.DictReader(f))[-1])
        if not all(last.values()):
            continue
        for key in LOSS_KEYS:
            if all(key in r for code in CODES for r in last[code]):
                values = {code: [float(r[key]) for r in last[code]] for code in CODES}
                step = int(float(last['ours'][0]['step']))
                rows.append(dict(log=name, step=step, key=key, values=values,
                                 p=permutation_p(values['ours'], values['reference'], rng)))  # fmt: skip
    return rows


def loss_table(rows):
    lines = ['| log (step) | metric | this project | reference | p |', '|---|---|---|---|---|']
    for r in rows:
        a, b = (np.asarray(r['values'][code]) for code in CODES)
        lines.append(f'| {r["log"]} ({r["step"]:,}) | `{r["key"]}` | {a.mean():.4g} ± {a.std(ddof=1):.2g} | '
                     f'{b.mean():.4g} ± {b.std(ddof=1):.2g} | {r["p"]:.2f} |')  # fmt: skip
    return '\n'.join(lines)


def read_curve(path):
    """{step: success} of an eval.csv (both codes write `step` and `success` columns)."""
    with open(path) as f:
        return {int(float(row['step'])): float(row['success']) for row in csv.DictReader(f)}


def last_step(args):
    """The step of a run's last evaluation (offline steps count first in `main.py`)."""
    return (args.offline_steps if PRESETS[args.preset][0] == 'main.py' else 0) + args.online_steps


def finished(work_dir, code, seed, last_step):
    path = eval_csv(work_dir, code, seed)
    return path is not None and last_step in read_curve(path)


def generate_data(data_dir):
    """OGBench's cube-single play data (`DATA_EPISODES` episodes, `envs.generate_ogbench`) in `data_dir`, unless it
    is there already."""
    if not os.path.exists(os.path.join(data_dir, f'{DATASET}.npz')):
        print(f'generating {DATASET} ({DATA_EPISODES} episodes) in {data_dir}', flush=True)
        subprocess.run(
            [sys.executable, '-m', 'envs.generate_ogbench', f'--env_name={DATASET}',
             f'--num_episodes={DATA_EPISODES}', f'--save_dir={data_dir}'],
            cwd=ROOT, check=True, stderr=subprocess.DEVNULL,
        )  # fmt: skip


def prepare(args):
    """The data (generated when missing), the reference's private HOME and its stub modules."""
    data_dir = os.path.abspath(args.data_dir)
    generate_data(data_dir)
    home = os.path.join(args.work_dir, 'reference_home')
    links = os.path.join(home, '.ogbench', 'data')
    os.makedirs(links, exist_ok=True)
    for name in (f'{DATASET}.npz', f'{DATASET}-val.npz'):
        link = os.path.join(links, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(data_dir, name), link)
    stubs = os.path.join(args.work_dir, 'reference_stubs')
    for rel, text in STUBS.items():
        path = os.path.join(stubs, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write(text)
    return data_dir, home, stubs


def command(args, code, seed, data_dir, home, stubs):
    """(argv, cwd, env) of one run."""
    script, flags = run_flags(args)
    out = os.path.join(os.path.abspath(args.work_dir), code, f'seed{seed}')
    # One thread per process: `--jobs` processes share the cores, each pinned to its own.
    env = dict(os.environ, XLA_FLAGS='--xla_cpu_multi_thread_eigen=false', PYTHONUNBUFFERED='1')
    if code == 'ours':
        argv = [sys.executable, script, *flags, f'--seed={seed}', f'--save_dir={out}', f'--exp_name=seed{seed}',
                f'--dataset_dir={data_dir}']  # fmt: skip
        env.update(WANDB_MODE='disabled')
        cwd = ROOT
    else:
        argv = [sys.executable, script, *flags, f'--seed={seed}', f'--save_dir={out}']
        env.update(HOME=home, PYTHONPATH=os.pathsep.join([stubs, os.path.abspath(args.reference)]))
        cwd = os.path.abspath(args.reference)
    return argv, cwd, env, out


def run_all(args):
    """Runs every missing (code, seed) pair, `--jobs` at a time, interleaving the codes seed by seed."""
    if not os.path.isfile(os.path.join(args.reference, PRESETS[args.preset][0])):
        sys.exit(f'error: {args.reference} is not a checkout of the reference (no {PRESETS[args.preset][0]} there)')
    data_dir, home, stubs = prepare(args)
    todo = [(code, seed) for seed in range(args.first_seed, args.seeds) for code in CODES
            if not finished(args.work_dir, code, seed, last_step(args))]  # fmt: skip
    cores = os.cpu_count() or 1
    running = {}  # slot -> (code, seed, process, started, log file)
    while todo or running:
        for slot in range(args.jobs):
            if slot not in running and todo:
                code, seed = todo.pop(0)
                argv, cwd, env, out = command(args, code, seed, data_dir, home, stubs)
                shutil.rmtree(out, ignore_errors=True)  # An unfinished run starts over.
                os.makedirs(out)
                if args.jobs > 1 and shutil.which('taskset'):
                    argv = ['taskset', '-c', str(slot % cores), *argv]
                log = open(os.path.join(out, 'stdout.log'), 'w')  # closed when the run ends, below
                proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
                running[slot] = (code, seed, proc, time.time(), log)
                print(f'started {code} seed {seed}', flush=True)
        time.sleep(2)
        for slot, (code, seed, proc, started, log) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[slot]
            # The reference's exit status is not read: it ends by writing a wandb URL file after its logs are closed.
            ok = finished(args.work_dir, code, seed, last_step(args))
            state = 'finished' if ok else f'FAILED (exit {proc.returncode}; see {log.name})'
            print(f'{code} seed {seed} {state} in {time.time() - started:.0f} s', flush=True)


# Statistics over seeds.


def bootstrap_difference(a, b, rng, reps=10000):
    """(mean(a) - mean(b), low, high), each group resampled on its own."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    da = a[rng.integers(0, len(a), size=(reps, len(a)))].mean(axis=1)
    db = b[rng.integers(0, len(b), size=(reps, len(b)))].mean(axis=1)
    diff = da - db
    return float(a.mean() - b.mean()), float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))


def area_under_curve(curve, steps):
    """Mean success over the evaluation steps, by the trapezoid rule (the curve's area over its step range)."""
    values = np.array([curve[s] for s in steps], dtype=float)
    if len(steps) == 1:
        return float(values[0])
    x = np.asarray(steps, dtype=float)
    return float(np.sum((values[1:] + values[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0]))


def compare(curves, seed=0):
    """Per-step and area-under-curve statistics of `curves` = {code: [ {step: success}, ... per seed ]}.

    Only steps that every run of both codes reached are compared."""
    rng = np.random.default_rng(seed)
    runs = [c for code in CODES for c in curves[code]]
    steps = sorted(set.intersection(*(set(c) for c in runs)))
    rows = []
    for step in [*steps, 'auc']:
        values = {
            code: [c[step] if step != 'auc' else area_under_curve(c, steps) for c in curves[code]] for code in CODES
        }
        rows.append(dict(
            step=step,
            **{code: bootstrap_ci(values[code], rng) for code in CODES},
            difference=bootstrap_difference(values['ours'], values['reference'], rng),
            p=permutation_p(values['ours'], values['reference'], rng),
            values=values,
        ))  # fmt: skip
    return rows


def table(rows, seeds):
    """The markdown table of `compare` rows."""

    def cell(m):
        return f'{m[0]:.3f} [{m[1]:.2f}, {m[2]:.2f}]'

    lines = [
        f'| step | this project ({seeds["ours"]} seeds) | reference ({seeds["reference"]} seeds) | difference | p |',
        '|---|---|---|---|---|',
    ]
    for r in rows:
        step = 'area under the curve' if r['step'] == 'auc' else f'{r["step"]:,}'
        lines.append(
            f'| {step} | {cell(r["ours"])} | {cell(r["reference"])} | {r["difference"][0]:+.3f} '
            f'[{r["difference"][1]:+.2f}, {r["difference"][2]:+.2f}] | {r["p"]:.2f} |'
        )
    return '\n'.join(lines)


def collect(work_dir, last_step, first_seed=0):
    """({code: [curve per finished seed]}, {code: [those seeds]}), seeds in order from `first_seed`."""
    curves, seeds = {code: [] for code in CODES}, {code: [] for code in CODES}
    for code in CODES:
        seed = first_seed
        while eval_csv(work_dir, code, seed) is not None:
            if finished(work_dir, code, seed, last_step):
                curves[code].append(read_curve(eval_csv(work_dir, code, seed)))
                seeds[code].append(seed)
            seed += 1
    return curves, seeds


def load_earlier(path, command_line, first_seed):
    """The JSON of an earlier comparison to put before the runs on disk (`--earlier`), checked before anything runs:
    it must have compared the same command with exactly seeds 0..first_seed-1 of each code."""
    try:
        with open(path) as f:
            earlier = json.load(f)
        command, seeds = earlier['command'], earlier['seeds']
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f'error: --earlier={path} is not the JSON of a comparison ({type(e).__name__}: {e})')
    if command != command_line:
        sys.exit(f'error: --earlier={path} compared other runs ({command}), not {command_line}')
    if any(n != first_seed for n in seeds.values()):
        sys.exit(f'error: --earlier={path} holds seeds {seeds} of each code; --first_seed must be that count')
    return earlier


def with_earlier(earlier, first_seed, curves, losses, seed=0):
    """`curves` and `losses` of the runs on disk (seeds from `first_seed`) with the `earlier` comparison's seeds
    0..first_seed-1 put first (its JSON keeps every seed's values), and the loss p-values redone; only the metrics
    both logged are kept."""
    steps = [r for r in earlier['rows'] if r['step'] != 'auc']
    merged = {code: [{r['step']: r['values'][code][i] for r in steps} for i in range(first_seed)] + curves[code]
              for code in CODES}  # fmt: skip
    rng = np.random.default_rng(seed)
    before = {(r['log'], r['step'], r['key']): r['values'] for r in earlier['losses']}
    rows = []
    for r in losses:
        old = before.get((r['log'], r['step'], r['key']))
        if old is not None:
            values = {code: old[code] + r['values'][code] for code in CODES}
            rows.append(dict(r, values=values, p=permutation_p(values['ours'], values['reference'], rng)))
    return merged, rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--reference',
        help='a checkout of the reference: github ColinQiyangLi/qc (qc-rlpd) or ColinQiyangLi/qam (qam)',
    )
    parser.add_argument('--report_only', action='store_true', help='only print the table of the runs on disk')
    parser.add_argument('--preset', default='qc-rlpd', choices=sorted(PRESETS))
    parser.add_argument('--seeds', type=int, default=12, help='seeds 0..N-1 of each code')
    parser.add_argument('--first_seed', type=int, default=0, help='run only seeds first_seed..N-1 (see --earlier)')
    parser.add_argument('--earlier', default=None, help='JSON of an earlier comparison of the same command with '
                        'seeds 0..first_seed-1, whose per-seed values are put first (its run folders may be gone)')
    parser.add_argument('--offline_steps', type=int, default=5000, help='offline steps of main.py presets')
    parser.add_argument('--online_steps', type=int, default=20000)
    parser.add_argument('--start_training', type=int, default=1000)
    parser.add_argument('--eval_interval', type=int, default=2500)
    parser.add_argument('--eval_episodes', type=int, default=50)
    parser.add_argument('--jobs', type=int, default=os.cpu_count() or 1, help='runs at once (default: the cores)')
    parser.add_argument('--work_dir', default='/tmp/qc_reference_curves', help='where the runs are written')
    parser.add_argument('--data_dir', default=None, help=f'folder of {DATASET}.npz (default: <work_dir>/data)')
    parser.add_argument(
        '--out',
        default=None,
        help='JSON of the comparison (default: benchmarks/results_reference'
        '.json for qc-rlpd, results_reference_<preset>.json otherwise)',
    )
    args = parser.parse_args(argv)
    for name in ('seeds', 'offline_steps', 'online_steps', 'eval_interval', 'eval_episodes', 'jobs', 'start_training',
                 'first_seed'):  # fmt: skip
        low = 0 if name in ('start_training', 'offline_steps', 'first_seed') else 1
        if getattr(args, name) < low:
            sys.exit(f'error: --{name} must be >= {low}, got {getattr(args, name)}')
    if args.first_seed >= args.seeds:
        sys.exit(f'error: --first_seed={args.first_seed} leaves no seed to run below --seeds={args.seeds}')
    script, flags = run_flags(args)
    command_line = f'python {script} ' + ' '.join(flags)
    earlier = load_earlier(args.earlier, command_line, args.first_seed) if args.earlier else None
    args.data_dir = args.data_dir or os.path.join(args.work_dir, 'data')
    suffix = '' if args.preset == 'qc-rlpd' else f'_{args.preset}'
    args.out = args.out or os.path.join(ROOT, 'benchmarks', f'results_reference{suffix}.json')
    if not args.report_only:
        if not args.reference:
            parser.error('--reference is required (a checkout of the reference), unless --report_only')
        run_all(args)
    curves, finished_seeds = collect(args.work_dir, last_step(args), args.first_seed)
    if not all(curves[code] for code in CODES):
        sys.exit(f'error: no finished runs of both codes in {args.work_dir}')
    losses = loss_rows(args.work_dir, finished_seeds)
    if earlier is not None:
        curves, losses = with_earlier(earlier, args.first_seed, curves, losses)
    rows = compare(curves)
    seeds = {code: len(curves[code]) for code in CODES}
    print(table(rows, seeds))
    if losses:
        print(loss_table(losses))
    result = dict(
        command=command_line, seeds=seeds, machine=machine_info(),
        rows=[{k: v for k, v in r.items()} for r in rows], losses=losses,
    )  # fmt: skip
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
