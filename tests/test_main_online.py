"""Smoke runs of `main_online.py` (RLPD, RLPD-AC, QC-RLPD) on a tiny generated cube-single dataset: RLPD as a driver
subprocess, the others through the driver's `Trainer` in this process (the sweep tests run the driver for RLPD-AC)."""

import os

import pytest
from helpers import only_run_dir, parse_run, read_csv, refusal_in_process, run_driver

import main_online
from agents import agents
from training import Trainer

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
    'variant, in_process',
    [
        (['--horizon_length=1'], False),  # RLPD
        (['--horizon_length=3', '--agent.action_chunking=False', '--utd_ratio=2'], True),  # RLPD, n-step returns
        (['--horizon_length=3', '--agent.bc_alpha=0.01', '--utd_ratio=2'], True),  # QC-RLPD
    ],
    ids=['rlpd', 'nstep-utd2', 'qc-rlpd-utd2'],
)
def test_online_runs_write_logs_and_a_final_evaluation(data_dir, tmp_path, monkeypatch, variant, in_process):
    args = [*TINY, f'--dataset_dir={data_dir}', f'--save_dir={tmp_path}', '--online_steps=9', '--start_training=4',
            *variant]  # fmt: skip
    if in_process:
        monkeypatch.setenv('WANDB_MODE', 'disabled')
        Trainer(parse_run(main_online.PRESET, args), agents).train()
    else:
        proc = run_driver('main_online.py', args)
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
    code, stderr = refusal_in_process('main_online.py', TINY + args)
    assert code == 2 and stderr.strip().splitlines()[-1].startswith('error: --start_training')
