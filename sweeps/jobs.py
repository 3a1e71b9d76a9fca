"""Running a sweep's processes: one `Job` runs one or more driver processes side by side and records their state.

The same `Job` runs under both executors: the local one calls it in a thread pool, SLURM runs it through
submitit (array jobs). On a preemption or timeout submitit sends the job SIGUSR2 and calls `Job.checkpoint`,
which asks every driver to stop (SIGTERM: the driver writes a checkpoint and exits), waits for them, and hands
submitit the same job to requeue; the requeued job starts the drivers again with `--resume`.

State files: `<sweep dir>/jobs/<unit>.json` (what the process is doing) next to its `.out`/`.err` logs.
"""

import json
import os
import signal
import socket
import subprocess
import threading
import time

from utils.io_utils import atomic_write_bytes

JOBS_DIR = 'jobs'
STOP_TIMEOUT = 600  # Seconds a driver gets to write its checkpoint after SIGTERM (SLURM's KillWait bounds it too).


def state_path(sweep_dir, unit_name):
    return os.path.join(sweep_dir, JOBS_DIR, f'{unit_name}.json')


def read_state(sweep_dir, unit_name):
    """The recorded state of a unit's process (a dict), or None before it was ever submitted."""
    try:
        with open(state_path(sweep_dir, unit_name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_state(sweep_dir, unit_name, **state):
    path = state_path(sweep_dir, unit_name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_bytes(path, json.dumps(dict(state, time=time.time())).encode())


def last_error_line(path):
    """The last non-empty line a process wrote to `path` (progress-bar redraws split off), or ''."""
    try:
        with open(path, 'rb') as f:
            f.seek(max(0, os.path.getsize(path) - 65536))
            text = f.read().decode(errors='replace')
    except OSError:
        return ''
    lines = [line.strip() for line in text.replace('\r', '\n').splitlines() if line.strip()]
    return lines[-1] if lines else ''


def _ignore_usr2():
    # SLURM delivers its preemption signal to every process of the job; the drivers stop on the SIGTERM that
    # `Job.checkpoint` sends them instead (a second signal mid-checkpoint would kill them).
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class Job:
    """Runs `units` (list of (unit name, argv)) as parallel subprocesses in `cwd`; see the module docstring.

    Several processes in one job share its GPUs, so then JAX does not preallocate GPU memory. `device` (a GPU index
    for `CUDA_VISIBLE_DEVICES`) puts the processes on that one GPU; `shared` says other processes use it too.
    """

    def __init__(self, sweep_dir, units, cwd, device=None, shared=False):
        self.sweep_dir = sweep_dir
        self.units = list(units)
        self.cwd = cwd
        self.device = device
        self.shared = shared
        self._procs = {}
        self._codes = {}

    def __getstate__(self):
        # submitit pickles the job; its processes and lock belong to the process running it.
        return dict(sweep_dir=self.sweep_dir, units=self.units, cwd=self.cwd, device=self.device, shared=self.shared)

    def __setstate__(self, state):
        self.__init__(**state)

    def _env(self):
        env = dict(os.environ)
        if len(self.units) > 1 or self.shared:
            env['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'
        if self.device is not None:
            env['CUDA_VISIBLE_DEVICES'] = str(self.device)
        return env

    def __call__(self):
        """Runs every unit to its end; returns {unit name: exit status}."""
        job_id = _slurm_job_id()
        log_dir = os.path.join(self.sweep_dir, JOBS_DIR)
        os.makedirs(log_dir, exist_ok=True)
        waiters = []
        env = self._env()
        gpu = '' if self.device is None else f' CUDA_VISIBLE_DEVICES={env["CUDA_VISIBLE_DEVICES"]}'
        for name, argv in self.units:
            out = open(os.path.join(log_dir, f'{name}.out'), 'ab')
            err = open(os.path.join(log_dir, f'{name}.err'), 'ab')
            banner = f'=== {time.strftime("%Y-%m-%d %H:%M:%S")} {socket.gethostname()} job {job_id or "local"}{gpu}\n'
            for f in (out, err):
                f.write(banner.encode())
                f.flush()
            # Own session: a Ctrl-C meant for the launcher reaches the driver once, as `stop`'s SIGTERM.
            proc = subprocess.Popen(
                argv, cwd=self.cwd, env=env, stdout=out, stderr=err, preexec_fn=_ignore_usr2, start_new_session=True,
            )  # fmt: skip
            self._procs[name] = proc
            write_state(self.sweep_dir, name, state='running', pid=proc.pid, host=socket.gethostname(), job=job_id,
                        device=self.device)  # fmt: skip
            waiter = threading.Thread(target=self._wait, args=(name, proc, out, err, job_id), daemon=True)
            waiter.start()
            waiters.append(waiter)
        # Only the waiter threads touch the processes: a signal handler (`checkpoint`) running in this thread
        # while it sat inside `Popen.wait` could not wait for them itself.
        while any(w.is_alive() for w in waiters):
            for w in waiters:
                w.join(timeout=1.0)
        return dict(self._codes)

    def _wait(self, name, proc, out, err, job_id):
        code = proc.wait()
        out.close()
        err.close()
        if code == 0:
            write_state(self.sweep_dir, name, state='exited', returncode=0, job=job_id)
        else:
            error = last_error_line(err.name)
            write_state(self.sweep_dir, name, state='failed', returncode=code, error=error, job=job_id)
        self._codes[name] = code

    def stop(self, timeout=STOP_TIMEOUT):
        """Asks every running driver to checkpoint and exit (SIGTERM) and waits until they have."""
        running = [(name, proc) for name, proc in list(self._procs.items()) if name not in self._codes]
        for _, proc in running:
            _signal(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(name not in self._codes for name, _ in running) and time.monotonic() < deadline:
            time.sleep(0.2)
        for name, proc in running:
            if name not in self._codes:
                _signal(proc.pid, signal.SIGKILL)

    def checkpoint(self):
        """submitit's preemption/timeout hook: stop the drivers with a checkpoint, then requeue this same job."""
        import submitit

        # SLURM may repeat the signal; a second one must not interrupt the wait for the checkpoints.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        self.stop()
        for name, _ in self.units:
            write_state(self.sweep_dir, name, state='requeued', job=_slurm_job_id())
        return submitit.helpers.DelayedSubmission(Job(self.sweep_dir, self.units, self.cwd))


def _signal(pid, signum):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _slurm_job_id():
    """This SLURM job's id (`<array id>_<task>` for array tasks), or None outside SLURM."""
    array, task = os.environ.get('SLURM_ARRAY_JOB_ID'), os.environ.get('SLURM_ARRAY_TASK_ID')
    if array and task:
        return f'{array}_{task}'
    return os.environ.get('SLURM_JOB_ID')
