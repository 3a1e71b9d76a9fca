"""`sweep.py launch`: validate a SPEC, record it in the sweep directory, and submit every run not yet finished."""

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import threading

from sweeps import jobs
from sweeps.report import is_finished, run_dir, unit_active
from sweeps.spec import ROOT, SpecError, check_units, expand, group_units, load_spec
from utils.errors import UserError
from utils.io_utils import atomic_write_bytes

SWEEP_FILE = 'sweep.json'


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    """sbatch settings of every job of a launch (None: the cluster's default)."""

    partition: str | None = None
    gpus: int | None = None  # GPUs per job (per node).
    cpus: int | None = None  # CPUs per task.
    mem: str | None = None  # e.g. '64G'.
    time: int = 24 * 60  # Minutes per job; a job that hits it checkpoints and is requeued.
    account: str | None = None
    array_parallelism: int = 256  # Array tasks running at once.
    signal_delay: int = 120  # Seconds before the time limit at which SLURM sends the stop signal.
    max_timeouts: int = 20  # Times a job that reaches its time limit is requeued (preemptions do not count).


def read_sweep(sweep_dir):
    """The recorded sweep (`sweep.json`): its runs and how they were grouped; None for a new directory."""
    try:
        with open(os.path.join(sweep_dir, SWEEP_FILE)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UserError(f'{os.path.join(sweep_dir, SWEEP_FILE)} cannot be read ({e}); is {sweep_dir} a sweep?') from e


def _record(sweep_dir, runs, seeds_per_process, previous):
    """Adds `runs` to the sweep's record (runs of earlier launches into the same directory stay)."""
    known = {r['name']: r for r in (previous or {}).get('runs', [])}
    for run in runs:
        known[run.name] = dataclasses.asdict(run)
    record = dict(seeds_per_process=seeds_per_process, runs=list(known.values()))
    os.makedirs(sweep_dir, exist_ok=True)
    atomic_write_bytes(os.path.join(sweep_dir, SWEEP_FILE), json.dumps(record, indent=1).encode())


def plan(spec_path, sweep_dir):
    """(runs, seeds_per_process, units, units to start, number of units queued or running) of a SPEC in
    `sweep_dir`, validated; nothing is written."""
    runs, per_process = expand(load_spec(spec_path), where=f'SPEC {spec_path}')
    previous = read_sweep(sweep_dir)
    if previous and previous.get('seeds_per_process', 1) != per_process:
        started = [r for r in runs if os.path.isdir(run_dir(sweep_dir, r.name)) and not is_finished(sweep_dir, r.name)]
        if started:
            raise SpecError(
                f'{sweep_dir} was launched with seeds_per_process={previous["seeds_per_process"]}; keep it (its '
                f'runs resume from checkpoints written that way) or launch into a new directory'
            )
    units = group_units(runs, per_process)
    check_units(units, sweep_dir)
    todo, active = [], 0
    for unit in units:
        if all(is_finished(sweep_dir, r.name) for r in unit.runs):
            continue
        if unit_active(sweep_dir, unit.name):
            print(f'{unit.name}: already queued or running; not submitted again')
            active += 1
            continue
        todo.append(unit)
    return runs, per_process, units, todo, active


def listed_gpus():
    """The GPU indices `nvidia-smi -L` lists (as strings), or None where it cannot be asked."""
    if shutil.which('nvidia-smi') is None:
        return None
    try:
        out = subprocess.run(['nvidia-smi', '-L'], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [m.group(1) for m in re.finditer(r'^GPU (\d+):', out.stdout, flags=re.MULTILINE)]


def parse_devices(text):
    """The GPUs of `--devices`: `all` (the visible ones: `CUDA_VISIBLE_DEVICES`, else what `nvidia-smi -L` lists) or
    a comma-separated list of distinct GPU indices, each one the machine has where `nvidia-smi -L` can tell."""
    listed = listed_gpus()
    if text == 'all':
        visible = [d.strip() for d in os.environ.get('CUDA_VISIBLE_DEVICES', '').split(',') if d.strip()]
        devices = visible or listed
        if not devices:
            raise UserError('--devices=all: no GPU is visible here (CUDA_VISIBLE_DEVICES is unset and nvidia-smi -L '
                            'lists none); name the GPUs, e.g. --devices=0,1')  # fmt: skip
        return devices
    devices = [d.strip() for d in text.split(',')]
    if not all(re.fullmatch(r'\d+', d) for d in devices):
        raise UserError(f'--devices={text}: expected all or GPU indices separated by commas, e.g. --devices=0,1,2,3')
    devices = [str(int(d)) for d in devices]
    repeated = sorted({d for d in devices if devices.count(d) > 1}, key=int)
    if repeated:
        raise UserError(f'--devices={text} names GPU {", ".join(repeated)} twice; use --runs_per_device for several '
                        'processes per GPU')  # fmt: skip
    missing = [d for d in devices if listed is not None and d not in listed]
    if missing:
        raise UserError(f'--devices={text}: this machine has no GPU {", ".join(missing)} (nvidia-smi -L lists '
                        f'{", ".join(listed) or "none"})')  # fmt: skip
    return devices


def launch(spec_path, sweep_dir, executor='local', max_parallel=None, runs_per_job=1, slurm=None, devices=None,
           runs_per_device=1):  # fmt: skip
    """Submits every unfinished run of the SPEC; returns the number of processes submitted (local: run).

    Local: `max_parallel` processes at a time (default 1); with `devices` (see `parse_devices`), each process gets one
    of them as its only GPU, at most `runs_per_device` processes per GPU at a time (default for `max_parallel`: all
    of them)."""
    sweep_dir = os.path.abspath(sweep_dir)
    if executor not in ('local', 'slurm'):
        raise UserError(f'--executor must be local or slurm; got {executor!r}')
    if (max_parallel is not None and max_parallel < 1) or runs_per_job < 1 or runs_per_device < 1:
        raise UserError('--max_parallel, --runs_per_job and --runs_per_device must be at least 1')
    if executor == 'slurm' and devices is not None:
        raise UserError('--devices is for --executor=local; on SLURM each job gets its GPUs from --gpus, and '
                        '--runs_per_job packs processes into a job')  # fmt: skip
    if executor == 'slurm' and shutil.which('sbatch') is None:
        raise UserError('--executor=slurm needs sbatch on PATH (run on a SLURM login node), or use --executor=local')
    devices = parse_devices(devices) if devices is not None else None
    runs, per_process, units, todo, active = plan(spec_path, sweep_dir)
    _record(sweep_dir, runs, per_process, read_sweep(sweep_dir))
    done = len(units) - len(todo) - active
    print(f'{len(runs)} runs in {len(units)} processes: {done} finished, {active} queued or running, '
          f'{len(todo)} to start ({executor})')  # fmt: skip
    if not todo:
        return 0
    argvs = [(unit.name, unit.argv(sweep_dir)) for unit in todo]
    if executor == 'local':
        run_local(sweep_dir, argvs, max_parallel, devices, runs_per_device)
    else:
        submit_slurm(sweep_dir, argvs, runs_per_job, slurm or SlurmOptions())
    return len(todo)


class DevicePool:
    """Hands each process the least-loaded GPU of `devices` that runs fewer than `per_device` processes, waiting
    while every GPU is full, and takes it back when the process ends."""

    def __init__(self, devices, per_device):
        self.load = dict.fromkeys(devices, 0)
        self.per_device = per_device
        self.free = threading.Condition()

    @contextlib.contextmanager
    def device(self):
        with self.free:
            self.free.wait_for(lambda: min(self.load.values()) < self.per_device)
            device = min(self.load, key=self.load.get)  # least loaded; ties go to the first listed
            self.load[device] += 1
        try:
            yield device
        finally:
            with self.free:
                self.load[device] -= 1
                self.free.notify()


def run_local(sweep_dir, argvs, max_parallel=None, devices=None, runs_per_device=1):
    """Runs the processes on this machine until all have exited: `max_parallel` at a time (default 1), or with
    `devices` one GPU each, at most `runs_per_device` per GPU (see `launch`). SIGTERM/SIGINT asks every running
    driver to checkpoint and stop; launching again continues them."""
    job_list = [jobs.Job(sweep_dir, [item], cwd=ROOT, shared=devices is not None and runs_per_device > 1)
                for item in argvs]  # fmt: skip
    pool = DevicePool(devices, runs_per_device) if devices else None
    capacity = len(devices) * runs_per_device if devices else 1
    max_parallel = min(max_parallel or capacity, capacity) if devices else max_parallel or 1
    stopping = []

    def stop(signum, frame):
        stopping.append(signum)
        for job in job_list:
            job.stop()

    def run_job(job):
        if stopping:
            return None
        if pool is None:
            return job()
        with pool.device() as device:
            job.device = device
            return None if stopping else job()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    failed = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_parallel) as executor:
            futures = {}
            for job in job_list:
                futures[executor.submit(run_job, job)] = job
            for future in concurrent.futures.as_completed(futures):
                codes = future.result() or {}
                failed += [name for name, code in codes.items() if code != 0]
                for name, code in codes.items():
                    print(f'{name}: {"finished" if code == 0 else f"failed (exit {code})"}', flush=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if stopping:
        raise UserError('stopped; the runs wrote checkpoints; launch again to continue them')
    if failed:
        raise UserError(f'{len(failed)} runs failed; see `python sweep.py status {sweep_dir}`')


def submit_slurm(sweep_dir, argvs, runs_per_job, options):
    """Submits one SLURM array: each task runs `runs_per_job` processes side by side."""
    import submitit

    executor = submitit.SlurmExecutor(
        folder=os.path.join(sweep_dir, 'submitit', '%j'), max_num_timeout=options.max_timeouts
    )
    params = dict(
        job_name=os.path.basename(sweep_dir.rstrip('/')) or 'sweep',
        time=options.time,
        array_parallelism=options.array_parallelism,
        signal_delay_s=options.signal_delay,
        # The job unpickles `sweeps.jobs.Job`, so the repository must be importable there.
        setup=[f'export PYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}}'],
        additional_parameters={'requeue': True},
    )
    for key, value in (
        ('partition', options.partition),
        ('gpus_per_node', options.gpus),
        ('cpus_per_task', options.cpus),
        ('mem', options.mem),
        ('account', options.account),
    ):
        if value is not None:
            params[key] = value
    executor.update_parameters(**params)
    groups = [argvs[i : i + runs_per_job] for i in range(0, len(argvs), runs_per_job)]
    job_list = [jobs.Job(sweep_dir, group, cwd=ROOT) for group in groups]
    try:
        with executor.batch():
            submitted = [executor.submit(job) for job in job_list]
    except Exception as e:
        raise UserError(f'sbatch refused the jobs: {str(e).strip().splitlines()[-1]}') from e
    for job, handle in zip(job_list, submitted, strict=True):
        for name, _ in job.units:
            jobs.write_state(sweep_dir, name, state='submitted', job=handle.job_id)
    ids = ', '.join(h.job_id for h in submitted[:3]) + (' ...' if len(submitted) > 3 else '')
    print(f'submitted {len(job_list)} SLURM jobs ({ids}); follow them with: python sweep.py status {sweep_dir}')
