"""Sweeps: SPEC expansion and refusals, the status/table readers, and tiny sweeps through the local executor and a
real single-node SLURM cluster (started by the test with scripts/slurm_local.sh)."""

import getpass
import glob
import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import ROOT, fake_run, read_csv, subprocess_env

from analysis import run_files
from sweeps import jobs, launch, presets, report, spec
from training import paper_settings
from training.paper_settings import domain_flags
from utils import run_lock
from utils.checkpoints import checkpoint_steps
from utils.errors import UserError

ENV = 'cube-single-play-singletask-task2-v0'
TINY_FLAGS = {
    'online_steps': 40,
    'start_training': 10,
    'eval_interval': 20,
    'log_interval': 10,
    'save_interval': 10,
    'eval_episodes': 1,
    'agent.actor_hidden_dims': [16, 16],
    'agent.value_hidden_dims': [16, 16],
    'agent.batch_size': 8,
}
MAIN_FLAGS = {'offline_steps': 40, 'agent.flow_steps': 2, 'fused_steps': 5}


def write_spec(path, data_dir, **changes):
    body = dict(
        methods=['QC', 'RLPD-AC'],
        envs=[ENV],
        seeds=[0, 1],
        flags=dict(TINY_FLAGS, dataset_dir=str(data_dir)),
        driver_flags={'main.py': dict(MAIN_FLAGS)},
    )
    body.update(changes)
    path.write_text(json.dumps(body))
    return str(path)


def sweep(*args, env=None):
    return subprocess.run(
        [sys.executable, 'sweep.py', *args], cwd=ROOT, env=env or subprocess_env(), capture_output=True, text=True
    )


# SPEC expansion.


def test_presets_follow_the_reference_commands():
    m = presets.METHODS
    assert list(m) == ['QC', 'BFN-n', 'BFN', 'QC-FQL', 'FQL-n', 'FQL', 'RLPD', 'RLPD-AC', 'QC-RLPD']
    assert m['QC'].flags['agent.actor_num_samples'] == 32
    assert m['BFN-n'].flags['agent.actor_num_samples'] == 4 and m['BFN'].flags['agent.actor_num_samples'] == 4
    assert m['BFN-n'].flags['agent.action_chunking'] is False and m['FQL'].flags['horizon_length'] == 1
    assert {k for k, v in m.items() if v.driver == 'main_online.py'} == {'RLPD', 'RLPD-AC', 'QC-RLPD'}
    # The appendix tables per domain (alpha for the FQL family, N for best-of-N) and sparse scene/puzzle-3x3.
    assert domain_flags('QC', 'scene-play-singletask-task2-v0') == {
        'sparse': True, 'agent.actor_num_samples': 32}  # fmt: skip
    assert domain_flags('QC', 'puzzle-3x3-play-singletask-task4-v0') == {
        'sparse': True, 'agent.actor_num_samples': 64}  # fmt: skip
    assert domain_flags('FQL', 'cube-triple-play-singletask-task2-v0') == {'agent.alpha': 300.0}
    assert domain_flags('QC-FQL', 'cube-quadruple-play-100m-singletask-task1-v0') == {'agent.alpha': 100.0}
    assert domain_flags('QC', 'square-mh-low_dim') == {'agent.actor_num_samples': 16}
    assert domain_flags('FQL-n', 'lift-mh-low_dim') == {'agent.alpha': 10000.0}
    assert domain_flags('BFN', 'visual-cube-double-play-singletask-task1-v0') == {'agent.actor_num_samples': 4}
    assert domain_flags('RLPD', 'scene-play-singletask-task2-v0') == {'sparse': True}
    assert domain_flags('QC', 'puzzle-4x4-play-singletask-task4-v0') == {}
    assert domain_flags('QC-FQL', 'antmaze-large-diverse-v2') == {}
    # Every table row has a value per domain. On cube-triple the reference README's commands agree with the tables,
    # except FQL's alpha (README 100, table 300).
    assert all(len(v) == len(paper_settings.DOMAINS) for v in paper_settings.PAPER_SETTINGS.values())
    for name in ('QC', 'BFN-n', 'BFN', 'QC-FQL', 'FQL-n'):
        flags = domain_flags(name, 'cube-triple-play-singletask-task2-v0')
        assert flags and all(m[name].flags[k] == v for k, v in flags.items()), name
    # A SPEC's own flags still win over the paper's.
    runs, _ = spec.expand(dict(methods=['FQL'], envs=[ENV], seeds=1, flags={'agent.alpha': 30.0}))
    assert runs[0].flags['agent.alpha'] == 30.0


def test_expand_names_runs_deterministically_and_groups_seeds():
    envs = [ENV, 'scene-play-singletask-task2-v0']
    body = dict(methods=['QC', 'FQL'], envs=envs, seeds=3, flags={'eval_episodes': 5})
    runs, per_process = spec.expand(body)
    assert per_process == 1 and len(runs) == 2 * 2 * 3
    again, _ = spec.expand(json.loads(json.dumps(body)))
    assert [r.name for r in runs] == [r.name for r in again]
    scene = [r for r in runs if r.env.startswith('scene')]
    assert all(r.flags['sparse'] is True for r in scene) and all('sparse' not in r.flags for r in runs[:3])
    changed, _ = spec.expand(dict(body, flags={'eval_episodes': 6}))
    assert {r.name for r in runs}.isdisjoint(r.name for r in changed)
    assert runs[0].name.startswith(f'QC.{ENV}.') and runs[0].name.endswith('_sd0')

    units = spec.group_units(runs, 2)
    assert [len(u.runs) for u in units] == [2, 1] * 4
    argv = units[0].argv('/tmp/sweep')
    assert '--resume' in argv and '--seeds=0,1' in argv and '--save_dir=/tmp/sweep' in argv
    exp = [a for a in argv if a.startswith('--exp_name=')][0].split('=', 1)[1]
    assert [f'{exp}_sd{s}' for s in (0, 1)] == [r.name for r in units[0].runs]  # The driver's per-seed dirs.
    single = spec.group_units(runs, 1)[0].argv('/tmp/sweep')
    assert f'--exp_name={runs[0].name}' in single and '--seed=0' in single
    assert spec.format_value([16, 16]) == '(16,16)' and spec.format_value((8,)) == '(8,)'


@pytest.mark.parametrize(
    'changes, message',
    [
        (dict(methods=['QC', 'NOPE']), "unknown method preset 'NOPE'"),
        (dict(envs=['cube-sextuple-play-v9']), "unknown environment 'cube-sextuple-play-v9'"),
        (dict(flags={'no_such_flag': 1}), "Unknown command line flag 'no_such_flag'"),
        (dict(driver_flags={'main.py': {'agent.no_such_key': 1}}), 'no_such_key'),
        (dict(seeds=[]), 'empty grid: no seeds'),
        (dict(methods=[]), 'empty grid: no methods'),
        (dict(flags={'seed': 3}), '--seed is set by the sweep itself'),
        (dict(colour='red'), "unknown keys ['colour']"),
    ],
)
def test_bad_specs_are_refused_before_anything_is_written(tmp_path, changes, message):
    path = write_spec(tmp_path / 'spec.json', tmp_path, **changes)
    out = tmp_path / 'sweep'
    from sweeps.launch import plan

    with pytest.raises(UserError, match=message.replace('[', r'\[').replace(']', r'\]')):
        plan(path, str(out))
    assert not out.exists()


def test_a_bad_spec_ends_with_one_line_and_exit_2(tmp_path):
    path = write_spec(tmp_path / 'spec.json', tmp_path, flags={'no_such_flag': 1})
    proc = sweep('launch', path, str(tmp_path / 'sweep'), '--executor=local')
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith('error: ') and 'no_such_flag' in proc.stderr and 'Traceback' not in proc.stderr
    assert not (tmp_path / 'sweep').exists()


# Reading results.


def test_table_and_plots_from_run_directories(tmp_path):
    body = dict(methods=['QC', 'RLPD'], envs=[ENV], seeds=3)
    runs, _ = spec.expand(body)
    sweep_dir = str(tmp_path)
    with open(os.path.join(sweep_dir, 'sweep.json'), 'w') as f:
        json.dump(dict(seeds_per_process=1, runs=[r.__dict__ for r in runs]), f)
    qc = [r for r in runs if r.method == 'QC']
    for r, (off, on) in zip(qc, [(0.2, 0.6), (0.4, 0.8), (0.0, 1.0)], strict=True):
        fake_run(sweep_dir, r.name, [50, 100, 150, 200], [0.1, off, 0.5, on], 100, 100)
    rlpd = [r for r in runs if r.method == 'RLPD']
    fake_run(sweep_dir, rlpd[0].name, [50, 100], [0.3, 0.5], 0, 100)
    fake_run(sweep_dir, rlpd[1].name, [50], [0.3], 0, 100, finished=False)  # Still running: no final value.

    text = report.table_markdown(sweep_dir)
    rows = [line for line in text.splitlines() if line.startswith(f'| {ENV}')]
    assert len(rows) == 2
    qc_row, rlpd_row = (row.split(' | ') for row in rows)
    assert qc_row[1] == 'QC' and qc_row[2] == '3' and qc_row[3].startswith('20.0 [') and qc_row[5].startswith('80.0 [')
    assert qc_row[4] == qc_row[6].rstrip(' |') == 'no published row'  # cube-single is not a task of the paper
    assert rlpd_row[2] == '1' and rlpd_row[3] == '-' and rlpd_row[5].startswith('50.0 [50.0, 50.0]')

    mean, low, high = report.bootstrap_ci([0.0, 1.0, 1.0, 1.0], np.random.default_rng(0))
    assert mean == 0.75 and 0.0 <= low < 0.75 < high <= 1.0

    lines = report.status_lines(sweep_dir)
    assert lines[-1] == '6 runs: 2 pending, 4 finished'
    assert 'interrupted' in next(line for line in lines if line.startswith(rlpd[1].name))
    paths = report.plot_tasks(sweep_dir, str(tmp_path / 'plots'))
    assert [os.path.basename(p) for p in paths] == [f'{ENV}.png'] and os.path.getsize(paths[0]) > 0


# Local processes on GPUs.


def test_local_processes_get_one_gpu_each_at_most_k_per_gpu(tmp_path):
    # Each process records the CUDA_VISIBLE_DEVICES and preallocation setting it saw, and when it ran. It runs until
    # a second process of its GPU has started (at most 10 s): two share a GPU whenever the launcher lets them, however
    # slowly a loaded machine starts them.
    script = textwrap.dedent('''
        import glob, os, sys, time
        device = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
        open(f"{sys.argv[1]}.started.{device}", "w").close()
        t = time.time()
        while len(glob.glob(os.path.join(os.path.dirname(sys.argv[1]), f"*.started.{device}"))) < 2:
            if time.time() > t + 10:
                break
            time.sleep(0.02)
        time.sleep(0.2)
        text = " ".join([device, os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "-"), str(t), str(time.time())])
        open(sys.argv[1], "w").write(text)
    ''')
    names = [f'u{i}' for i in range(10)]
    argvs = [(name, [sys.executable, '-c', script, str(tmp_path / f'{name}.seen')]) for name in names]
    launch.run_local(str(tmp_path), argvs, devices=['0', '1'], runs_per_device=2)
    seen = {name: (tmp_path / f'{name}.seen').read_text().split() for name in names}
    assert all(v[0] in ('0', '1') and v[1] == 'false' for v in seen.values()), seen  # one GPU each, no prealloc
    assert {v[0] for v in seen.values()} == {'0', '1'}
    most = 0
    for device in ('0', '1'):
        spans = [(float(v[2]), float(v[3])) for v in seen.values() if v[0] == device]
        most = max(most, *(sum(s <= start < e for s, e in spans) for start, _ in spans))
    assert most == 2  # two processes shared a GPU at some point, never three
    assert {jobs.read_state(str(tmp_path), name)['state'] for name in names} == {'exited'}
    # `sweep.py status` names the GPU of a running process.
    jobs.write_state(str(tmp_path), 'u0', state='running', pid=os.getpid(), host=socket.gethostname(), device='1')
    status = report.run_status(str(tmp_path), 'u0')
    assert status['state'] == 'running' and status['note'].endswith(', GPU 1'), status


@pytest.mark.parametrize(
    'kwargs, message',
    [
        (dict(devices='0,0'), 'names GPU 0 twice'),
        (dict(devices='0,gpu1'), 'expected all or GPU indices separated by commas'),
        (dict(devices=''), 'expected all or GPU indices'),
        (dict(devices='0', runs_per_device=0), 'must be at least 1'),
        (dict(devices='0', executor='slurm'), '--devices is for --executor=local'),
        (dict(devices='0,5'), 'this machine has no GPU 5 (nvidia-smi -L lists 0, 1)'),
        (dict(devices='all'), 'no GPU is visible here'),
    ],
)
def test_bad_device_settings_are_refused_before_anything_starts(tmp_path, monkeypatch, kwargs, message):
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    monkeypatch.setattr(launch, 'listed_gpus', lambda: None if kwargs.get('devices') == 'all' else ['0', '1'])
    sweep_dir = tmp_path / 'sweep'
    with pytest.raises(UserError, match=re.escape(message)):
        launch.launch(str(tmp_path / 'spec.json'), str(sweep_dir), **kwargs)
    assert not sweep_dir.exists()


def test_devices_all_reads_the_visible_gpus(monkeypatch):
    monkeypatch.setattr(launch, 'listed_gpus', lambda: ['0', '1', '2', '3'])
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '2,3')
    assert launch.parse_devices('all') == ['2', '3']
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES')
    assert launch.parse_devices('all') == ['0', '1', '2', '3'] and launch.parse_devices(' 3, 1') == ['3', '1']


def test_a_bad_device_list_ends_with_one_line(tmp_path):
    proc = sweep('launch', str(tmp_path / 'spec.json'), str(tmp_path / 'sweep'), '--devices=1,1')
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert 'names GPU 1 twice' in proc.stderr and not (tmp_path / 'sweep').exists()


# Tiny sweeps.


def check_finished_sweep(sweep_dir, seeds):
    status = sweep('status', sweep_dir)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.strip().splitlines()
    assert lines[-1] == f'{2 * seeds} runs: {2 * seeds} finished', status.stdout
    table = sweep('table', sweep_dir, '--out', os.path.join(sweep_dir, 'results.md'), '--plots',
                  os.path.join(sweep_dir, 'plots'))  # fmt: skip
    assert table.returncode == 0, table.stderr
    rows = [line.split(' | ') for line in table.stdout.splitlines() if line.startswith(f'| {ENV}')]
    assert [(r[1], r[2]) for r in rows] == [('QC', str(seeds)), ('RLPD-AC', str(seeds))], table.stdout
    # Our offline and online ends (columns 3 and 5; 4 and 6 hold the paper's, which has no cube-single row).
    assert rows[0][3] != '-' and rows[0][5] != '-' and rows[1][3] == '-' and rows[1][5] != '-'
    assert rows[0][4] == 'no published row'
    assert os.path.isfile(os.path.join(sweep_dir, 'plots', f'{ENV}.png'))
    return lines


@pytest.mark.slow(longest=True)
def test_local_sweep_runs_skips_finished_runs_and_tabulates(data_dir, tmp_path):
    # One seed per method (tables of several seeds: test_table_and_plots_from_run_directories).
    path = write_spec(tmp_path / 'spec.json', data_dir, seeds=[0])
    sweep_dir = str(tmp_path / 'sweep')
    # Two (pretend) GPUs, up to two processes each: on a CPU the drivers run as usual, each told its one GPU.
    proc = sweep('launch', path, sweep_dir, '--executor=local', '--devices=0,1', '--runs_per_device=2')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check_finished_sweep(sweep_dir, seeds=1)
    for out in glob.glob(os.path.join(sweep_dir, jobs.JOBS_DIR, '*.out')):
        banners = [line for line in open(out) if line.startswith('=== ')]
        assert len(banners) == 1 and re.search(r' CUDA_VISIBLE_DEVICES=[01]$', banners[0].strip()), banners
    again = sweep('launch', path, sweep_dir, '--executor=local')
    assert again.returncode == 0 and '2 finished, 0 queued or running, 0 to start' in again.stdout, again.stdout


def _slurm(*args, env):
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=60)


def _wait(predicate, timeout, what):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f'timed out after {timeout} s waiting for {what}')


@pytest.fixture
def slurm_cluster(tmp_path):
    """A single-node SLURM cluster on this machine; the test fails (never skips) when SLURM cannot run."""
    script = os.path.join(ROOT, 'scripts', 'slurm_local.sh')
    state = tmp_path / 'slurm'
    env = dict(subprocess_env(), SLURM_CRED_EXPIRE='5')
    installed = subprocess.run(['bash', script, 'install'], env=env, capture_output=True, text=True)
    assert installed.returncode == 0, f'SLURM is not installed: {installed.stderr.strip()}'
    started = subprocess.run(['bash', script, 'start', str(state)], env=env, capture_output=True, text=True)
    assert started.returncode == 0, f'SLURM did not start: {started.stdout} {started.stderr}'
    env['SLURM_CONF'] = str(state / 'slurm.conf')
    try:
        yield env
    finally:
        subprocess.run(['scancel', '--user', getpass.getuser()], env=env, capture_output=True)
        subprocess.run(['bash', script, 'stop', str(state)], env=env, capture_output=True)


@pytest.mark.slow(longest=True)
def test_slurm_sweep_survives_a_preemption(data_dir, tmp_path, slurm_cluster):
    env = slurm_cluster
    # The QC run is long enough (in steps) to be preempted after its first checkpoint; one seed of each method (one
    # job per driver).
    path = write_spec(tmp_path / 'spec.json', data_dir, driver_flags={'main.py': dict(MAIN_FLAGS, offline_steps=300)},
                      seeds=[0])  # fmt: skip
    sweep_dir = str(tmp_path / 'sweep')
    proc = sweep('launch', path, sweep_dir, '--executor=slurm', '--time=20', '--cpus=1', env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'submitted 2 SLURM jobs' in proc.stdout

    runs, unit_of = report.load_sweep(sweep_dir)
    target = next(r for r in runs if r.method == 'QC' and r.seed == 0)
    run_dir = report.run_dir(sweep_dir, target.name)
    ckpt_dir = os.path.join(run_dir, 'checkpoints')
    _wait(lambda: checkpoint_steps(ckpt_dir), 240, 'the first checkpoint of the QC seed-0 run')
    job = json.load(open(os.path.join(sweep_dir, 'jobs', f'{unit_of[target.name]}.json')))['job']
    assert not report.is_finished(sweep_dir, target.name), 'the run finished before it could be preempted'
    # SLURM's preemption/timeout warning signal (submitit asks sbatch for --signal=USR2@...).
    signalled = _slurm('scancel', '--signal=USR2', job, env=env)
    assert signalled.returncode == 0, signalled.stderr

    def restarted():
        out = _slurm('scontrol', 'show', 'job', job, env=env).stdout
        return 'Restarts=1' in out or 'Restarts=2' in out

    _wait(restarted, 60, f'job {job} to be requeued')
    _wait(lambda: all(report.is_finished(sweep_dir, r.name) for r in runs), 420, 'every run to finish')

    lines = check_finished_sweep(sweep_dir, seeds=1)
    assert all(' finished ' in line for line in lines[1:-1])
    log = open(os.path.join(sweep_dir, 'jobs', f'{unit_of[target.name]}.out')).read()
    assert 'Resuming ' in log, log  # The requeued job continued from the checkpoint.
    starts = run_files.read_starts(run_dir)  # the first start, and the requeued job's resume after the preemption
    assert len(starts) >= 2 and starts[0]['step'] == 0 and starts[-1]['step'] > 0, starts
    assert run_lock.read_holder(run_dir) is None  # the preempted job let go of the run, and so did the requeued one
    for name in ('offline_agent.csv', 'eval.csv'):
        steps = [int(row['step']) for row in read_csv(os.path.join(run_dir, name))]
        assert steps == sorted(set(steps)), f'{name} has repeated or unordered rows: {steps}'
    assert [int(r['step']) for r in read_csv(os.path.join(run_dir, 'eval.csv'))] == [20 * k for k in range(1, 18)]
