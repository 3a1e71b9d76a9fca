"""Learning curves from run directories: read `eval.csv` logs, average seeds of one setting, draw mean and band.

Reads only files the loggers wrote (`eval.csv`, `flags.json`), so it works on finished and running runs alike:

    python -m log_utils plot RUN_DIR [RUN_DIR ...] --out curves.png
"""

import argparse
import json
import os
import sys
from collections import OrderedDict

import numpy as np

from analysis import paper, run_files


def find_run_dirs(paths, csv_name=run_files.csv_name(run_files.EVAL_LOG)):
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
    flag_dict = run_files.read_flags(run_dir) if group_by in ('flags', 'auto') else {}
    if flag_dict:
        kept = {k: v for k, v in _flatten(flag_dict).items() if _is_group_flag(k)}
        label = _method_name(kept)
        return json.dumps(kept, sort_keys=True, default=str), label, kept
    return parent, label, None


def _distinguishing_labels(groups):
    """Labels naming the flags that differ between groups, when every group has flags and defaults collide."""
    labels = [label for label, _, _ in groups]
    flag_sets = [kept for _, _, kept in groups]
    if all(kept is not None for kept in flag_sets) and len({kept.get('env_name') for kept in flag_sets}) > 1:
        labels = [f'{label}/{kept.get("env_name")}' for label, kept in zip(labels, flag_sets, strict=True)]
    if len(set(labels)) == len(labels) or any(kept is None for kept in flag_sets):
        return [label if labels.count(label) == 1 else f'{label} #{i + 1}' for i, label in enumerate(labels)]
    # Keys every group has (a driver-only flag says nothing a label needs), at most a few of them.
    keys = sorted(set.intersection(*(set(kept) for kept in flag_sets)))
    differing = [k for k in keys if len({json.dumps(kept.get(k), default=str) for kept in flag_sets}) > 1][:3]
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
        steps, values = run_files.eval_curve(run_dir, metric)
        if not len(steps):
            continue
        key, label, kept = _group_of(run_dir, group_by)
        keep = ~np.isnan(steps)
        groups.setdefault(key, (label, [], kept))[1].append(dict(zip(steps[keep].tolist(), values[keep].tolist())))
    labels = _distinguishing_labels(list(groups.values()))
    curves = []
    for label, (_, runs, group_flags) in zip(labels, groups.values()):
        steps = np.array(sorted(set().union(*runs)), dtype=np.float64)
        stacked = np.array([[run.get(s, np.nan) for s in steps] for run in runs])
        curves.append(
            dict(
                flags=group_flags or {},
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


def run_protocol(flags):
    """The protocol ('qc' or 'qam') a run follows, as its flags.json records it (runs older than `--protocol`:
    'qc')."""
    return flags.get('protocol') if flags.get('protocol') in paper.PROTOCOLS else 'qc'


def paper_method(flags):
    """The name, in the paper of the run's protocol, of the method a run's flags select (flattened flags.json
    keys): the driver records it (`paper_method`); for runs older than that record, the QC paper's names are
    worked out from the flags (QC, BFN-n, BFN, QC-FQL, FQL-n, FQL, RLPD, RLPD-AC, QC-RLPD). None when they match
    none."""
    if 'paper_method' in flags:
        return flags['paper_method']
    agent = flags.get('agent.agent_name')
    horizon = flags.get('horizon_length', flags.get('agent.horizon_length'))
    if agent is None or horizon is None:
        return None
    chunked = int(horizon) > 1 and flags.get('agent.action_chunking', True)
    if agent == 'acfql':
        base = {'best-of-n': 'BFN', 'distill-ddpg': 'FQL'}.get(flags.get('agent.actor_type'))
        if base is None:
            return None
        if int(horizon) == 1:
            return base
        return f'QC-{base}'.replace('QC-BFN', 'QC') if chunked else f'{base}-n'
    if agent == 'acrlpd' and chunked:
        return 'QC-RLPD' if flags.get('agent.bc_alpha') else 'RLPD-AC'
    if agent == 'acrlpd' and int(horizon) == 1 and not flags.get('agent.bc_alpha'):
        return 'RLPD'
    return None


def _method_name(flags):
    """A run's method as the plots name it: its run group when one was given, else the paper's method name."""
    group = flags.get('run_group')
    if group and group not in ('Debug', 'runs'):  # The drivers' default group, and the one sweeps use.
        return str(group)
    return paper_method(flags) or str(flags.get('agent.agent_name', 'run'))


def plot_title(curves):
    """'env - method (H=5), offline 1000000 + online 1000000 steps' from the curves' flags (values that differ
    between curves are joined)."""

    def values(fn):
        found = []
        for curve in curves:
            value = fn(curve['flags'])
            if value not in (None, '') and value not in found:
                found.append(value)
        return ', '.join(str(v) for v in found)

    envs = values(lambda f: f.get('env_name'))
    methods = values(lambda f: paper_method(f) or _method_name(f))
    horizons = values(lambda f: f.get('horizon_length', f.get('agent.horizon_length')))
    steps = values(lambda f: ' + '.join(f'{phase} {f[k]}' for phase, k in (('offline', 'offline_steps'),
                                        ('online', 'online_steps')) if f.get(k)))  # fmt: skip
    title = ' - '.join(part for part in (envs, methods) if part)
    if horizons:
        title += f' (H={horizons})'
    return f'{title}, {steps} steps' if steps else title


def draw_published(ax, curve, color):
    """Draws the published curve of a curve group's task and method (`analysis/paper.py`) within its step range;
    returns the line, or None where the paper has no such curve."""
    flags = curve['flags']
    protocol = run_protocol(flags)
    method, task = paper_method(flags), paper.published_task(str(flags.get('env_name', '')), protocol)
    points = paper.curve(task, method, protocol) if method and task else None
    if points is None:
        return None
    offline_steps = int(flags.get('offline_steps') or 0)
    steps = np.asarray(curve['steps'])
    title = paper.protocol(protocol).title
    return paper.draw_phases(ax, points, offline_steps, (steps.min(), steps.max()), origin=offline_steps, color=color,
                             label=f'{method} ({title})', name=protocol)  # fmt: skip


def plot_runs(run_dirs, out_path, metrics=('success', 'return'), group_by='auto', band='std', paper=False):
    """Plots eval curves of `run_dirs` into a PNG, one subplot per metric; returns `out_path` (see `draw_runs`)."""
    import matplotlib.pyplot as plt

    fig = draw_runs(run_dirs, metrics=metrics, group_by=group_by, band=band, paper=paper)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def draw_runs(run_dirs, metrics=('success', 'return'), group_by='auto', band='std', paper=False):
    """The matplotlib figure of `plot_runs`: one subplot per metric, titled with the env, method and H.

    Runs that differ only by seed form one group (see `aggregate_curves` for `group_by`); each group is drawn as its
    mean over runs (a marker at every evaluation) with a std (or `band='minmax'`) band; the offline/online
    boundary is marked and success is drawn on a 0-1 axis. With `paper`, each group's success axes also show the
    paper's published curve of its task and method (`paper_method`), dashed, its offline/online boundary on ours.
    """
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    run_dirs = find_run_dirs(run_dirs)
    if not run_dirs:
        raise FileNotFoundError('no eval.csv found in the given run directories')
    metrics = list(metrics)
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    described = []
    for ax, metric in zip(axes[0], metrics):
        curves = aggregate_curves(run_dirs, metric, group_by=group_by)
        described = described or curves
        for curve in curves:
            label = f'{curve["label"]} (n={curve["num_runs"]})'
            line = ax.plot(curve['steps'], curve['mean'], label=label, marker='o', markersize=3)[0]
            if band == 'minmax':
                low, high = curve['min'], curve['max']
            else:
                low, high = curve['mean'] - curve['std'], curve['mean'] + curve['std']
            ax.fill_between(curve['steps'], low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            if paper and metric == 'success':
                draw_published(ax, curve, line.get_color())
        if not curves:
            ax.text(0.5, 0.5, f'no {metric} column', ha='center', va='center', transform=ax.transAxes)
        else:
            ax.legend(fontsize='small')
        for boundary in sorted({c['flags'].get('offline_steps') for c in curves} - {None, 0}):
            if any(c['flags'].get('online_steps') for c in curves):
                ax.axvline(boundary, color='gray', linestyle='--', linewidth=1)
                for text, align in (('offline  ', 'right'), ('  online', 'left')):
                    ax.text(boundary, 0.98, text, transform=ax.get_xaxis_transform(), ha=align, va='top',
                            color='gray', fontsize='small')  # fmt: skip
        if metric == 'success':
            ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel('step')
        ax.set_ylabel(metric)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    if described:
        fig.suptitle(plot_title(described), fontsize='medium')
    fig.tight_layout()
    return fig


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
    plot.add_argument('--paper', action='store_true',
                      help="overlay the paper's published success curve of each run's task and method")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        out = plot_runs(
            args.run_dirs, args.out, metrics=args.metrics, group_by=args.group_by, band=args.band, paper=args.paper
        )
    except FileNotFoundError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    print(out)
    return 0
