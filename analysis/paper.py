"""The paper's published success curves (`analysis/published/`), and where a run of ours meets them.

Published tasks are named as in the release: `cube-triple-play-task2` for our `cube-triple-play-singletask-task2-v0`,
`cube-triple` for the mean over that domain's 5 tasks (`all`: the 25 OGBench tasks), `lift` for `lift-mh-low_dim`.
Methods are the paper's names, which are also our preset names (`sweeps/presets.py`).

The paper's protocol: offline-to-online methods train 1M steps offline, then 1M online; online-only methods train 1M
steps online. The release puts every method's online phase at steps 1M to 2M (online-only curves start at 1M; the
shared README's "0 to 1,000,000" for them does not match its data), with a point every 100k steps.
"""

import csv
import dataclasses
import functools
import os
import re

import numpy as np

PUBLISHED_CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'published', 'published_curves.csv')
PAPER_PHASE_STEPS = 1_000_000  # Each phase of the paper's protocol.
AGGREGATE_DOMAIN = 'ogbench-aggregate'

_OGBENCH_TASK = re.compile(r'^(?P<base>.+-play)-singletask-(?P<task>task\d+)-v0$')
_ROBOMIMIC_TASK = re.compile(r'^(?P<task>[a-z_]+)-mh-low_dim$')


@dataclasses.dataclass(frozen=True)
class Point:
    """The published success at one step: mean over seeds and its 95% interval (0 to 1)."""

    step: int
    mean: float
    low: float
    high: float


@functools.cache
def curves(path=PUBLISHED_CSV):
    """{(task, method): [Point, ...] by step} and {task: domain} of the published CSV."""
    found, domains = {}, {}
    with open(path, newline='') as f:
        for row in csv.DictReader(f):
            point = Point(int(row['step']), float(row['success_mean']), float(row['ci_low']), float(row['ci_high']))
            found.setdefault((row['task'], row['method']), []).append(point)
            domains[row['task']] = row['domain']
    return {key: sorted(points, key=lambda p: p.step) for key, points in found.items()}, domains


def published_task(env_name):
    """The published task of one of our environment names, or None (`visual-` tasks share the state task's curve
    only in name, so they get none)."""
    for pattern, fmt in ((_OGBENCH_TASK, '{base}-{task}'), (_ROBOMIMIC_TASK, '{task}')):
        match = pattern.match(env_name)
        if match:
            task = fmt.format(**match.groupdict())
            return task if task in curves()[1] else None
    return None


def curve(task, method):
    """The published points of `method` on `task` (a published task name), or None."""
    return curves()[0].get((task, method))


def aggregates():
    """{aggregate task: its member tasks}: each OGBench domain (tasks named `<domain>-play-task<k>`) and `all`."""
    _, domains = curves()
    singles = sorted(t for t, d in domains.items() if d == 'ogbench')
    groups = {}
    for name, domain in domains.items():
        if domain == AGGREGATE_DOMAIN:
            groups[name] = singles if name == 'all' else [t for t in singles if t.startswith(name + '-play-task')]
    return groups


def paper_step(phase, offline_steps, online_steps, online_only):
    """The published step that matches the end of our `phase` ('offline' or 'online') for a run of `offline_steps`
    then `online_steps`: the same number of steps into the same phase of the paper's protocol (the online phase
    starts at 1M). None where there is no such point: an offline end of an online-only method, or the online phase
    after another offline length than the paper's 1M."""
    if phase == 'offline':
        return None if online_only else offline_steps
    if online_only or offline_steps == PAPER_PHASE_STEPS:
        return PAPER_PHASE_STEPS + online_steps
    return None


def point_at(points, step):
    """The point of `points` at exactly `step`, or None."""
    return next((p for p in points if p.step == step), None) if step is not None else None


def protocol_step(phase):
    """The published step at the end of `phase` in the paper's protocol."""
    return PAPER_PHASE_STEPS if phase == 'offline' else 2 * PAPER_PHASE_STEPS


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


def draw_phases(ax, points, offline_steps, x_range, origin=0, color=None, label='paper'):
    """Draws published `points` next to a run of `offline_steps` offline steps whose online phase starts at
    x = `origin`, within `x_range`. With the paper's offline length (or none), one curve whose online phase starts
    at `origin`. With another offline length, the two phases apart: the published offline points up to as many
    steps as ours, from where our offline phase starts (so a 100k-step run faces the published point at 100k), and
    the online points from `origin`. Returns the first line drawn, or None."""
    if offline_steps in (0, PAPER_PHASE_STEPS):
        return draw(ax, points, PAPER_PHASE_STEPS - origin, x_range, color, label)
    offline = [p for p in points if p.step <= offline_steps]
    online = [p for p in points if p.step >= PAPER_PHASE_STEPS]
    first = draw(ax, offline, offline_steps - origin, (origin - offline_steps, origin), color, label)
    color = first.get_color() if first is not None else color
    second = draw(ax, online, PAPER_PHASE_STEPS - origin, x_range, color, label if first is None else None)
    return first if first is not None else second
