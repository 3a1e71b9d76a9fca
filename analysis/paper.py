"""The published success curves of both papers (`analysis/published/`), and where a run of ours meets them.

Two papers, each with its own protocol (`PROTOCOLS`):

- `qc`: "Reinforcement Learning with Action Chunking" (Li, Zhou, Levine, 2025). Offline-to-online methods train 1M
  steps offline, then 1M online; online-only methods 1M online. The release puts every method's online phase at
  steps 1M to 2M (online-only curves start at 1M; the shared README's "0 to 1,000,000" for them does not match its
  data), a point every 100k steps, as a mean and a 95% interval per point (no seeds).
- `qam`: "Q-learning with Adjoint Matching" (Li, Levine, 2026). 1M offline, then 500K online steps, a point every
  50K; online-only methods (RLPD) at 50K to 500K. The release holds every seed (12), so the mean and interval of a
  point are computed here from its seeds with the bootstrap of our own results (`analysis.stats`), and our seeds
  can be tested against theirs.

Published tasks are named as in the releases: `cube-triple-play-task2` for our `cube-triple-play-singletask-task2-v0`,
`antmaze-large-navigate-task1` for `antmaze-large-navigate-singletask-task1-v0`, `cube-triple` for the mean over that
domain's 5 tasks (`all`: every task of the paper), `lift` for `lift-mh-low_dim`. Methods are each paper's names,
which are also the names of our presets (`sweeps/presets.py`).
"""

import csv
import dataclasses
import functools
import gzip
import os
import re

import numpy as np

from analysis.stats import bootstrap_ci, bootstrap_mean_of_means

PUBLISHED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'published')
PUBLISHED_CSV = os.path.join(PUBLISHED_DIR, 'published_curves.csv')
PAPER_PHASE_STEPS = 1_000_000  # The offline phase of both papers' protocols.
AGGREGATE_DOMAIN = 'ogbench-aggregate'

_OGBENCH_TASK = re.compile(r'^(?P<base>.+-(?:play|navigate))-singletask-(?P<task>task\d+)-v0$')
_ROBOMIMIC_TASK = re.compile(r'^(?P<task>[a-z_]+)-mh-low_dim$')


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A paper's training protocol and its published curves."""

    name: str  # 'qc' or 'qam': the value of the drivers' --protocol and of a SPEC's `protocol`.
    title: str  # How tables and plots name the paper.
    path: str  # The published CSV (gzipped where it ends in .gz).
    online_steps: int  # Online steps after the 1M offline ones.
    spacing: int  # Steps between published points.
    online_only_start: int  # Published step at which the online-only methods' online phase starts.
    has_seeds: bool  # Whether the release holds every seed (columns seed0, seed1, ...).


PROTOCOLS = {
    'qc': Protocol('qc', 'QC paper', PUBLISHED_CSV, online_steps=1_000_000, spacing=100_000,
                   online_only_start=PAPER_PHASE_STEPS, has_seeds=False),
    'qam': Protocol('qam', 'QAM paper', os.path.join(PUBLISHED_DIR, 'qam_published_curves.csv.gz'),
                    online_steps=500_000, spacing=50_000, online_only_start=0, has_seeds=True),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Point:
    """The published success at one step: mean over seeds and its 95% interval (0 to 1), with the seeds' values
    where the release has them (per task; per member task for a domain's mean)."""

    step: int
    mean: float
    low: float
    high: float
    seeds: tuple = ()  # One tuple of seed values per task (one task, or a domain's member tasks).


def protocol(name):
    """The `Protocol` of 'qc' or 'qam'."""
    return PROTOCOLS[name]


@functools.cache
def _rows(name):
    """({(task, method): {step: row values}}, {task: domain}) of a protocol's CSV: (mean, low, high) per row for
    the QC release, the seed values for the QAM release."""
    proto = PROTOCOLS[name]
    found, domains = {}, {}
    opener = gzip.open if proto.path.endswith('.gz') else open
    with opener(proto.path, 'rt', newline='') as f:
        for row in csv.DictReader(f):
            if proto.has_seeds:
                values = tuple(float(row[k]) for k in row if k.startswith('seed') and row[k] != '')
            else:
                values = (float(row['success_mean']), float(row['ci_low']), float(row['ci_high']))
            found.setdefault((row['task'], row['method']), {})[int(row['step'])] = values
            domains[row['task']] = row['domain']
    return found, domains


def curves(name='qc'):
    """{(task, method): [Point, ...] by step} and {task: domain} of a protocol's published curves."""
    found, domains = _rows(name)
    return {key: curve(key[0], key[1], name) for key in found}, domains


@functools.cache
def _curve(task, method, name):
    found, domains = _rows(name)
    rows = found.get((task, method))
    if rows is None:
        return None
    if not PROTOCOLS[name].has_seeds:
        return tuple(Point(step, *values) for step, values in sorted(rows.items()))
    rng = np.random.default_rng(0)  # Fixed: a published interval is the same in every table and plot.
    members = aggregates(name).get(task) if domains[task] == AGGREGATE_DOMAIN else None
    points = []
    for step in sorted(rows):
        if members:  # A domain's mean over its tasks, its interval resampling the seeds within every task.
            seeds = tuple(found[(t, method)][step] for t in members)
            mean, low, high = bootstrap_mean_of_means(seeds, rng)
        else:
            seeds = (rows[step],)
            mean, low, high = bootstrap_ci(rows[step], rng)
        points.append(Point(step, mean, low, high, seeds))
    return tuple(points)


def curve(task, method, name='qc'):
    """The published points of `method` on `task` (a published task name) in protocol `name`'s paper, or None."""
    points = _curve(task, method, name)
    return list(points) if points is not None else None


def published_task(env_name, name='qc'):
    """The published task of one of our environment names in protocol `name`'s paper, or None (`visual-` tasks
    share the state task's curve only in name, so they get none)."""
    for pattern, fmt in ((_OGBENCH_TASK, '{base}-{task}'), (_ROBOMIMIC_TASK, '{task}')):
        match = pattern.match(env_name)
        if match:
            task = fmt.format(**match.groupdict())
            return task if task in _rows(name)[1] else None
    return None


@functools.cache
def _aggregates(name):
    _, domains = _rows(name)
    singles = sorted(t for t, d in domains.items() if d == 'ogbench')
    groups = {}
    for task, domain in domains.items():
        if domain == AGGREGATE_DOMAIN:
            member = re.compile(rf'^{re.escape(task)}-(?:play|navigate)-task\d+$')
            groups[task] = tuple(singles if task == 'all' else [t for t in singles if member.match(t)])
    return groups


def aggregates(name='qc'):
    """{aggregate task: its member tasks}: each OGBench domain (tasks `<domain>-play-task<k>` or
    `<domain>-navigate-task<k>`) and `all`."""
    return {task: list(members) for task, members in _aggregates(name).items()}


def paper_step(phase, offline_steps, online_steps, online_only, name='qc'):
    """The published step that matches the end of our `phase` ('offline' or 'online') for a run of `offline_steps`
    then `online_steps`: the same number of steps into the same phase of the paper's protocol (the online phase
    starts at 1M; online-only methods start where the protocol puts them). None where there is no such point: an
    offline end of an online-only method, or the online phase after another offline length than the paper's 1M."""
    if phase == 'offline':
        return None if online_only else offline_steps
    if online_only:
        return PROTOCOLS[name].online_only_start + online_steps
    return PAPER_PHASE_STEPS + online_steps if offline_steps == PAPER_PHASE_STEPS else None


def point_at(points, step):
    """The point of `points` at exactly `step`, or None."""
    return next((p for p in points if p.step == step), None) if step is not None else None


def protocol_step(phase, online_only=False, name='qc'):
    """The published step at the end of `phase` in protocol `name`."""
    if phase == 'offline':
        return PAPER_PHASE_STEPS
    proto = PROTOCOLS[name]
    return (proto.online_only_start if online_only else PAPER_PHASE_STEPS) + proto.online_steps


def draw(ax, points, offset, x_range, color=None, label='paper'):
    """Draws published `points` on matplotlib axes as a dashed line with its 95% band, at x = step - `offset`,
    keeping the points inside `x_range` (lo, hi) so that a short run's curve keeps its scale. Returns the line, or
    None when no point falls in the range."""
    xs = np.array([p.step - offset for p in points], dtype=np.float64)
    keep = (xs >= x_range[0]) & (xs <= x_range[1])
    if not keep.any():
        return None
    mean, low, high = (np.array([getattr(p, k) for p in points])[keep] for k in ('mean', 'low', 'high'))
    (line,) = ax.plot(xs[keep], mean, linestyle='--', marker='x', markersize=4, color=color, linewidth=1.5, label=label)
    ax.fill_between(xs[keep], low, high, color=line.get_color(), alpha=0.1, linewidth=0)
    return line


def draw_phases(ax, points, offline_steps, x_range, origin=0, color=None, label='paper', name='qc'):
    """Draws published `points` of protocol `name` next to a run of `offline_steps` offline steps whose online phase
    starts at x = `origin`, within `x_range`. With the paper's offline length (or none: an online-only run), one
    curve whose online phase starts at `origin`. With another offline length, the two phases apart: the published
    offline points up to as many steps as ours, from where our offline phase starts (so a 100k-step run faces the
    published point at 100k), and the online points from `origin`. Returns the first line drawn, or None."""
    if offline_steps == 0:
        return draw(ax, points, PROTOCOLS[name].online_only_start - origin, x_range, color, label)
    if offline_steps == PAPER_PHASE_STEPS:
        return draw(ax, points, PAPER_PHASE_STEPS - origin, x_range, color, label)
    offline = [p for p in points if p.step <= offline_steps]
    online = [p for p in points if p.step >= PAPER_PHASE_STEPS]
    first = draw(ax, offline, offline_steps - origin, (origin - offline_steps, origin), color, label)
    color = first.get_color() if first is not None else color
    second = draw(ax, online, PAPER_PHASE_STEPS - origin, x_range, color, label if first is None else None)
    return first if first is not None else second
