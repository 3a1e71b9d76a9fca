"""`sweep.py status` and `sweep.py table`: what every run of a sweep is doing, and the paper-style results.

Both read only files: the sweep's record (`sweep.json`), the drivers' run directories (only through
`analysis.run_files`) and the job state files; `squeue`, where it exists, tells a queued or running SLURM job from one
that is gone.
"""

import json
import os
import shutil
import socket
import subprocess

import numpy as np

from analysis import paper, run_files
from analysis.stats import BOOTSTRAP_SAMPLES, bootstrap_ci, bootstrap_mean_of_means, stratified_permutation_p
from sweeps import jobs
from sweeps.spec import RUNS_DIR, Run, group_units
from utils.errors import UserError
from utils.run_lock import pid_alive

STATES = ('pending', 'running', 'finished', 'failed')
ACTIVE = ('submitted', 'running', 'requeued')


def run_dir(sweep_dir, name):
    return os.path.join(sweep_dir, RUNS_DIR, name)


def is_finished(sweep_dir, name):
    return run_files.is_finished(run_dir(sweep_dir, name))


def slurm_queue():
    """Ids of the jobs SLURM still holds (array tasks one by one), or None where squeue cannot be asked."""
    if shutil.which('squeue') is None:
        return None
    try:
        out = subprocess.run(['squeue', '-h', '-r', '-o', '%i'], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(out.stdout.split()) if out.returncode == 0 else None


def unit_active(sweep_dir, unit_name, queue=None):
    """Whether the unit's process is queued or running now (its SLURM job still in the queue, or its local
    process alive); `queue` is `slurm_queue()` when the caller already asked."""
    state = jobs.read_state(sweep_dir, unit_name)
    if state is None or state['state'] not in ACTIVE:
        return False
    if state.get('job'):
        queue = slurm_queue() if queue is None else queue
        return True if queue is None else state['job'] in queue
    if state.get('host') == socket.gethostname() and state.get('pid'):
        return pid_alive(state['pid'])
    return state['state'] == 'running'


def load_sweep(sweep_dir):
    """(runs, {run name: unit name}) of the sweep recorded in `sweep_dir`."""
    path = os.path.join(sweep_dir, 'sweep.json')
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError as e:
        raise UserError(f'{sweep_dir} is not a sweep directory (no sweep.json); launch one with sweep.py launch') from e
    except (OSError, ValueError) as e:
        raise UserError(f'{path} cannot be read: {e}') from e
    runs = [Run(**r) for r in record['runs']]
    units = group_units(runs, record.get('seeds_per_process', 1))
    return runs, {run.name: unit.name for unit in units for run in unit.runs}


def run_status(sweep_dir, name, unit_name=None, queue=None):
    """dict(state, step, success, note) of one run; `state` is one of `STATES`."""
    path = run_dir(sweep_dir, name)
    steps, success = run_files.eval_curve(path)
    info = dict(step=run_files.last_step(path), success=float(success[-1]) if len(success) else None, note='')
    if is_finished(sweep_dir, name):
        return dict(info, state='finished')
    state = jobs.read_state(sweep_dir, unit_name or name)
    if state is None:
        return dict(info, state='pending', note='' if info['step'] is None else 'interrupted; launch again')
    where = f'job {state["job"]}' if state.get('job') else f'pid {state.get("pid")} on {state.get("host")}'
    if state.get('device') is not None:
        where += f', GPU {state["device"]}'
    if state['state'] == 'failed':
        return dict(info, state='failed', note=state.get('error') or f'exit status {state.get("returncode")}')
    if state['state'] in ACTIVE:
        if unit_active(sweep_dir, unit_name or name, queue=queue):
            running = state['state'] == 'running'
            return dict(info, state='running' if running else 'pending', note=where + ('' if running else ' queued'))
        return dict(info, state='failed', note=f'{where} ended without finishing (killed?); launch again to continue')
    return dict(info, state='pending', note='stopped with a checkpoint; launch again to continue')


def status_lines(sweep_dir):
    """One line per run (name, state, last step, last evaluation success, note) and a count line."""
    runs, unit_of = load_sweep(sweep_dir)
    queue = slurm_queue()
    rows = [(run.name, run_status(sweep_dir, run.name, unit_of[run.name], queue)) for run in runs]
    width = max(len('run'), *(len(name) for name, _ in rows))
    lines = [f'{"run":<{width}}  {"state":<8}  {"step":>9}  {"success":>7}  note']
    for name, s in rows:
        step = '-' if s['step'] is None else str(s['step'])
        success = '-' if s['success'] is None else f'{s["success"]:.3f}'
        lines.append(f'{name:<{width}}  {s["state"]:<8}  {step:>9}  {success:>7}  {s["note"]}'.rstrip())
    counts = {state: sum(s['state'] == state for _, s in rows) for state in STATES}
    lines.append(f'{len(rows)} runs: ' + ', '.join(f'{n} {state}' for state, n in counts.items() if n))
    return lines


def _format(ci, seeds=None, count=None):
    mean, low, high = (100 * v for v in ci)
    return f'{mean:.1f} [{low:.1f}, {high:.1f}]' + (f' (n={count})' if seeds and count < seeds else '')


def results(sweep_dir):
    """{(env, method): {'offline': [success per seed], 'online': [...], 'seeds': n, 'curves': [(steps, success,
    offline steps)], 'steps': (offline steps, online steps), 'online_only': bool, 'protocol': 'qc' or 'qam'}} in
    SPEC order."""
    runs, _ = load_sweep(sweep_dir)
    table = {}
    for run in runs:
        path = run_dir(sweep_dir, run.name)
        entry = table.setdefault((run.env, run.method), dict(
            offline=[], online=[], curves=[], seeds=0, online_only=run.driver == 'main_online.py', steps=None,
            protocol=run.protocol,
        ))  # fmt: skip
        flags = run_files.read_flags(path)
        if entry['steps'] is None and flags:  # The phase lengths the runs were started with.
            entry['steps'] = (int(flags.get('offline_steps') or 0), int(flags.get('online_steps') or 0))
        values = run_files.phase_results(path)
        for phase, value in values.items():
            entry[phase].append(value)
        if values:
            entry['seeds'] += 1
        steps, success = run_files.eval_curve(path)
        if len(steps):
            entry['curves'].append((steps, success, run_files.run_phase_ends(path).get('offline', 0)))
    return table


def paper_cell(task, method, phase, entry, ours, seeds=None, rng=None):
    """(text, outside, p): the published success at the point matching the end of our `phase` in the paper of the
    entry's protocol, whether its 95% interval and ours (`ours`: (mean, low, high) or None) do not overlap, and,
    where the paper released its seeds, the permutation p-value of our `seeds` (one list per task) against its
    seeds at that point (None otherwise)."""
    name = entry['protocol']
    points = paper.curve(task, method, name) if task else None
    if points is None:
        return 'no published row', False, None
    if entry['steps'] is None:  # No run started yet.
        return '-', False, None
    offline, online = entry['steps']
    if (phase == 'offline' and (entry['online_only'] or not offline)) or (phase == 'online' and not online):
        return '-', False, None
    step = paper.paper_step(phase, offline, online, entry['online_only'], name)
    point = paper.point_at(points, step)
    if point is None:
        short_offline = offline < paper.PAPER_PHASE_STEPS
        short_online = online < paper.protocol(name).online_steps
        if phase == 'offline':
            short = short_offline
        else:
            short = short_online or (short_offline and not entry['online_only'])
        if short:
            return "shorter than the paper's protocol", False, None
        return 'no published point at this step', False, None
    text = _format((point.mean, point.low, point.high))
    if step != paper.protocol_step(phase, entry['online_only'], name):  # a shorter phase, compared at its own length
        text += f' after {offline if phase == "offline" else online:,} {phase} steps'
    outside = ours is not None and (ours[2] < point.low or ours[1] > point.high)
    p = None
    if point.seeds and seeds and len(seeds) == len(point.seeds) and all(seeds):
        p = stratified_permutation_p(seeds, point.seeds, rng if rng is not None else np.random.default_rng(0))
    return text, outside, p


def table_rows(sweep_dir, rng):
    """(label, method, entry, published task, {phase: our (mean, low, high) or None}, {phase: seeds there}, seeds,
    {phase: [our success per seed] per task}) per task x method, then one per paper domain (or `all`) whose every
    task has results of a method."""
    table = results(sweep_dir)
    name = next((e['protocol'] for e in table.values()), 'qc')
    rows = []
    for (env, method), entry in table.items():
        ours = {p: bootstrap_ci(entry[p], rng) if entry[p] else None for p in ('offline', 'online')}
        counts = {p: len(entry[p]) for p in ours}
        values = {p: [entry[p]] for p in ours}
        rows.append((env, method, entry, paper.published_task(env, name), ours, counts, entry['seeds'], values))
    for group, members in paper.aggregates(name).items():
        for method in dict.fromkeys(m for _, m in table):
            by_task = {paper.published_task(e, name): entry for (e, m), entry in table.items() if m == method}
            if not members or not all(t in by_task and by_task[t]['seeds'] for t in members):
                continue
            entries = [by_task[t] for t in members]
            ours = {p: bootstrap_mean_of_means([e[p] for e in entries], rng) if all(e[p] for e in entries) else None
                    for p in ('offline', 'online')}  # fmt: skip
            values = {p: [e[p] for e in entries] for p in ours}
            label = f'{group} ({len(members)} tasks, mean)'
            rows.append((label, method, entries[0], group, ours, {}, min(e['seeds'] for e in entries), values))
    return rows


def table_markdown(sweep_dir, seed=0):
    """The paper-style table: success (%) at the end of the offline and of the online phase per task x method,
    mean over seeds with a 95% bootstrap interval, and the number of seeds; next to each, the published value at
    the same point in the paper of the sweep's protocol (`analysis/paper.py`), marked `!` where the two intervals
    do not overlap; for the QAM paper, which released its seeds, also the permutation p-value of our seeds against
    its seeds there. A sweep over every task of a paper domain adds the domain's row (mean over its tasks)."""
    rng = np.random.default_rng(seed)
    runs, _ = load_sweep(sweep_dir)
    name = runs[0].protocol if runs else 'qc'
    with_p = paper.protocol(name).has_seeds
    title = 'paper' if name == 'qc' else paper.protocol(name).title
    columns = ['offline end (%)', f'{title} (%)'] + ['p'] * with_p + ['online end (%)', f'{title} (%)'] + ['p'] * with_p
    lines = ['| task | method | seeds | ' + ' | '.join(columns) + ' |', '|---|---|---:|' + '---|' * len(columns)]
    outside_any = False
    for label, method, entry, task, ours, counts, seeds, values in table_rows(sweep_dir, rng):
        cells = []
        for phase in ('offline', 'online'):
            ci = ours[phase]
            mine = '-' if ci is None else _format(ci, seeds, counts.get(phase, seeds))
            theirs, outside, p = paper_cell(task, method, phase, entry, ci, values[phase], rng)
            outside_any |= outside
            cells += [mine + (' !' if outside else ''), theirs] + ([f'{p:.2f}' if p is not None else '-'] * with_p)
        lines.append(f'| {label} | {method} | {seeds} | ' + ' | '.join(cells) + ' |')
    lines.append('')
    where = ("the published mean [95% interval] at the same point of the paper's protocol (1M offline, then 1M online "
             'steps; online-only methods 1M online)' if name == 'qc' else
             'the mean of its 12 released seeds [95% interval, the same bootstrap] at the same point of its protocol '
             '(1M offline, then 500K online steps; RLPD 500K online)')  # fmt: skip
    lines.append(f'Mean over seeds [95% bootstrap interval, {BOOTSTRAP_SAMPLES} resamples]; (n=k): only k seeds '
                 f'reached that point. {title}: {where}, or after as many steps of the same phase where a run is '
                 'shorter and the published curve has that point' + ('.' if not with_p else '; p: two-sided '
                 'permutation test of our seeds against its seeds there (within each task for a domain row).'))
    if outside_any:
        lines.append("!: our interval and the paper's do not overlap.")
    return '\n'.join(lines)


def plot_tasks(sweep_dir, out_dir, seed=0):
    """One learning-curve PNG per task: every method's seed mean with its 95% bootstrap band, steps counted from
    the start of the online phase (the offline phase is negative), the boundary marked, and the paper's published
    curve of the task and method dashed where there is one. Returns the paths."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    by_env = {}
    for (env, method), entry in results(sweep_dir).items():
        if entry['curves']:
            by_env.setdefault(env, []).append((method, entry))
    paths = []
    for env, methods in by_env.items():
        fig = task_figure(env, methods, rng)
        path = os.path.join(out_dir, f'{env.replace("/", "+")}.png')
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def task_figure(env, methods, rng):
    """The learning-curve figure of one task: `methods` is [(method, `results` entry)]; each method's published
    curve, where there is one, is drawn dashed in the same colour."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    any_offline = False
    name = methods[0][1]['protocol'] if methods else 'qc'
    task = paper.published_task(env, name)
    for method, entry in methods:
        curves = entry['curves']
        per_step = {}
        for steps, success, offline in curves:
            any_offline |= offline > 0
            for s, v in zip(steps - offline, success, strict=True):
                per_step.setdefault(float(s), []).append(v)
        xs = np.array(sorted(per_step))
        stats = [bootstrap_ci(per_step[x], rng) for x in xs]
        mean, low, high = (np.array(col) for col in zip(*stats, strict=True))
        (line,) = ax.plot(xs, mean, marker='o', markersize=3, label=f'{method} ({len(curves)} seeds)')
        ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        points = paper.curve(task, method, name) if task else None
        if points:
            offline_steps = entry['steps'][0] if entry['steps'] else 0
            paper.draw_phases(ax, points, offline_steps, (xs.min(), xs.max()), color=line.get_color(),
                              label=f'{method} ({paper.protocol(name).title})', name=name)  # fmt: skip
    if any_offline:
        ax.axvline(0, color='gray', linestyle='--', linewidth=1)
        for label, align in (('offline  ', 'right'), ('  online', 'left')):
            ax.text(0, 0.97, label, transform=ax.get_xaxis_transform(), ha=align, va='top', color='gray')
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel('step (0: start of online phase)')
    ax.set_ylabel('evaluation success')
    ax.set_title(env)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
