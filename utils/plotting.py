"""Learning curves from run directories: read `eval.csv` logs, average seeds of one setting, draw mean and band.

Reads only files the loggers wrote (`eval.csv`, `flags.json`), so it works on finished and running runs alike:

    python -m log_utils plot RUN_DIR [RUN_DIR ...] --out curves.png
"""

import argparse
import csv
import json
import math
import os
import sys
from collections import OrderedDict

import numpy as np


def read_csv(path):
    """Columns of a CSV log as float arrays (empty or non-numeric cells become NaN)."""
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    columns = OrderedDict()
    for row in rows:
        for key in row:
            columns.setdefault(key, [])
    for key in columns:
        for row in rows:
            try:
                columns[key].append(float(row.get(key) or 'nan'))
            except ValueError:
                columns[key].append(math.nan)
    return {k: np.asarray(v, dtype=np.float64) for k, v in columns.items()}


def metric_column(columns, metric):
    """The column of `metric` under any of the names the loggers and the reference use, or None."""
    for candidate in (metric, f'eval/{metric}', f'episode.{metric}', f'eval/episode.{metric}'):
        if candidate in columns:
            return columns[candidate]
    return None


def find_run_dirs(paths, csv_name='eval.csv'):
    """Run directories among `paths`: a path holding `csv_name` is a run; other directories are searched below."""
    runs = []
    for path in paths:
        if os.path.isfile(os.path.join(path, csv_name)):
            runs.append(path)
        elif os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs.sort()
                if csv_name in files:
                    runs.append(root)
    return runs


def _is_group_flag(name):
    # Flags that differ between seeds of one experiment (or only say where to write) must not split a group.
    return not (name == 'seed' or name == 'exp_name' or name.startswith('wandb') or name.endswith('_dir'))


def _flatten(d, prefix=''):
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(_flatten(v, f'{prefix}{k}.'))
        else:
            flat[f'{prefix}{k}'] = v
    return flat


def _group_of(run_dir, group_by):
    """(group key, default label, flattened grouping flags or None) of a run."""
    run_dir = os.path.abspath(run_dir)
    parent = os.path.dirname(run_dir)
    label = os.path.join(os.path.basename(os.path.dirname(parent)), os.path.basename(parent))
    flags_path = os.path.join(run_dir, 'flags.json')
    if group_by in ('flags', 'auto') and os.path.isfile(flags_path):
        with open(flags_path) as f:
            flag_dict = json.load(f)
        kept = {k: v for k, v in _flatten(flag_dict).items() if _is_group_flag(k)}
        label = '/'.join(str(flag_dict[k]) for k in ('run_group', 'env_name') if flag_dict.get(k)) or label
        return json.dumps(kept, sort_keys=True, default=str), label, kept
    return parent, label, None


def _distinguishing_labels(groups):
    """Labels naming the flags that differ between groups, when every group has flags and defaults collide."""
    labels = [label for label, _, _ in groups]
    flag_sets = [kept for _, _, kept in groups]
    if len(set(labels)) == len(labels) or any(kept is None for kept in flag_sets):
        return [label if labels.count(label) == 1 else f'{label} #{i + 1}' for i, label in enumerate(labels)]
    keys = sorted(set().union(*flag_sets))
    differing = [k for k in keys if len({json.dumps(kept.get(k), default=str) for kept in flag_sets}) > 1]
    result = []
    for label, kept in zip(labels, flag_sets):
        extra = ', '.join(f'{k}={kept.get(k)}' for k in differing if k not in ('run_group', 'env_name'))
        result.append(f'{label} [{extra}]' if extra else label)
    return result


def aggregate_curves(run_dirs, metric, group_by='auto'):
    """Per group: dict(label, steps, mean, std, min, max, num_runs), averaging the runs of a group at each step.

    `group_by`: 'flags' groups runs whose flags.json agree on everything but the seed and paths, 'parent' groups
    runs sharing a parent directory, 'auto' uses flags.json where present and the parent otherwise. A step is
    aggregated over the runs that reached it, so a run that stopped early still contributes its rows.
    """
    groups = OrderedDict()
    for run_dir in run_dirs:
        columns = read_csv(os.path.join(run_dir, 'eval.csv'))
        values = metric_column(columns, metric)
        if values is None or 'step' not in columns:
            continue
        key, label, kept = _group_of(run_dir, group_by)
        steps = columns['step']
        keep = ~np.isnan(values) & ~np.isnan(steps)
        groups.setdefault(key, (label, [], kept))[1].append(dict(zip(steps[keep].tolist(), values[keep].tolist())))
    labels = _distinguishing_labels(list(groups.values()))
    curves = []
    for label, (_, runs, _) in zip(labels, groups.values()):
        steps = np.array(sorted(set().union(*runs)), dtype=np.float64)
        stacked = np.array([[run.get(s, np.nan) for s in steps] for run in runs])
        curves.append(
            dict(
                label=label,
                steps=steps,
                mean=np.nanmean(stacked, axis=0),
                std=np.nanstd(stacked, axis=0),
                min=np.nanmin(stacked, axis=0),
                max=np.nanmax(stacked, axis=0),
                num_runs=len(runs),
            )
        )
    return curves


def plot_runs(run_dirs, out_path, metrics=('success', 'return'), group_by='auto', band='std'):
    """Plots eval curves of `run_dirs` into a PNG, one subplot per metric; returns `out_path`.

    Runs that differ only by seed form one group (see `aggregate_curves` for `group_by`); each group is drawn as its
    mean over runs with a std (or `band='minmax'`) band.
    """
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    run_dirs = find_run_dirs(run_dirs)
    if not run_dirs:
        raise FileNotFoundError('no eval.csv found in the given run directories')
    metrics = list(metrics)
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        curves = aggregate_curves(run_dirs, metric, group_by=group_by)
        for curve in curves:
            label = f'{curve["label"]} (n={curve["num_runs"]})'
            line = ax.plot(curve['steps'], curve['mean'], label=label)[0]
            if band == 'minmax':
                low, high = curve['min'], curve['max']
            else:
                low, high = curve['mean'] - curve['std'], curve['mean'] + curve['std']
            ax.fill_between(curve['steps'], low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        if not curves:
            ax.text(0.5, 0.5, f'no {metric} column', ha='center', va='center', transform=ax.transAxes)
        else:
            ax.legend(fontsize='small')
        ax.set_xlabel('step')
        ax.set_ylabel(metric)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m log_utils', description='Run log utilities.')
    sub = parser.add_subparsers(dest='command', required=True)
    plot = sub.add_parser('plot', help='plot eval curves (mean and band over seeds) of run directories')
    plot.add_argument('run_dirs', nargs='+', help='run directories, or directories searched for eval.csv')
    plot.add_argument('--out', default='curves.png', help='output PNG path')
    plot.add_argument('--metrics', nargs='+', default=['success', 'return'], help='eval.csv columns to plot')
    plot.add_argument(
        '--group-by',
        choices=('auto', 'flags', 'parent'),
        default='auto',
        help='average runs whose flags.json match up to seed and paths (auto: falls back to the parent directory)',
    )
    plot.add_argument('--band', choices=('std', 'minmax'), default='std', help='shaded band around the mean')
    args = parser.parse_args(argv)
    try:
        out = plot_runs(args.run_dirs, args.out, metrics=args.metrics, group_by=args.group_by, band=args.band)
    except FileNotFoundError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    print(out)
    return 0
