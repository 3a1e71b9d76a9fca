"""Subprocess smoke runs of `main_online.py` (RLPD, RLPD-AC, QC-RLPD) on a tiny generated cube-single dataset."""

import os

import pytest
from helpers import only_run_dir, read_csv, run_driver

TINY = [
    '--env_name=cube-single-play-singletask-task2-v0',
    '--agent.actor_hidden_dims=(16,16)',
    '--agent.value_hidden_dims=(16,16)',
    '--agent.num_qs=2',
    '--agent.batch_size=8',
    '--eval_episodes=1',
    '--log_interval=4',
    '--eval_interval=0',
]


@pytest.mark.parametrize(
    'variant',
    [
        ['--horizon_length=1'],  # RLPD
        ['--horizon_length=3', '--agent.action_chunking=False', '--utd_ratio=2'],  # RLPD with n-step returns
        ['--horizon_length=3', '--agent.bc_alpha=0.01', '--utd_ratio=2'],  # QC-RLPD
    ],
    ids=['rlpd', 'nstep-utd2', 'qc-rlpd-utd2'],
)
def test_online_runs_write_logs_and_a_final_evaluation(data_dir, tmp_path, variant):
    args = [f'--dataset_dir={data_dir}', f'--save_dir={tmp_path}', '--online_steps=9', '--start_training=4']
    proc = run_driver('main_online.py', TINY + args + variant)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    online = read_csv(os.path.join(run_dir, 'online_agent.csv'))
    assert [int(r['step']) for r in online] == [4, 8]
    assert {'critic/critic_loss', 'actor/actor_loss', 'alpha/alpha'} <= set(online[0])
    evals = read_csv(os.path.join(run_dir, 'eval.csv'))
    assert [int(r['step']) for r in evals] == [9]
    assert not os.path.exists(os.path.join(run_dir, 'offline_agent.csv'))


def test_start_training_shorter_than_a_chunk_is_refused(data_dir, tmp_path):
    args = [f'--dataset_dir={data_dir}', f'--save_dir={tmp_path}', '--horizon_length=5', '--start_training=2']
    proc = run_driver('main_online.py', TINY + args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith('error: --start_training')
