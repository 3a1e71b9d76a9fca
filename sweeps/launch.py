"""`sweep.py launch`: validate a SPEC, record it in the sweep directory, and submit every run not yet finished."""

import concurrent.futures
import dataclasses
import json
import os
import shutil
import signal

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


def launch(spec_path, sweep_dir, executor='local', max_parallel=1, runs_per_job=1, slurm=None):
    """Submits every unfinished run of the SPEC; returns the number of processes submitted (local: run)."""
    sweep_dir = os.path.abspath(sweep_dir)
    if executor not in ('local', 'slurm'):
        raise UserError(f'--executor must be local or slurm; got {executor!r}')
    if max_parallel < 1 or runs_per_job < 1:
        raise UserError('--max_parallel and --runs_per_job must be at least 1')
    if executor == 'slurm' and shutil.which('sbatch') is None:
        raise UserError('--executor=slurm needs sbatch on PATH (run on a SLURM login node), or use --executor=local')
    runs, per_process, units, todo, active = plan(spec_path, sweep_dir)
    _record(sweep_dir, runs, per_process, read_sweep(sweep_dir))
    done = len(units) - len(todo) - active
    print(f'{len(runs)} runs in {len(units)} processes: {done} finished, {active} queued or running, '
          f'{len(todo)} to start ({executor})')  # fmt: skip
    if not todo:
        return 0
    argvs = [(unit.name, unit.argv(sweep_dir)) for unit in todo]
    if executor == 'local':
        run_local(sweep_dir, argvs, max_parallel)
    else:
        submit_slurm(sweep_dir, argvs, runs_per_job, slurm or SlurmOptions())
    return len(todo)


def run_local(sweep_dir, argvs, max_parallel):
    """Runs the processes on this machine, `max_parallel` at a time, until all have exited. SIGTERM/SIGINT asks
    every running driver to checkpoint and stop; launching again continues them."""
    job_list = [jobs.Job(sweep_dir, [item], cwd=ROOT) for item in argvs]
    stopping = []

    def stop(signum, frame):
        stopping.append(signum)
        for job in job_list:
            job.stop()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    failed = []
    try:
        with concurrent.futures.ThreadPoolExecutor(max_parallel) as pool:
            futures = {}
            for job in job_list:
                futures[pool.submit(lambda j=job: None if stopping else j())] = job
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
