"""A run directory holds one run: a resume with other settings is refused before anything loads, one process writes
a directory at a time (and a dead one never blocks the next), and every start is recorded."""

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import ROOT, TINY_CUBE_RUN, parse_run, run_driver

import main
import main_online
from agents import agents
from analysis import run_files
from sweeps import jobs, report, spec
from training import Trainer, run_dirs, setup
from training.config import length_conflicts, resume_conflicts
from utils import run_lock
from utils.errors import UsageError

RUN = [
    *TINY_CUBE_RUN, '--offline_steps=4', '--online_steps=0', '--log_interval=2', '--eval_interval=4',
    '--save_interval=4', '--exp_name=r1',
]  # fmt: skip


pytestmark = pytest.mark.usefixtures('no_wandb')


def argv_for(cube_dir, save_dir, *extra):
    return [*RUN, f'--dataset_dir={cube_dir}', f'--save_dir={save_dir}', *extra]


@pytest.fixture(scope='module')
def trained(cube_dir, tmp_path_factory):
    """The save_dir of run r1, trained 4 offline steps with a checkpoint at step 4."""
    save_dir = tmp_path_factory.mktemp('trained')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv('WANDB_MODE', 'disabled')
        Trainer(parse_run(main.PRESET, argv_for(cube_dir, save_dir)), agents).train()
    return save_dir


@pytest.fixture
def run_copy(trained, tmp_path):
    """(save_dir, run_dir) of a fresh copy of the trained run."""
    shutil.copytree(trained, tmp_path / 'exp')
    return tmp_path / 'exp', str(tmp_path / 'exp' / 'Debug' / 'r1')


def snapshot(path):
    """Every file under `path` with its size, modification time and bytes."""
    files = {}
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            with open(full, 'rb') as f:
                files[full] = (os.path.getsize(full), os.stat(full).st_mtime_ns, f.read())
    return files


def nothing_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError('the run loaded its data before refusing')

    monkeypatch.setattr(setup, 'make_run_envs', refuse)


@pytest.mark.parametrize(
    'preset, extra, message',
    [
        (main.PRESET, ['--agent.actor_type=best-of-n'], '--agent.actor_type=distill-ddpg (now best-of-n)'),
        (main.PRESET, ['--env_name=cube-single-play-singletask-task3-v0'],
         '--env_name=cube-single-play-singletask-task2-v0 (now cube-single-play-singletask-task3-v0)'),
        (main.PRESET, ['--horizon_length=3'], '--horizon_length=2 (now 3)'),
        (main.PRESET, ['--seed=1'], '--seed=0 (now 1)'),
        (main.PRESET, ['--sparse=True', '--agent.lr=0.001'],
         '--sparse=False (now True); --agent.lr=0.0003 (now 0.001)'),
        (main_online.PRESET, [], 'the driver main.py (now main_online.py)'),
    ],
    ids=['agent key', 'task', 'horizon', 'seed', 'two settings', 'driver'],
)  # fmt: skip
def test_a_resume_with_other_settings_is_refused_before_loading_and_writes_nothing(
    run_copy, cube_dir, monkeypatch, preset, extra, message
):
    save_dir, run_dir = run_copy
    before = snapshot(run_dir)
    nothing_loads(monkeypatch)
    argv = argv_for(cube_dir, save_dir, '--resume', *extra)
    if not preset.offline:  # the other driver, with this run's agent file (named first) and no offline flags
        argv = ['--agent=agents/acfql.py', *(a for a in argv if not a.startswith(('--offline_steps', '--fused_steps')))]
    with pytest.raises(UsageError) as refused:
        Trainer(parse_run(preset, argv), agents)
    text = str(refused.value)
    assert refused.value.exit_code == 2 and '\n' not in text
    assert text.startswith(f'{run_dir} was started with other settings') and message in text, text
    assert 'another --exp_name' in text
    assert snapshot(run_dir) == before


def test_a_resume_shorter_than_the_steps_done_is_refused_once_its_checkpoint_is_read(run_copy, cube_dir):
    # The step comes from the checkpoint that loads (a newer damaged file is set aside), so after loading; before
    # anything is written but the lock file's record.
    save_dir, run_dir = run_copy
    before = {path: data for path, (_, _, data) in snapshot(run_dir).items()}
    message = r'r1 cannot resume at step 4 with these phase lengths: --offline_steps=2 is below the 4 offline steps'
    with pytest.raises(UsageError, match=message):
        Trainer(parse_run(main.PRESET, argv_for(cube_dir, save_dir, '--resume', '--offline_steps=2')), agents)
    assert {path: data for path, (_, _, data) in snapshot(run_dir).items()} == before
    run_lock.check_free(run_dir)  # and let go


def test_the_driver_refuses_a_resume_with_another_horizon_in_one_line(run_copy, cube_dir):
    # Before this check the run reached its first update and died in a JAX traceback.
    save_dir, run_dir = run_copy
    before = snapshot(run_dir)
    proc = run_driver('main.py', argv_for(cube_dir, save_dir, '--resume', '--horizon_length=3'))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
    assert '--horizon_length=2 (now 3)' in lines[0]
    assert snapshot(run_dir) == before


def test_a_resume_may_change_lengths_intervals_and_speed_and_each_start_is_recorded(run_copy, cube_dir):
    save_dir, run_dir = run_copy
    first = open(os.path.join(run_dir, run_files.FLAGS_FILE)).read()
    extra = ['--resume', '--offline_steps=6', '--eval_interval=2', '--fused_steps=1', '--save_interval=6']
    Trainer(parse_run(main.PRESET, argv_for(cube_dir, save_dir, *extra)), agents).train()
    assert open(os.path.join(run_dir, run_files.FLAGS_FILE)).read() == first  # the first start's record stays
    starts = run_files.read_starts(run_dir)
    assert [s['step'] for s in starts] == [0, 4] and starts[0]['changed'] == {}
    assert starts[1]['changed'] == dict(offline_steps=[4, 6], eval_interval=[4, 2], fused_steps=[2, 1],
                                        save_interval=[4, 6])  # fmt: skip
    assert starts[1]['pid'] == os.getpid() and starts[1]['host'] == socket.gethostname()
    assert run_files.read_flags(run_dir)['offline_steps'] == 6 and run_files.run_phase_ends(run_dir) == {'offline': 6}
    assert [int(float(r)) for r in run_files.eval_curve(run_dir)[0]] == [4, 6]
    # Once the offline phase has ended, its length can no longer change, nor the online one shrink below what was done.
    record = run_files.read_flags(run_dir)
    run = parse_run(main.PRESET, argv_for(cube_dir, save_dir, '--resume', '--offline_steps=8', '--online_steps=1'))
    assert length_conflicts(record, run, done_step=8) == ['--offline_steps=6 (now 8; the offline phase has ended)',
                                                          '--online_steps=1 is below the 2 online steps done']


def test_a_record_without_a_newer_setting_counts_it_as_its_default_and_locations_may_move(cube_dir, tmp_path):
    run = parse_run(main.PRESET, argv_for(cube_dir, tmp_path))
    record = json.loads(json.dumps(run.flag_record))
    old = {k: v for k, v in record.items() if k not in ('preset', 'sparse')}  # as code before these settings wrote it
    old['agent'] = {k: v for k, v in record['agent'].items() if k != 'tau'}  # left at its default by this run
    assert resume_conflicts(old, run) == []
    moved = dict(record, dataset_dir='/elsewhere', compilation_cache_dir='none')
    assert resume_conflicts(moved, run) == []
    sharded = dict(record, ogbench_dataset_dir='/shards')  # whether shards are cycled defines the run
    assert resume_conflicts(sharded, run) == ['--ogbench_dataset_dir=/shards (now None)']
    removed = dict(record, agent=dict(record['agent'], gone_key=1))
    assert resume_conflicts(removed, run) == ['--agent.gone_key=1 (now <no such setting>)']


def test_each_seed_of_a_several_seed_resume_is_checked_against_its_own_record(cube_dir, tmp_path):
    run = parse_run(main.PRESET, argv_for(cube_dir, tmp_path, '--seeds=0,1', '--resume'))
    other = parse_run(main.PRESET, argv_for(cube_dir, tmp_path, '--seeds=0,1', '--resume', '--agent.discount=0.9'))
    dirs = [str(tmp_path / f'r1_sd{s}') for s in run.seeds]
    for seed, run_dir in zip(run.seeds, dirs, strict=True):
        os.makedirs(os.path.join(run_dir, run_files.CHECKPOINT_DIR))
        open(os.path.join(run_dir, run_files.CHECKPOINT_DIR, 'ckpt_000000000004.pkl'), 'w').close()
        run_dirs.record_start(run_dir, run.for_seed(seed), 0, resumed=False)  # each record names its own seed
    run_dirs.check(run, dirs)  # the same settings pass
    run_dirs.record_start(dirs[1], other.for_seed(1), 0, resumed=False)  # seed 1 alone was started otherwise
    with pytest.raises(UsageError, match=r'r1_sd1 was started with other settings.*: --discount=0.9 \(now 0.99\)\.'):
        run_dirs.check(run, dirs)


# One writer at a time.


def test_a_second_process_on_a_run_directory_is_refused_naming_the_holder(run_copy, cube_dir):
    save_dir, run_dir = run_copy
    lock = run_lock.RunLock.acquire(run_dir)  # this process holds it, as a running driver would
    try:
        before = snapshot(run_dir)
        for again in (['--resume'], []):  # a requeue, and a double submission of the first command
            proc = run_driver('main.py', argv_for(cube_dir, save_dir, *again))
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 2 and len(lines) == 1, proc.stderr
            assert lines[0].startswith(f'error: {run_dir} is in use by pid {os.getpid()} on {socket.gethostname()}')
            assert snapshot(run_dir) == before
        with pytest.raises(run_lock.RunDirLocked):  # another holder in this process too (a notebook)
            Trainer(parse_run(main.PRESET, argv_for(cube_dir, save_dir, '--resume')), agents)
    finally:
        lock.release()
    assert open(run_lock.lock_path(run_dir)).read() == ''  # let go: emptied


HOLD = ('import sys, time; from utils.run_lock import RunLock; RunLock.acquire(sys.argv[1]); print(1, flush=True); '
        'time.sleep(600)')  # a process that holds a run directory until it is killed


def test_a_holder_killed_with_sigkill_never_blocks_the_next_start(run_copy, cube_dir):
    save_dir, run_dir = run_copy
    holder = subprocess.Popen([sys.executable, '-c', HOLD, run_dir], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == '1'
    with pytest.raises(run_lock.RunDirLocked, match=f'in use by pid {holder.pid} '):
        run_lock.check_free(run_dir)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert run_lock.read_holder(run_dir)['pid'] == holder.pid  # a killed holder leaves its record...
    run_lock.check_free(run_dir)  # ...and the kernel dropped its lock
    Trainer(parse_run(main.PRESET, argv_for(cube_dir, save_dir, '--resume', '--offline_steps=6')), agents).train()
    assert run_files.read_finished(run_dir)['step'] == 6


def test_without_shared_locks_a_holder_is_alive_by_its_pid_here_and_its_heartbeat_elsewhere(tmp_path, monkeypatch):
    run_dir = str(tmp_path / 'run')
    os.makedirs(run_dir)

    def hold(**record):
        record = dict(dict(host=socket.gethostname(), pid=os.getpid(), since=time.time(), heartbeat=time.time()),
                      **record)  # fmt: skip
        with open(run_lock.lock_path(run_dir), 'w') as f:
            json.dump(record, f)

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, 'No locks available')

    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    # Locks work, but not between hosts (Lustre's localflock): the heartbeat of another host's holder decides.
    hold(host='node-b', pid=1)
    with pytest.raises(run_lock.RunDirLocked, match='in use by pid 1 on node-b'):
        run_lock.check_free(run_dir)
    hold(host='node-b', pid=1, heartbeat=time.time() - run_lock.STALE_S - 1)
    run_lock.RunLock.acquire(run_dir).release()
    monkeypatch.setattr(run_lock.fcntl, 'flock', no_locks)
    # A second holder in this process is refused too.
    for record, alive in [(dict(pid=os.getppid()), True), (dict(pid=os.getpid()), True), (dict(pid=dead.pid), False),
                          (dict(host='node-b'), True), (dict(host='node-b', heartbeat=0.0), False)]:  # fmt: skip
        hold(**record)
        if alive:
            with pytest.raises(run_lock.RunDirLocked):
                run_lock.RunLock.acquire(run_dir)
        else:
            lock = run_lock.RunLock.acquire(run_dir)
            assert run_lock.read_holder(run_dir)['pid'] == os.getpid()
            lock.release()


def test_the_holder_beats_its_heartbeat_in_place(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, 'HEARTBEAT_S', 0.05)
    lock = run_lock.RunLock.acquire(str(tmp_path))
    inode = os.stat(run_lock.lock_path(str(tmp_path))).st_ino
    first = run_lock.read_holder(str(tmp_path))['heartbeat']
    deadline = time.time() + 10
    while run_lock.read_holder(str(tmp_path))['heartbeat'] == first and time.time() < deadline:
        time.sleep(0.02)
    assert run_lock.read_holder(str(tmp_path))['heartbeat'] > first
    assert os.stat(run_lock.lock_path(str(tmp_path))).st_ino == inode  # the file the flock is on
    lock.release()
    assert run_lock.read_holder(str(tmp_path)) is None


def test_a_requeued_sweep_job_with_changed_settings_is_refused_and_status_says_why(cube_dir, tmp_path):
    # The run was started by an earlier SPEC (or code) whose agent config differed; the run name stayed.
    flags = {'offline_steps': 4, 'online_steps': 0, 'agent.batch_size': 8, 'dataset_dir': str(cube_dir)}
    body = dict(methods=['QC'], envs=['cube-single-play-singletask-task2-v0'], seeds=[0], flags=flags)
    runs, per_process = spec.expand(body)
    [unit] = spec.group_units(runs, per_process)
    sweep_dir = str(tmp_path / 'sweep')
    os.makedirs(sweep_dir)
    with open(os.path.join(sweep_dir, 'sweep.json'), 'w') as f:
        json.dump(dict(runs=[r.__dict__ for r in runs], seeds_per_process=per_process), f)
    argv = unit.argv(sweep_dir)
    run_dir = report.run_dir(sweep_dir, runs[0].name)
    recorded = parse_run(main.PRESET, [*argv[2:], '--agent.alpha=300'])
    os.makedirs(os.path.join(run_dir, run_files.CHECKPOINT_DIR))
    open(os.path.join(run_dir, run_files.CHECKPOINT_DIR, 'ckpt_000000000002.pkl'), 'w').close()
    run_dirs.record_start(run_dir, recorded.for_seed(0), 0, resumed=False)
    codes = jobs.Job(sweep_dir, [(unit.name, argv)], cwd=ROOT)()
    assert codes == {unit.name: 2}
    [line] = [line for line in report.status_lines(sweep_dir) if line.startswith(runs[0].name)]
    assert ' failed ' in line and '--agent.alpha=300.0 (now 100.0)' in line and 'another --exp_name' in line, line
