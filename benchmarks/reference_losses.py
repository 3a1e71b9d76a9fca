"""Logged losses of this project's agents against the authors' code (github ColinQiyangLi/qam) over many offline
updates: the same initial parameters, the same batches and the same keys, every logged info compared step by step
and over windows of steps.

    python -m benchmarks.reference_losses --reference=/path/to/qam                  # every case, 2,000 updates each
    python -m benchmarks.reference_losses --reference=/path/to/qam --cases=BAM,IFQL --steps=500

The JSON (`--out`) keeps the cases of earlier runs with the same `--steps`; a case run again replaces its row.

The batches are drawn once here, with this project's `sample_sequence`, from OGBench's cube-single play data made
by `envs.generate_ogbench` (60 episodes unless it is already in `--data_dir`), and handed to both codes. The
reference's agent is built in its own process (`benchmarks/reference_grads_probe.py --batches`, their checkout
first on PYTHONPATH) and runs its `update` on each batch; this project's agent is built with the same seed, loads
the reference's initial parameters (as `benchmarks.reference_grads` does) and runs its own `update` on the same
batches. Both codes split the agent's key alike, so both draw the same noise at every step; what differs is float
rounding, which training can amplify over the steps. The cases and their keys are `benchmarks.reference_grads`'s, at
the size of the learning-curve comparisons (two layers of 128, batches of 128, chunks of 5).
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np

from benchmarks import reference_grads as grads
from benchmarks import reference_grads_probe as probe
from benchmarks.common import machine_info
from benchmarks.reference_curves import generate_data

ROOT = grads.ROOT
ENV_NAME = 'cube-single-play-singletask-task2-v0'
SIZE = dict(actor_hidden_dims=[128, 128], value_hidden_dims=[128, 128])
BATCH_SIZE, HORIZON, DISCOUNT = 128, 5, 0.99
# The methods whose curves are not compared (issue 47): their losses are, here.
CASES = ('DAC', 'DSRL', 'CGQL', 'CGQL-M', 'CGQL-L', 'FBRAC', 'IFQL', 'BAM', 'FAWAC')
WINDOW = 200  # updates per window of the window means
FIRST_STEPS = 10  # the first updates, before rounding has grown: compared one by one


def dcgql_power_mask(infos, batches):
    """Their QSM/DAC actor loss adds 1 per chunk cut by an episode end (`x ** valid`; see
    `benchmarks.reference_grads.dcgql_power_mask`): added here to each step's logged loss."""
    infos['info/actor/actor_loss'] = infos['info/actor/actor_loss'] + np.mean(1 - batches['valid'][:, :, -1], axis=1)
    return infos


# Where an agent logs unlike the reference: f(infos, batches) translating its infos to the reference's.
ADAPTERS = {'dcgql': dcgql_power_mask}


def make_batches(data_dir, steps, seed=0):
    """{field: (steps, BATCH_SIZE, ...)} of the cube-single data, the fields the losses read."""
    from envs.env_utils import make_env_and_datasets
    from training.data import LOSS_FIELDS

    _, _, dataset, _ = make_env_and_datasets(ENV_NAME, dataset_dir=data_dir, seed=seed)
    drawn = [dataset.sample_sequence(BATCH_SIZE, HORIZON, DISCOUNT, fields=LOSS_FIELDS) for _ in range(steps)]
    return {k: np.stack([b[k] for b in drawn]).astype(np.float32) for k in LOSS_FIELDS}


def relative(ours, theirs):
    """|ours - theirs| / |theirs| elementwise (the absolute difference where theirs is 0)."""
    scale = np.abs(theirs)
    return np.where(scale > 0, np.abs(ours - theirs) / np.where(scale > 0, scale, 1.0), np.abs(ours - theirs))


def compare(ours, theirs, agent_name):
    """Per info both codes log: the largest relative difference over the first steps, and of the window means."""
    rows, missing = {}, []
    for their_key, t in theirs.items():
        if not their_key.startswith('info/'):
            continue
        key = grads.renamed(their_key, agent_name)
        if key not in ours:
            missing.append(key)
            continue
        o, t = np.asarray(ours[key], np.float64), np.asarray(t, np.float64)
        windows = len(t) // WINDOW
        o_means = o[: windows * WINDOW].reshape(windows, WINDOW).mean(1)
        t_means = t[: windows * WINDOW].reshape(windows, WINDOW).mean(1)
        rows[key.removeprefix('info/')] = dict(
            first=float(relative(o[:FIRST_STEPS], t[:FIRST_STEPS]).max()),
            windows=relative(o_means, t_means).tolist(),
            ours_last=float(o_means[-1]),
            theirs_last=float(t_means[-1]),
        )
    return rows, missing


def run_case(name, reference, batches_path, batches):
    agent_name, their_module, shared, extra = grads.CASES[name]
    keys = {**shared, **SIZE, 'batch_size': BATCH_SIZE}
    with tempfile.TemporaryDirectory() as work_dir:
        out = os.path.join(work_dir, 'theirs.npz')
        theirs = grads.run_reference(name, reference, their_module, keys, out, f'--batches={batches_path}')
    cls, config = grads.our_config(agent_name, keys, extra)
    observation, action, config['horizon_length'] = probe.batch_inputs(batches)
    agent, init_gap = grads.load_params(cls.create(probe.SEED, observation, action, config), theirs, agent_name)
    ours = probe.trajectory(agent, batches)
    ours = ADAPTERS.get(agent_name, lambda infos, b: infos)(ours, batches)
    rows, missing = compare(ours, theirs, agent_name)
    return dict(case=name, init_gap=init_gap, steps=len(batches['observations']), infos=rows, missing=missing)


def previous_results(path, steps):
    """The cases an earlier comparison with the same number of updates wrote to `path`, so that a run of some
    cases adds to (or replaces) those rows instead of dropping the others."""
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [r for r in json.load(f)['results'] if r['steps'] == steps]


def table(results):
    lines = [
        f'| case | infos | first {FIRST_STEPS} updates, worst | {WINDOW}-update means, worst (info) '
        f'| last {WINDOW}-update means, worst |',
        '|---|---:|---:|---|---:|',
    ]
    for r in results:
        infos = r['infos']
        first = max(v['first'] for v in infos.values())
        worst_key = max(infos, key=lambda k: max(infos[k]['windows']))
        last = max(v['windows'][-1] for v in infos.values())
        lines.append(f'| {r["case"]} | {len(infos)} | {first:.1e} | {max(infos[worst_key]["windows"]):.1e} '
                     f'(`{worst_key}`) | {last:.1e} |')  # fmt: skip
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--reference', required=True, help='a checkout of github ColinQiyangLi/qam')
    parser.add_argument('--cases', default=','.join(CASES), help='comma-separated case names (default: all)')
    parser.add_argument('--steps', type=int, default=2000, help='offline updates per case')
    parser.add_argument('--data_dir', default=os.path.join(tempfile.gettempdir(), 'qc_reference_losses_data'))
    parser.add_argument('--out', default=os.path.join(ROOT, 'benchmarks', 'results_reference_losses.json'))
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.cases.split(',') if c.strip()]
    # The cases whose reference updates as `update(batch)` and draws its noise from the agent's key as here.
    allowed = [n for n, case in grads.CASES.items() if case[0] not in ('acfql', 'acrlpd', 'rebrac')]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        sys.exit(f'error: unknown case(s) {unknown}; choose from {allowed}')
    if args.steps < WINDOW:
        sys.exit(f'error: --steps must be at least {WINDOW} (one window), got {args.steps}')
    if not os.path.isfile(os.path.join(args.reference, 'agents', 'qam.py')):
        sys.exit(f'error: {args.reference} is not a checkout of github ColinQiyangLi/qam (no agents/qam.py there)')
    generate_data(args.data_dir)
    batches = make_batches(args.data_dir, args.steps)
    results = previous_results(args.out, args.steps)
    with tempfile.TemporaryDirectory() as work_dir:
        batches_path = os.path.join(work_dir, 'batches.npz')
        np.savez(batches_path, **batches)
        for name in names:
            r = run_case(name, args.reference, batches_path, batches)
            results = [x for x in results if x['case'] != name] + [r]
            worst = max(max(v['windows']) for v in r['infos'].values())
            print(f'{name}: {len(r["infos"])} infos, worst {WINDOW}-update mean {worst:.1e}; missing here: '
                  f'{r["missing"]}', flush=True)  # fmt: skip
            with open(args.out, 'w') as f:  # after every case, so an interrupted comparison keeps the cases it ran
                json.dump(dict(results=results, window=WINDOW, machine=machine_info()), f, indent=1)
    print(table(results))
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
