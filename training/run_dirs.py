"""A run directory holds one run: one process writes it at a time, a resume keeps the settings that define the run,
and every start is recorded.

    check(run, run_dirs)     before anything loads: refuses a directory another process holds, a directory with
                             checkpoints without --resume, and a resume with settings that differ from the recorded
                             ones (`training.config.resume_conflicts`); reads only
    claim(run, run_dirs)     before the first write: holds every directory (`utils.run_lock.RunLock`) and checks again
    check_lengths(...)       once the checkpoint is loaded (its step is known): phase lengths below the steps done
    record_start(...)        with the logs: `flags.json` on a first start, one entry of `starts.json` on every start
"""

import dataclasses
import os
import socket
import sys
import time

from analysis import run_files
from log_utils import save_flags
from training.config import LOCATION, MAY_CHANGE, RunConfig, comparable, length_conflicts, resume_conflicts
from utils import run_lock
from utils.checkpoints import checkpoint_steps
from utils.errors import UsageError

# The settings a start records when it changes them (the others define the run, or name its directory).
RECORDED_CHANGES = tuple(f.name for f in dataclasses.fields(RunConfig)
                         if f.metadata and f.metadata['on_resume'] in (MAY_CHANGE, LOCATION))  # fmt: skip


def make_run_dir(run_dir):
    """Creates `run_dir`; refuses an unwritable location."""
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f'cannot create the run directory {run_dir} ({e.strerror}); choose another --save_dir') from e
    if not os.access(run_dir, os.W_OK):
        raise UsageError(f'the run directory {run_dir} is not writable; choose another --save_dir')


def _checkpoints(run_dir):
    return checkpoint_steps(os.path.join(run_dir, run_files.CHECKPOINT_DIR))


def check(run, run_dirs, held=False):
    """Refuses (one line each, exit status 2) what would make a directory of `run_dirs` (one per seed of `run`, in
    the order of its seeds) hold more than one run; see the module docstring. Writes nothing. `held`: this process
    holds the directories already."""
    if not held:
        for run_dir in run_dirs:
            run_lock.check_free(run_dir)
    steps = [_checkpoints(d) for d in run_dirs]
    if not run.resume:
        for run_dir, found in zip(run_dirs, steps, strict=True):
            if found:
                raise UsageError(f'{run_dir} already holds checkpoints; add --resume to continue it, or pick another '
                                 '--exp_name')  # fmt: skip
        return
    for seed, run_dir, found in zip(run.seeds, run_dirs, steps, strict=True):
        # Without checkpoints there is nothing to continue: the run starts from scratch with its own settings (a
        # seed without them beside seeds with them is refused on loading); without flags.json, nothing to compare.
        record = run_files.read_flags(run_dir) if found else {}
        conflicts = resume_conflicts(record, run.for_seed(seed)) if record else []
        if conflicts:
            raise UsageError(
                f'{run_dir} was started with other settings, which a resume cannot change: {"; ".join(conflicts)}. '
                'Resume with the recorded values, or start a new run with another --exp_name'
            )


def check_lengths(run, run_dirs, done_step):
    """Refuses phase lengths that a resume from log step `done_step` (its checkpoint's) cannot take: below the steps
    done, or an offline phase that ended and would now be longer or shorter."""
    for seed, run_dir in zip(run.seeds, run_dirs, strict=True):
        record = run_files.read_flags(run_dir)
        conflicts = length_conflicts(record, run.for_seed(seed), done_step) if record else []
        if conflicts:
            raise UsageError(
                f'{run_dir} cannot resume at step {done_step} with these phase lengths: {"; ".join(conflicts)}. Give '
                'lengths that reach past the steps done (the recorded offline length once that phase has ended)'
            )


def claim(run, run_dirs):
    """Holds every directory of `run_dirs` (made where missing) for this process, then checks them again (another
    process may have written them since `check`); returns the `RunLock`s, for `release`."""
    locks = []
    try:
        for run_dir in run_dirs:
            make_run_dir(run_dir)
            locks.append(run_lock.RunLock.acquire(run_dir))
        check(run, run_dirs, held=True)
    except BaseException:
        release(locks)
        raise
    return locks


def release(locks):
    """Lets go of the directories `claim` held."""
    for lock in locks:
        lock.release()


def record_start(run_dir, run, step, resumed):
    """Records this start of the single-seed `run` in `run_dir`: a start from scratch writes `flags.json` and begins
    `starts.json` anew; a resumed one (from log step `step`) adds its entry, with the settings it changed."""
    record = comparable(run.flag_record)
    entry = dict(time=time.time(), host=socket.gethostname(), pid=os.getpid(), argv=sys.argv, step=step, changed={})
    previous = run_files.read_flags(run_dir) if resumed else {}
    if not resumed or not previous:
        save_flags(run_dir, record, filename=run_files.FLAGS_FILE)
        starts = []
    else:
        starts = run_files.read_starts(run_dir)
        entry['changed'] = {k: [previous.get(k), record[k]] for k in RECORDED_CHANGES
                            if k in record and previous.get(k) != record[k]}  # fmt: skip
    run_files.write_starts(run_dir, [*starts, entry])
