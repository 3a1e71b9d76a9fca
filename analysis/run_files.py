"""The files of a run directory, their names, the `finished.json` schema, and the readers of all of them.

    <save_dir>/<run_group>/<exp_name>/
        flags.json            the run's settings as its first start had them (`RunConfig.flag_record`)
        starts.json           every start of the run: when, where, from which step, and the settings it changed
                              (`read_flags` applies them: a run's settings as its last start had them)
        lock                  the record of the process that writes the directory (`utils.run_lock`)
        offline_agent.csv     training metrics of the offline phase, one row per `log_interval` steps
        online_agent.csv      training metrics of the online phase
        env.csv               statistics of the online episodes that ended since the previous row
        eval.csv              evaluations (`success`, `episode.return`, ...)
        finished.json         written once the run trained to its end (`write_finished`)
        checkpoints/          full training checkpoints (`training.checkpointing`)
        params_<step>.pkl     agent parameters alone, for notebooks (`utils.flax_utils.restore_agent_with_file`)
        videos/, data.pkl     rendered evaluation episodes; online simulator states (`--save_all_online_states`)

The trainer writes these files, and `sweeps/` and the plots read them only through this module. Every CSV log has
the step in its first column.
"""

import csv
import json
import math
import os
import time
from collections import OrderedDict

import numpy as np

from utils.io_utils import atomic_write, atomic_write_bytes

FLAGS_FILE = 'flags.json'
STARTS_FILE = 'starts.json'
FINISHED_FILE = 'finished.json'
EVAL_LOG = 'eval'
ENV_LOG = 'env'
CHECKPOINT_DIR = 'checkpoints'
VIDEO_DIR = 'videos'
STATES_FILE = 'data.pkl'
PHASES = ('offline', 'online')  # A run's phases, in order.
FINISHED_VERSION = 1


def agent_log(phase):
    """The name (CSV file stem and wandb prefix) of a phase's training-metric log."""
    return f'{phase}_agent'


LOGS = (agent_log('offline'), agent_log('online'), ENV_LOG, EVAL_LOG)  # Every CSV log a run writes.


def csv_name(log):
    return f'{log}.csv'


def csv_path(run_dir, log):
    return os.path.join(run_dir, csv_name(log))


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


def read_log(run_dir, log):
    """Columns of a run's CSV log (`read_csv`), {} when it is missing or empty."""
    try:
        return read_csv(csv_path(run_dir, log))
    except (OSError, StopIteration):
        return {}


def metric_column(columns, metric):
    """The column of `metric` under any of the names the loggers and the reference use, or None."""
    for candidate in (metric, f'eval/{metric}', f'episode.{metric}', f'eval/episode.{metric}'):
        if candidate in columns:
            return columns[candidate]
    return None


def eval_curve(run_dir, metric='success'):
    """(steps, values) of a run's evaluations of `metric` (empty arrays before the first)."""
    columns = read_log(run_dir, EVAL_LOG)
    values = metric_column(columns, metric)
    if values is None or 'step' not in columns:
        return np.zeros(0), np.zeros(0)
    keep = ~np.isnan(values)
    return columns['step'][keep], values[keep]


def last_step(run_dir):
    """The highest step any of a run's CSV logs reached (None before its first row)."""
    steps = []
    for log in LOGS:
        columns = read_log(run_dir, log)
        if len(columns.get('step', ())):
            steps.append(int(np.nanmax(columns['step'])))
    return max(steps) if steps else None


def drop_rows_after(path, step):
    """Rewrites a CSV log without its rows after `step`; no-op if absent."""
    if not os.path.exists(path):
        return
    with open(path, newline='') as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    header, body = rows[0], rows[1:]
    kept = [row for row in body if row and float(row[0]) <= step]
    if len(kept) == len(body):
        return

    def write(f):
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(kept)

    atomic_write(path, write, newline='')


def rewind(run_dir, step):
    """Leaves a run directory as an uninterrupted run leaves it at `step`: the CSV logs keep their rows up to `step`
    (a run starting from scratch, `step=0`, keeps none), and the end-of-run marker goes."""
    for log in LOGS:
        drop_rows_after(csv_path(run_dir, log), step)
    if os.path.exists(os.path.join(run_dir, FINISHED_FILE)):
        os.remove(os.path.join(run_dir, FINISHED_FILE))


def _read_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def read_first_flags(run_dir):
    """The settings the run's first start recorded (`flags.json`; {} when missing or unreadable)."""
    return _read_json(os.path.join(run_dir, FLAGS_FILE), {})


def read_starts(run_dir):
    """The run's starts, oldest first: dicts of `time`, `host`, `pid`, `argv`, `step` (the log step it started
    from) and `changed` ({setting: [before, after]}, the settings that may change between starts); [] when none
    was recorded."""
    starts = _read_json(os.path.join(run_dir, STARTS_FILE), [])
    return starts if isinstance(starts, list) else []


def read_flags(run_dir):
    """The run's settings as its last start had them: `flags.json` with every start's changes applied ({} when
    `flags.json` is missing or unreadable)."""
    flags = read_first_flags(run_dir)
    if flags:
        for start in read_starts(run_dir):
            for name, (_, after) in start.get('changed', {}).items():
                flags[name] = after
    return flags


def write_starts(run_dir, starts):
    """Writes the run's list of starts (`read_starts`) atomically."""
    text = '[\n' + ',\n'.join(json.dumps(start) for start in starts) + '\n]\n'  # one start a line
    atomic_write_bytes(os.path.join(run_dir, STARTS_FILE), text.encode())


def phase_ends(flags):
    """{'offline': step, 'online': step}: where each phase of a run with these flags ends (a phase it does not have
    is left out)."""
    offline, online = int(flags.get('offline_steps') or 0), int(flags.get('online_steps') or 0)
    ends = {}
    if offline > 0:
        ends['offline'] = offline
    if online > 0:
        ends['online'] = offline + online
    return ends


def write_finished(run_dir, step, phases):
    """Marks a run as trained to its end. The schema of `finished.json`:

        version       FINISHED_VERSION
        step          the run's last step
        finished_at   seconds since the epoch
        phases        per phase: dict(phase, steps, updates, seconds, updates_per_s, eval_step, success, return);
                      `eval_step` is the phase's last step and `success`/`return` its evaluation there (or None)
    """
    record = dict(version=FINISHED_VERSION, step=int(step), finished_at=time.time(), phases=list(phases))
    atomic_write_bytes(os.path.join(run_dir, FINISHED_FILE), json.dumps(record).encode())


def read_finished(run_dir):
    """The run's `finished.json` record, or None while the run has not finished."""
    try:
        with open(os.path.join(run_dir, FINISHED_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_finished(run_dir):
    return os.path.isfile(os.path.join(run_dir, FINISHED_FILE))


def run_phase_ends(run_dir):
    """Where each phase of the run in `run_dir` ends: from `finished.json` when it finished, else from its flags."""
    record = read_finished(run_dir)
    if record is not None and record.get('phases'):
        return {p['phase']: p['eval_step'] for p in record['phases']}
    return phase_ends(read_flags(run_dir))


def phase_results(run_dir):
    """{phase: success of the evaluation at the end of that phase} of a run (phases not reached are left out)."""
    steps, success = eval_curve(run_dir)
    values = {}
    for phase, end in run_phase_ends(run_dir).items():
        hit = np.flatnonzero(steps == end)
        if len(hit):
            values[phase] = float(success[hit[-1]])
    return values
