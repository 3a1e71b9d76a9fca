"""The run layer: a restart leaves the logs of one uninterrupted run, a lane round-trips through its state dict,
checkpoint formats, the documented `sample_sequence` batch, the run-directory contract, the run settings."""

import ast
import dataclasses
import os
import shutil

import numpy as np
import pytest
from absl import flags
from helpers import ROOT, TINY_CUBE_RUN, parse_run, read_csv, tagged_dataset

import main
from agents import agents
from analysis import run_files
from training import StopTraining, Trainer, checkpointing
from training import hooks as hooks_module
from training.actor import SeedActors
from training.config import AGENT_ALIASES, RunConfig, define_flags
from training.data import LOSS_FIELDS
from utils.checkpoints import CheckpointError, CheckpointManager, read_checkpoint_file
from utils.datasets import SEQUENCE_FIELDS
from utils.errors import UsageError

TIME_COLUMNS = ('time/total', 'episode.duration')  # wall-clock values
RUN = [
    *TINY_CUBE_RUN, '--offline_steps=4', '--online_steps=4', '--log_interval=2', '--eval_interval=4',
    '--buffer_size=100', '--start_training=2',
]  # fmt: skip


pytestmark = pytest.mark.usefixtures('no_wandb')


def trainer_for(cube_dir, save_dir, *extra):
    argv = [*RUN, f'--dataset_dir={cube_dir}', f'--save_dir={save_dir}', *extra]
    return Trainer(parse_run(main.PRESET, argv), agents)


def log_rows(run_dir):
    """{log: its rows without wall-clock columns} of every CSV log a run writes ([] when absent)."""
    rows = {}
    for log in run_files.LOGS:
        path = run_files.csv_path(run_dir, log)
        found = read_csv(path) if os.path.exists(path) else []
        rows[log] = [{k: v for k, v in row.items() if k not in TIME_COLUMNS} for row in found]
    return rows


@pytest.mark.parametrize('seeds', [(0,), (0, 1)], ids=['one seed', 'two seeds'])
@pytest.mark.slow
def test_a_restart_without_checkpoint_leaves_the_logs_of_one_uninterrupted_run(cube_dir, tmp_path, seeds):
    # The seeds' environments in this process: the logs are the subject here, and workers step alike
    # (tests/test_online_schedule.py).
    seed_flags = [f'--seeds={",".join(map(str, seeds))}', '--env_workers=0']
    suffixes = [''] if len(seeds) == 1 else [f'_sd{s}' for s in seeds]
    trainer_for(cube_dir, tmp_path, *seed_flags, '--exp_name=whole').train()
    whole = [log_rows(tmp_path / 'Debug' / f'whole{s}') for s in suffixes]
    assert whole[0]['offline_agent'] and whole[0]['online_agent'] and whole[0]['eval']
    # A run killed before its first checkpoint leaves rows behind (here: a copy of the whole run's, and an `env` row).
    for s in suffixes:
        shutil.copytree(tmp_path / 'Debug' / f'whole{s}', tmp_path / 'Debug' / f'cut{s}')
        path = run_files.csv_path(tmp_path / 'Debug' / f'cut{s}', run_files.ENV_LOG)
        assert not os.path.exists(path)  # no episode ends in 4 online steps
        with open(path, 'w') as f:
            f.write('step,episode.return\n3,1.0\n')
    for again in (['--resume'], []):  # `--resume` finds no checkpoint; a plain restart reuses the directory
        trainer_for(cube_dir, tmp_path, *seed_flags, '--exp_name=cut', *again).train()
        for s, expected in zip(suffixes, whole, strict=True):
            run_dir = tmp_path / 'Debug' / f'cut{s}'
            assert log_rows(run_dir) == expected, (again, s)
            assert run_files.read_finished(run_dir)['step'] == 8


# Two seeds, each seed's environments in a worker of its own.
WORKER_RUN = ['--seeds=0,1', '--env_workers=2', '--offline_steps=0', '--online_steps=4', '--log_interval=1',
              '--eval_interval=3', '--save_interval=0']  # fmt: skip


@pytest.fixture(scope='module')
def uninterrupted_worker_run(cube_dir, tmp_path_factory):
    """{seed suffix: log rows} of an uninterrupted `WORKER_RUN`."""
    save_dir = tmp_path_factory.mktemp('whole')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv('WANDB_MODE', 'disabled')
        # In this process: workers step the environments exactly as it does (tests/test_online_schedule.py).
        trainer_for(cube_dir, save_dir, *WORKER_RUN, '--env_workers=0', '--exp_name=whole').train()
    return {s: log_rows(save_dir / 'Debug' / f'whole{s}') for s in ('_sd0', '_sd1')}


@pytest.mark.parametrize('where', ['build_lanes', 'create_agents'])
def test_a_run_refused_during_setup_leaves_no_worker_process(cube_dir, tmp_path, monkeypatch, where):
    """The workers start first (they build while the driver loads and creates its agents); a refusal after that, in
    the driver's own checks or its agent creation, ends them."""
    from training import setup

    pools = []

    class RecordedPool(setup.WorkerPool):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pools.append(self)

    def refuse(*args, **kwargs):
        raise UsageError('refused for the test')

    monkeypatch.setattr(setup, 'WorkerPool', RecordedPool)
    monkeypatch.setattr(setup, 'check_chunk_fits' if where == 'build_lanes' else 'create_agents', refuse)
    with pytest.raises(UsageError, match='refused for the test'):
        trainer_for(cube_dir, tmp_path, *WORKER_RUN, '--env_workers=1', '--exp_name=refused')
    [pool] = pools
    assert all(worker.process.poll() is not None for worker in pool.workers)
    assert not os.path.exists(tmp_path / 'Debug')  # and nothing was written


@pytest.mark.parametrize('where', ['acting', 'evaluation'])
@pytest.mark.slow
def test_a_dead_environment_worker_stops_with_one_line_and_a_checkpoint_that_resumes(
    cube_dir, tmp_path, monkeypatch, uninterrupted_worker_run, where
):
    # Seed 1's worker dies in online step 3: in the step's evaluation, or before its environment step.
    cut = trainer_for(cube_dir, tmp_path, *WORKER_RUN, '--exp_name=cut')

    def kill_at_step_3(fn):
        def killing(*args, **kwargs):
            if cut.log_step == 3 and cut.workers.workers[1].process.poll() is None:
                cut.workers.workers[1].process.kill()
                cut.workers.workers[1].process.wait()
            return fn(*args, **kwargs)

        return killing

    if where == 'acting':
        # Step 3 starts a chunk (H = 2), whose actions go to the dead worker (it ran the previous chunk ahead).
        monkeypatch.setattr(SeedActors, 'step', kill_at_step_3(SeedActors.step))
    else:
        monkeypatch.setattr(hooks_module, 'run_lockstep', kill_at_step_3(hooks_module.run_lockstep))
    with pytest.raises(hooks_module.WorkerDied) as stopped:
        cut.train()
    done = 3 if where == 'evaluation' else 2  # the step whose work is all done (bar the evaluation)
    message = str(stopped.value)
    assert '\n' not in message and stopped.value.exit_code == 1
    assert 'an environment worker process exited (status -9)' in message and '--exp_name=cut --resume' in message
    assert f'checkpoint written at step {done}' in message
    monkeypatch.undo()
    monkeypatch.setenv('WANDB_MODE', 'disabled')
    # Resumed with the environments in this process (results do not depend on where they step).
    trainer_for(cube_dir, tmp_path, *WORKER_RUN, '--env_workers=0', '--exp_name=cut', '--resume').train()
    for s in ('_sd0', '_sd1'):
        whole, cut_rows = uninterrupted_worker_run[s], log_rows(tmp_path / 'Debug' / f'cut{s}')
        for log in run_files.LOGS:  # every step's rows once, none missing
            assert [r['step'] for r in cut_rows[log]] == [r['step'] for r in whole[log]], (s, log)
        assert [r['step'] for r in whole['eval']] == ['3', '4']
        # Up to the checkpoint the runs are one; an interrupted evaluation runs on the resumed run as it would have.
        before = [[r for r in rows['online_agent'] if int(r['step']) <= done] for rows in (cut_rows, whole)]
        assert before[0] == before[1] and before[0]
        if where == 'evaluation':
            assert cut_rows['eval'][0] == whole['eval'][0]
            # Once the resumed run evaluated the step, a checkpoint says so: a later kill resumes past it.
            manager = CheckpointManager(os.path.join(tmp_path, 'Debug', f'cut{s}', run_files.CHECKPOINT_DIR))
            assert read_checkpoint_file(manager.path(3))['state']['eval_due'] is False


def _assert_same(a, b, where='state'):
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), where
        for k in a:
            _assert_same(a[k], b[k], f'{where}.{k}')
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f'{where}[{i}]')
    elif isinstance(a, np.ndarray | np.generic):
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, where


def test_a_lane_round_trips_through_its_state_dict(cube_dir, tmp_path):
    done = trainer_for(cube_dir, tmp_path, '--exp_name=done', '--save_all_online_states=True')
    done.train()
    lane = done.lanes[0]
    state = lane.state_dict()
    assert state['online'] is not None and len(state['online']['states']['steps']) == 4
    fresh = trainer_for(cube_dir, tmp_path, '--exp_name=fresh', '--save_all_online_states=True')
    twin = fresh.lanes[0]
    assert twin.replay is None  # the offline phase has not started the online one
    twin.load_state_dict(state)
    _assert_same(twin.state_dict(), state)
    # From here on both lanes draw the same batches, random actions, chunk keys and evaluation starts.
    _assert_same(twin.sampler.sample(2), lane.sampler.sample(2))
    np.testing.assert_array_equal(twin.actor.random_action(), lane.actor.random_action())
    assert twin.actor.chunks == lane.actor.chunks > 0 and twin.actor.key_seed == lane.actor.key_seed
    assert twin.eval_rng.integers(1 << 30) == lane.eval_rng.integers(1 << 30)
    assert twin.replay.size == lane.replay.size == lane.dataset.size + 4
    fresh.finish(quiet=True)


def _cut_at_step_2(cube_dir, save_dir, name):
    cut = trainer_for(cube_dir, save_dir, f'--exp_name={name}', '--online_steps=0')
    cut.stop.should_stop = lambda: cut.log_step >= 2
    with pytest.raises(StopTraining):
        cut.train()
    manager = CheckpointManager(os.path.join(save_dir, 'Debug', name, run_files.CHECKPOINT_DIR))
    return manager, read_checkpoint_file(manager.path(2))['state']


@pytest.mark.slow
def test_checkpoints_of_the_earlier_layout_resume_and_newer_ones_are_refused(cube_dir, tmp_path, capsys):
    manager, state = _cut_at_step_2(cube_dir, tmp_path, 'old')
    assert state['format'] == checkpointing.CHECKPOINT_FORMAT and state['phase'] == 'offline'
    # The same run as 'new', its checkpoint written by a newer version.
    shutil.copytree(tmp_path / 'Debug' / 'old', tmp_path / 'Debug' / 'new')
    newer = CheckpointManager(os.path.join(tmp_path, 'Debug', 'new', run_files.CHECKPOINT_DIR))
    newer.save(dict(state, format=checkpointing.CHECKPOINT_FORMAT + 1), 2)
    del state['format']  # as the trainer wrote them before the format was versioned
    manager.save(state, 2)
    resumed = trainer_for(cube_dir, tmp_path, '--exp_name=old', '--online_steps=0', '--resume')
    resumed.train()
    assert 'Resuming old at step 2 (offline phase).' in capsys.readouterr().out
    rows = read_csv(run_files.csv_path(tmp_path / 'Debug' / 'old', run_files.agent_log('offline')))
    assert [r['step'] for r in rows] == ['2', '4'] and resumed.log_step == 4

    with pytest.raises(CheckpointError, match='newer than this code reads'):
        trainer_for(cube_dir, tmp_path, '--exp_name=new', '--online_steps=0', '--resume')


def test_sample_sequence_returns_the_documented_batch():
    lengths, size, horizon = (7, 5, 9), 16, 4
    data = tagged_dataset(lengths, seed=3)
    twin = tagged_dataset(lengths, seed=3)
    batch = data.sample_sequence(size, horizon, 0.5)
    assert tuple(batch) == SEQUENCE_FIELDS
    shapes = dict(observations=(size, 3), full_observations=(size, horizon, 3), actions=(size, horizon, 2),
                  next_observations=(size, horizon, 3))  # fmt: skip
    for key in SEQUENCE_FIELDS:
        assert batch[key].shape == shapes.get(key, (size, horizon)), key
    valid = batch['valid'].astype(bool)
    # Every step's observation, the chunk start first; each next observation is the following step's observation.
    np.testing.assert_array_equal(batch['full_observations'][:, 0], batch['observations'])
    steps = batch['full_observations'][..., 0]  # (B, H) global indices
    np.testing.assert_array_equal(np.where(valid, steps, 0), np.where(valid, steps[:, :1] + np.arange(horizon), 0))
    np.testing.assert_array_equal(batch['next_observations'], batch['full_observations'] + 0.5)
    # terminals: 1 from the episode's last step on; valid: 1 until the step after it.
    ends = np.cumsum(lengths) - 1
    ended = np.maximum.accumulate(np.isin(steps, ends), axis=1)
    np.testing.assert_array_equal(batch['terminals'], ended)
    np.testing.assert_array_equal(batch['valid'][:, 1:], 1 - batch['terminals'][:, :-1])
    # The trainer's lean batch is the same draw, without the fields its losses do not read.
    lean = twin.sample_sequence(size, horizon, 0.5, fields=LOSS_FIELDS)
    assert tuple(lean) == LOSS_FIELDS
    for key in LOSS_FIELDS:
        np.testing.assert_array_equal(lean[key], batch[key])


def test_sweeps_read_run_results_only_through_run_files():
    names = {run_files.FLAGS_FILE, run_files.FINISHED_FILE, run_files.CHECKPOINT_DIR}
    names |= {f'{log}.csv' for log in run_files.LOGS}
    sweeps_dir = os.path.join(ROOT, 'sweeps')
    for name in sorted(os.listdir(sweeps_dir)):
        if not name.endswith('.py'):
            continue
        with open(os.path.join(sweeps_dir, name)) as f:
            tree = ast.parse(f.read())
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not strings & names, (name, strings & names)
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {f'{n.module}.{a.name}' for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        readers = {m for m in imported if m.startswith(('training.trainer', 'analysis.plotting', 'csv'))}
        assert not readers, (name, readers)


def test_every_run_setting_is_declared_once_and_becomes_a_flag():
    fields = [f for f in dataclasses.fields(RunConfig) if f.metadata]
    values = flags.FlagValues()
    define_flags(main.PRESET, values)
    for field in fields:
        assert field.name in values and values[field.name].help == field.metadata['help'], field.name
    online_only = flags.FlagValues()
    define_flags(__import__('main_online').PRESET, online_only)
    assert 'offline_steps' not in online_only and 'fused_steps' not in online_only
    # Only `seeds` is stored; `--seed` is its one-seed spelling, and the aliases write the agent config.
    run = parse_run(main.PRESET, ['--seed=3', '--discount=0.9'])
    assert run.seeds == (3,) and run.seed == 3 and 'seed' not in {f.name for f in dataclasses.fields(run)}
    assert run.discount == run.agent['discount'] == 0.9 and run.horizon_length == AGENT_ALIASES['horizon_length']
    record = run.flag_record
    assert record['seed'] == 3 and 'seeds' not in record and 'horizon_length' not in record
    assert record['agent']['horizon_length'] == AGENT_ALIASES['horizon_length']
    with pytest.raises(UsageError, match='--seed_chunk was renamed: use --seeds_per_vmap=1'):
        parse_run(main.PRESET, ['--seed_chunk=1'])
    with pytest.raises(UsageError, match='--seeds_per_vmap must be >= 0'):
        parse_run(main.PRESET, ['--seeds_per_vmap=-1'])
