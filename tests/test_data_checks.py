"""Bad data in, one clear line out: every kind of damaged dataset is refused before anything is written or updated,
a bad shard mid-run stops after a checkpoint, and an environment's NaN stops the online phase naming the step.

Damaged copies are made on the fly from the tiny generated fixtures; nothing is committed."""

import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from helpers import ROOT, generate_cube_single, parse_run, subprocess_env

import main
from agents import agents
from training import Trainer
from utils.errors import run_cli

ENV = 'cube-single-play-singletask-task2-v0'
NAME = 'cube-single-play-v0'
TINY = [
    '--agent.actor_hidden_dims=(16,16)',
    '--agent.value_hidden_dims=(16,16)',
    '--agent.batch_size=8',
    '--agent.flow_steps=2',
    '--eval_episodes=0',
    '--offline_steps=2',
    '--online_steps=0',
]


pytestmark = pytest.mark.usefixtures('no_wandb')


def error_lines(err):
    """The stderr lines that are not progress-bar redraws."""
    lines = [line.strip() for line in err.replace('\r', '\n').splitlines() if line.strip()]
    return [line for line in lines if not line.startswith(('offline:', 'online:'))]


@pytest.fixture(scope='module')
def clean_dir(tmp_path_factory):
    return generate_cube_single(tmp_path_factory.mktemp('clean'), num_episodes=3)


def damaged_ogbench(clean_dir, out_dir, kind):
    """A copy of the clean dataset folder whose training file has one kind of damage."""
    os.makedirs(out_dir)
    shutil.copy(os.path.join(clean_dir, f'{NAME}-val.npz'), out_dir)
    src, path = os.path.join(clean_dir, f'{NAME}.npz'), os.path.join(out_dir, f'{NAME}.npz')
    if kind == 'truncated':
        raw = open(src, 'rb').read()
        open(path, 'wb').write(raw[: len(raw) // 2])
        return path
    if kind == 'not an archive':
        open(path, 'w').write('observations,actions\n1,2\n')
        return path
    data = dict(np.load(src))
    if kind == 'missing field':
        del data['actions']
    elif kind == 'different lengths':
        data['actions'] = data['actions'][:-1]
    elif kind == 'wrong width':
        data['actions'] = np.concatenate([data['actions'], data['actions'][:, :1]], axis=1)
    elif kind == 'inf action':
        data['actions'][17, 0] = np.inf
    elif kind == 'nan observation':
        data['observations'][5, 2] = np.nan
    elif kind == 'shorter than a chunk':
        data = {k: v[:3] for k, v in data.items()}
        data['terminals'][-1] = True
    elif kind == 'no episode end':
        data['terminals'] = np.zeros_like(data['terminals'])
    np.savez(path, **data)
    return path


OGBENCH_DAMAGE = {
    'truncated': 'not a readable .npz archive',
    'not an archive': 'not a readable .npz archive',
    'missing field': "has no 'actions' field",
    'different lengths': 'fields have different lengths',
    'wrong width': 'actions are (6,) per step',
    'inf action': 'actions hold 1 non-finite values',
    'nan observation': 'observations hold 1 non-finite values',
    'shorter than a chunk': 'fewer than one action chunk (--horizon_length=5)',
    'no episode end': 'no episode end',
}


def refused(argv, capsys):
    """Runs the trainer's start-up as `main.py` does; returns (exit status, stderr lines)."""

    def start(_):
        Trainer(parse_run(main.PRESET, argv), agents).train()

    with pytest.raises(SystemExit) as exit_info:
        run_cli(start)
    return exit_info.value.code, error_lines(capsys.readouterr().err)


@pytest.mark.parametrize('kind', list(OGBENCH_DAMAGE))
def test_damaged_ogbench_data_is_refused_with_one_line(clean_dir, tmp_path, capsys, kind):
    path = damaged_ogbench(clean_dir, str(tmp_path / 'data'), kind)
    save_dir = tmp_path / 'exp'
    code, err = refused([f'--env_name={ENV}', f'--dataset_dir={tmp_path / "data"}', f'--save_dir={save_dir}', *TINY],
                        capsys)  # fmt: skip
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith('error: ') and path in err[0] and OGBENCH_DAMAGE[kind] in err[0], err[0]
    assert not save_dir.exists()  # Nothing written.


def test_the_driver_exits_2_without_a_traceback(clean_dir, tmp_path):
    damaged_ogbench(clean_dir, str(tmp_path / 'data'), 'inf action')
    args = [f'--env_name={ENV}', f'--dataset_dir={tmp_path / "data"}', f'--save_dir={tmp_path / "exp"}', *TINY]
    proc = subprocess.run([sys.executable, 'main.py', *args], cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True)  # fmt: skip
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and 'non-finite' in proc.stderr
    assert not (tmp_path / 'exp').exists()


D4RL_ENV = 'antmaze-umaze-v2'


def d4rl_file(path, kind):
    """A small D4RL-format file (two 20-step episodes) with one kind of damage."""
    n = 40
    rng = np.random.default_rng(0)
    fields = dict(
        observations=rng.normal(size=(n, 29)).astype(np.float32),
        actions=rng.uniform(-1, 1, size=(n, 8)).astype(np.float32),
        rewards=np.zeros(n, np.float32),
        terminals=np.zeros(n, bool),
        timeouts=np.zeros(n, bool),
    )
    fields['timeouts'][[19, 39]] = True
    if kind == 'truncated':
        d4rl_file(path, 'clean')
        raw = open(path, 'rb').read()
        open(path, 'wb').write(raw[: len(raw) // 3])
        return
    if kind == 'missing field':
        del fields['rewards']
    elif kind == 'different lengths':
        fields['actions'] = fields['actions'][:-2]
    elif kind == 'nan reward':
        fields['rewards'][7] = np.nan
    elif kind == 'no episode end':
        fields['timeouts'][:] = False
    with h5py.File(path, 'w') as f:
        for key, value in fields.items():
            f[key] = value


D4RL_DAMAGE = {
    'truncated': 'not a readable HDF5 file',
    'missing field': "has no 'rewards' field",
    'different lengths': 'fields have different lengths',
    'nan reward': 'rewards hold 1 non-finite values',
    'no episode end': 'no episode end',
}


@pytest.mark.parametrize('kind', list(D4RL_DAMAGE))
def test_damaged_hdf5_data_is_refused_with_one_line(tmp_path, capsys, kind):
    path = str(tmp_path / f'{D4RL_ENV}.hdf5')
    d4rl_file(path, kind)
    save_dir = tmp_path / 'exp'
    code, err = refused([f'--env_name={D4RL_ENV}', f'--dataset_dir={tmp_path}', f'--save_dir={save_dir}', *TINY],
                        capsys)  # fmt: skip
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith('error: ') and path in err[0] and D4RL_DAMAGE[kind] in err[0], err[0]
    assert not save_dir.exists()


def test_a_bad_shard_mid_run_stops_after_a_checkpoint(clean_dir, tmp_path, capsys):
    shards = tmp_path / 'shards'
    shards.mkdir()
    for i in range(2):
        shutil.copy(os.path.join(clean_dir, f'{NAME}.npz'), shards / f'{NAME}-{i:03d}.npz')
    bad = damaged_ogbench(clean_dir, str(tmp_path / 'bad'), 'nan observation')
    shutil.copy(bad, shards / f'{NAME}-002.npz')
    argv = [f'--env_name={ENV}', f'--ogbench_dataset_dir={shards}', f'--dataset_dir={clean_dir}',
            f'--save_dir={tmp_path / "exp"}', '--exp_name=shards', *TINY[:5], '--offline_steps=12',
            '--online_steps=0', '--dataset_replace_interval=4', '--log_interval=2', '--eval_interval=0']  # fmt: skip
    code, err = refused(argv, capsys)
    assert code == 2 and len(err) == 1, err
    assert str(shards / f'{NAME}-002.npz') in err[0] and 'non-finite' in err[0] and 'checkpoint written' in err[0]
    run_dir = tmp_path / 'exp' / 'Debug' / 'shards'
    # Steps 1-3 ran on shard 0 and 4-7 on shard 1; shard 2 was refused when it was loaded for step 8.
    assert os.listdir(run_dir / 'checkpoints') == ['ckpt_000000000007.pkl']

    shutil.copy(os.path.join(clean_dir, f'{NAME}.npz'), shards / f'{NAME}-002.npz')  # The shard, fixed.
    Trainer(parse_run(main.PRESET, [*argv, '--resume']), agents).train()
    assert (run_dir / 'finished.json').exists()


class NanAfter:
    """An environment wrapper that returns a NaN observation from its `n`-th step on."""

    def __init__(self, env, n):
        self.env, self.n, self.steps = env, n, 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, action):
        self.steps += 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.steps >= self.n:
            obs = np.full_like(obs, np.nan)
        return obs, reward, terminated, truncated, info


def test_a_nan_from_the_environment_stops_the_online_phase_naming_the_step(clean_dir, tmp_path, capsys):
    argv = [f'--env_name={ENV}', f'--dataset_dir={clean_dir}', f'--save_dir={tmp_path / "exp"}', *TINY[:5],
            '--offline_steps=2', '--online_steps=20', '--start_training=100', '--log_interval=5',
            '--eval_interval=0']  # fmt: skip

    def start(_):
        trainer = Trainer(parse_run(main.PRESET, argv), agents)
        trainer.lanes[0].env = NanAfter(trainer.lanes[0].env, 7)
        trainer.train()

    with pytest.raises(SystemExit) as exit_info:
        run_cli(start)
    err = error_lines(capsys.readouterr().err)
    assert exit_info.value.code == 1 and len(err) == 1, err
    assert 'non-finite values at step 9' in err[0] and 'environment next_observations' in err[0], err[0]
