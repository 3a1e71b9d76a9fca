"""Runs that survive: kill-and-resume exactness, SIGTERM checkpoints, corrupt checkpoints, NaN stops, refusals."""

import os
import pickle
import signal
import time

import numpy as np
import pytest
from helpers import checkpoint_files, parse_run, read_csv, refusal_in_process, run_driver, start_driver, wait_for

import main
from agents import agents
from training import Trainer
from utils import run_lock
from utils.checkpoints import read_checkpoint_file
from utils.errors import UsageError

TINY = [
    '--env_name=cube-single-play-singletask-task2-v0',
    '--agent.actor_hidden_dims=(16,16)',
    '--agent.value_hidden_dims=(16,16)',
    '--agent.batch_size=8',
    '--eval_episodes=1',
    '--fused_steps=3',
]
OFFLINE = ['--offline_steps=40', '--online_steps=0', '--log_interval=5', '--eval_interval=20', '--save_interval=10']
TIME_COLUMNS = ('time/total', 'episode.duration')  # wall-clock values
# Agents killed, resumed and compared with their uninterrupted run: ACFQL and QAM. The QAM paper's baselines are each
# killed and resumed in test_baselines.py, and each agent's state round-trips exactly in its own test file.
RESUMED = ('acfql', 'qam')


def args_for(data_dir, save_dir, exp_name, *extra):
    agent = [a for a in extra if a.startswith('--agent=')]  # the config file comes before its keys
    extra = [a for a in extra if not a.startswith('--agent=')]
    return [*agent, f'--dataset_dir={data_dir}', f'--save_dir={save_dir}', f'--exp_name={exp_name}', *TINY,
            '--agent.flow_steps=2', *extra]  # fmt: skip


def run_dir_of(save_dir, exp_name):
    return os.path.join(str(save_dir), 'Debug', exp_name)


def comparable_rows(path):
    return [{k: v for k, v in row.items() if k not in TIME_COLUMNS} for row in read_csv(path)]


def train_in_process(args):
    """The run `main.py args` makes, through the driver's `Trainer` in this process (the uninterrupted runs the
    killed ones are compared with; the same compiled programs on the same inputs)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv('WANDB_MODE', 'disabled')
        Trainer(parse_run(main.PRESET, args), agents).train()


def load_params(path):
    with open(path, 'rb') as f:
        return pickle.load(f)['agent']['network']['params']


def assert_same_params(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_params(a[k], b[k])
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize('agent', [f'agents/{name}.py' for name in RESUMED], ids=RESUMED)
def test_sigkill_then_resume_reproduces_the_uninterrupted_run(data_dir, tmp_path, agent):
    offline = [*OFFLINE, f'--agent={agent}']
    proc = start_driver(args_for(data_dir, tmp_path, 'killed', *offline))
    killed_dir = run_dir_of(tmp_path, 'killed')
    assert wait_for(lambda: len(checkpoint_files(killed_dir)) >= 1, proc), 'no checkpoint before the run ended'
    # Kill at some point after the first checkpoint (the exact step varies from run to run).
    # The rest of the run (30 updates and two evaluations) takes far longer than this.
    time.sleep(np.random.default_rng().uniform(0.0, 0.1))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, 'the run ended before it was killed'
    assert run_lock.read_holder(killed_dir)['pid'] == proc.pid  # the dead holder's record stays; it blocks nothing

    # A newer but truncated checkpoint (as a crash during a write could leave) must be skipped in favour of the last
    # complete one.
    newest = checkpoint_files(killed_dir)[-1]
    with open(newest, 'rb') as f:
        payload = f.read()
    with open(os.path.join(killed_dir, 'checkpoints', 'ckpt_999999999999.pkl'), 'wb') as f:
        f.write(payload[: len(payload) // 2])

    resumed = run_driver('main.py', args_for(data_dir, tmp_path, 'killed', *offline, '--resume'))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'ckpt_999999999999.pkl' in resumed.stderr  # the fallback was reported...
    assert os.path.exists(os.path.join(killed_dir, 'checkpoints', 'ckpt_999999999999.pkl.corrupt'))  # ...and set aside
    assert max(int(os.path.basename(p)[5:17]) for p in checkpoint_files(killed_dir)) == 40

    # The uninterrupted run, in this process, after the driver processes (which wrote the compilation cache it reads).
    train_in_process(args_for(data_dir, tmp_path, 'whole', *offline))
    whole_dir = run_dir_of(tmp_path, 'whole')
    for name in ('offline_agent.csv', 'eval.csv'):
        assert comparable_rows(os.path.join(killed_dir, name)) == comparable_rows(os.path.join(whole_dir, name)), name
    assert_same_params(
        load_params(os.path.join(killed_dir, 'params_40.pkl')), load_params(os.path.join(whole_dir, 'params_40.pkl'))
    )


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_exits_zero_then_online_resume_finishes(data_dir, tmp_path):
    steps = ['--offline_steps=6', '--online_steps=100000', '--log_interval=5', '--eval_interval=0',
             '--start_training=3', '--horizon_length=2']  # fmt: skip
    proc = start_driver(args_for(data_dir, tmp_path, 'term', *steps))
    run_dir = run_dir_of(tmp_path, 'term')
    online_log = os.path.join(run_dir, 'online_agent.csv')
    assert wait_for(lambda: os.path.exists(online_log) and len(read_csv(online_log)) >= 2, proc), proc.stderr
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    assert '--resume' in stderr.strip().splitlines()[-1]
    files = checkpoint_files(run_dir)
    assert len(files) == 1
    assert not os.path.exists(os.path.join(run_dir, 'finished.json'))  # A stopped run is not a finished one.
    with open(files[0], 'rb') as f:
        assert f.read(8) == b'QCCKPT01'

    # The resumed online phase restores the buffer and runs to a nearer end.
    saved = read_checkpoint_file(files[0])['state']
    assert saved['phase'] == 'online' and saved['online']['buffer']['size'] > 0
    end = saved['phase_step'] + 8
    shorter = [a if not a.startswith('--online_steps') else f'--online_steps={end}' for a in steps]
    resumed = run_driver('main.py', args_for(data_dir, tmp_path, 'term', *shorter, '--resume'))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert os.path.exists(os.path.join(run_dir, 'finished.json'))
    steps_logged = [int(r['step']) for r in read_csv(online_log)]
    assert steps_logged == sorted(set(steps_logged))  # no duplicated rows after the resume


def test_a_non_finite_loss_stops_the_run_with_a_clear_message(data_dir, tmp_path):
    proc = run_driver('main.py', args_for(data_dir, tmp_path, 'nan', *OFFLINE, '--agent.lr=1e30'))
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('error: non-finite values at step') and 'critic/critic_loss=nan' in last
    assert not checkpoint_files(run_dir_of(tmp_path, 'nan'))


@pytest.mark.parametrize(
    'extra, message',
    [
        (['--resume'], '--resume needs --exp_name'),
        (['--max_runtime=-1'], '--max_runtime must be >= 0'),
    ],
)
def test_refusals(data_dir, tmp_path, extra, message):
    # Settings refused before anything is loaded, in this process (as test_cli.py does).
    args = [f'--dataset_dir={data_dir}', f'--save_dir={tmp_path}', *TINY, '--offline_steps=1', '--online_steps=0']
    code, stderr = refusal_in_process('main.py', args + extra)
    assert code == 2 and message in stderr.strip().splitlines()[-1]


def test_a_save_dir_that_cannot_be_written_is_refused(data_dir):
    args = [f'--dataset_dir={data_dir}', '--save_dir=/proc/qc', *TINY, '--offline_steps=1', '--online_steps=0']
    proc = run_driver('main.py', args)
    assert proc.returncode == 2
    assert 'choose another --save_dir' in proc.stderr.strip().splitlines()[-1]


def test_an_existing_run_is_not_overwritten_without_resume(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv('WANDB_MODE', 'disabled')
    args = args_for(data_dir, tmp_path, 'taken', '--offline_steps=2', '--online_steps=0', '--save_interval=2',
                    '--eval_interval=0')  # fmt: skip
    train_in_process(args)
    with pytest.raises(UsageError, match='add --resume') as refused:
        Trainer(parse_run(main.PRESET, args), agents)
    assert refused.value.exit_code == 2


@pytest.mark.slow
def test_sigkill_then_resume_of_several_seeds_reproduces_the_uninterrupted_run(data_dir, tmp_path):
    # Blocks of 3 updates only (one compile); the evaluations at 12 and 24 leave time to kill it after step 12.
    seeds = ['--seeds=0,1', '--offline_steps=24', '--save_interval=6', '--log_interval=6', '--eval_interval=12']
    proc = start_driver(args_for(data_dir, tmp_path, 'killed', *OFFLINE, *seeds))
    killed = [run_dir_of(tmp_path, f'killed_sd{s}') for s in (0, 1)]
    assert wait_for(lambda: all(len(checkpoint_files(d)) >= 2 for d in killed), proc), 'too few checkpoints'
    time.sleep(np.random.default_rng().uniform(0.0, 0.1))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, 'the run ended before it was killed'
    # As if the kill came between the two seeds' files: seed 1 lacks the newest step, so both resume from the one
    # before it.
    os.remove(checkpoint_files(killed[1])[-1])

    resumed = run_driver('main.py', args_for(data_dir, tmp_path, 'killed', *OFFLINE, *seeds, '--resume'))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The killed run and its resume step their environments in worker processes; the whole run in this process.
    train_in_process(args_for(data_dir, tmp_path, 'whole', *OFFLINE, *seeds, '--env_workers=0'))
    for s, killed_dir in enumerate(killed):
        whole_dir = run_dir_of(tmp_path, f'whole_sd{s}')
        for name in ('offline_agent.csv', 'eval.csv'):
            assert comparable_rows(os.path.join(killed_dir, name)) == comparable_rows(os.path.join(whole_dir, name))
        assert_same_params(
            load_params(os.path.join(killed_dir, 'params_24.pkl')),
            load_params(os.path.join(whole_dir, 'params_24.pkl')),
        )
    assert comparable_rows(os.path.join(killed[0], 'offline_agent.csv')) != comparable_rows(
        os.path.join(killed[1], 'offline_agent.csv')
    )


def test_a_non_finite_loss_of_several_seeds_names_the_seed(data_dir, tmp_path):
    nan = ['--seeds=3,4', '--agent.lr=1e30', '--offline_steps=6', '--log_interval=3', '--save_interval=6',
           '--env_workers=0']
    proc = run_driver('main.py', args_for(data_dir, tmp_path, 'nan', *OFFLINE, *nan))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith('error: seed 3: non-finite values at step')
