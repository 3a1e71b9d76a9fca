"""Subprocess smoke runs of `main.py` on a tiny locally generated cube-single dataset."""

import ctypes.util
import glob
import json
import os
import pickle
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
from helpers import (
    ROOT,
    generate_ogbench,
    only_run_dir,
    parse_run,
    read_csv,
    refusal_in_process,
    run_driver,
    subprocess_env,
)

import main
import main_online
from agents import agents
from training import Trainer
from utils.flax_utils import restore_agent_with_file

ENV_NAME = 'cube-single-play-singletask-task2-v0'
TINY = [
    '--agent.actor_hidden_dims=(16,16)',
    '--agent.value_hidden_dims=(16,16)',
    '--agent.batch_size=8',
    '--agent.flow_steps=2',
    '--agent.actor_num_samples=2',
    '--eval_episodes=1',
    '--log_interval=5',
]


def run_main(data_dir, save_dir, *args):
    return run_driver(
        'main.py', [f'--env_name={ENV_NAME}', f'--dataset_dir={data_dir}', f'--save_dir={save_dir}', *TINY, *args]
    )


@pytest.mark.slow
def test_offline_then_online_with_utd_and_checkpoints(data_dir, tmp_path):
    proc = run_main(
        data_dir,
        tmp_path,
        '--offline_steps=12',
        '--online_steps=10',
        '--start_training=3',
        '--utd_ratio=2',
        '--eval_interval=10',
        '--save_interval=5',
        '--horizon_length=3',
        '--agent.actor_type=best-of-n',
        '--save_all_online_states=True',
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    for name in (
        'offline_agent.csv',
        'online_agent.csv',
        'eval.csv',
        'flags.json',
        'finished.json',
        'params_10.pkl',
        'params_22.pkl',
    ):
        assert os.path.exists(os.path.join(run_dir, name)), name

    offline = read_csv(os.path.join(run_dir, 'offline_agent.csv'))
    assert [int(r['step']) for r in offline] == [5, 10]
    assert {'critic/critic_loss', 'actor/bc_flow_loss', 'grad/norm'} <= set(offline[0])
    online = read_csv(os.path.join(run_dir, 'online_agent.csv'))
    assert [int(r['step']) for r in online] == [17, 22]
    # Evaluations at the interval and once after the last update of each phase, never twice on a step.
    evals = read_csv(os.path.join(run_dir, 'eval.csv'))
    assert [int(r['step']) for r in evals] == [10, 12, 22]
    assert {'success', 'episode.return', 'episode.length'} <= set(evals[0])  # the reference's names

    flags = json.load(open(os.path.join(run_dir, 'flags.json')))
    assert flags['agent']['horizon_length'] == 3 and flags['agent']['discount'] == 0.99 and 'discount' not in flags

    states = pickle.load(open(os.path.join(run_dir, 'data.pkl'), 'rb'))
    assert states['qpos'].shape[0] == states['qvel'].shape[0] == 10
    assert np.array_equal(states['steps'], np.arange(1, 11))

    # The last checkpoint restores into an agent built from the run's own flags.
    config = ml_collections.ConfigDict(flags['agent'])
    obs = np.zeros((1, 28), np.float32)
    agent = agents['acfql'].create(5, obs, np.zeros((1, 5), np.float32), config)
    restored = restore_agent_with_file(agent, os.path.join(run_dir, 'params_22.pkl'))
    assert int(restored.network.step) == 1 + 12 + 2 * (10 - 3 + 1)
    assert restored.sample_actions(obs[0], rng=jax.random.PRNGKey(0)).shape == (15,)


@pytest.mark.slow
@pytest.mark.parametrize(
    'preset, variant',
    [
        (main.PRESET, ['--agent.edit_scale=0.1', '--balanced_sampling']),
        (main_online.PRESET, ['--agent.fql_alpha=10', '--seeds=0']),
    ],
    ids=['qam-e-balanced', 'qam-f-online'],
)
def test_qam_runs_with_several_seeds(data_dir, tmp_path, monkeypatch, preset, variant):
    monkeypatch.setenv('WANDB_MODE', 'disabled')
    offline = ['--offline_steps=6'] if preset.offline else []
    args = [
        f'--env_name={ENV_NAME}', f'--dataset_dir={data_dir}', f'--save_dir={tmp_path}', '--agent=agents/qam.py',
        *[a for a in TINY if 'actor_num_samples' not in a], '--agent.num_qs=2', '--seeds=0,1', *offline,
        '--online_steps=6', '--start_training=3', '--horizon_length=3', '--eval_interval=0', '--log_interval=3',
        *variant,
    ]  # fmt: skip
    run = parse_run(preset, args)
    Trainer(run, agents).train()
    run_dirs = sorted(glob.glob(os.path.join(tmp_path, 'Debug', '*')))
    assert len(run_dirs) == run.num_seeds
    phases = (['offline_agent.csv'] if preset.offline else []) + ['online_agent.csv']
    for run_dir in run_dirs:
        for name in phases:
            rows = read_csv(os.path.join(run_dir, name))
            assert rows and {'critic/critic_loss', 'actor/adj_loss', 'actor/flow_loss'} <= set(rows[0]), name
        assert [int(r['step']) for r in read_csv(os.path.join(run_dir, 'eval.csv'))][-1] == 6 + (6 if offline else 0)
    losses = {read_csv(os.path.join(d, phases[0]))[0]['critic/critic_loss'] for d in run_dirs}
    assert len(losses) == run.num_seeds  # each seed its own run


@pytest.mark.parametrize(
    'args, width',
    [
        (['--offline_steps=6', '--online_steps=0', '--agent.action_chunking=False', '--horizon_length=4'], None),
        (['--offline_steps=0', '--online_steps=8', '--start_training=2', '--horizon_length=1'], None),
    ],
    ids=['offline-only-nstep', 'online-only-h1'],
)
def test_single_phase_runs(data_dir, tmp_path, args, width):
    proc = run_main(data_dir, tmp_path, '--eval_interval=0', *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    evals = read_csv(os.path.join(run_dir, 'eval.csv'))
    offline_steps = int(args[0].split('=')[1])
    online_steps = int(args[1].split('=')[1])
    # Exactly one evaluation, after the final update.
    assert [int(r['step']) for r in evals] == [offline_steps + online_steps]
    assert os.path.exists(os.path.join(run_dir, 'online_agent.csv')) == (online_steps > 0)
    assert os.path.exists(os.path.join(run_dir, 'offline_agent.csv')) == (offline_steps > 0)


@pytest.mark.parametrize(
    'args, message',
    [
        (['--env_name=nonexistent-env-v0'], 'unknown environment'),
        (['--horizon_length=0'], '--horizon_length must be >= 1'),
        (['--agent.actor_type=best-of-m'], 'actor_type'),
        (['--offline_steps=-5'], '--offline_steps must be >= 0'),
        (['--utd_ratio=0'], '--utd_ratio must be >= 1'),
        (['--dataset_dir=/nonexistent/dir'], 'is not a directory'),
    ],
)
def test_bad_inputs_are_refused_in_one_line_before_loading(data_dir, tmp_path, args, message):
    # What the driver does before it loads anything, in this process (the driver itself refuses in test_cli.py; a
    # missing dataset, found while loading, in test_the_note_is_printed_and_the_run_goes_on).
    argv = [f'--env_name={ENV_NAME}', f'--dataset_dir={data_dir}', f'--save_dir={tmp_path}', *TINY,
            '--offline_steps=1', '--online_steps=0', *args]  # fmt: skip
    code, stderr = refusal_in_process('main.py', argv)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith('error: ') and message in lines[0], stderr
    assert not glob.glob(os.path.join(tmp_path, '*', '*'))


def test_fused_offline_phase_logs_the_same_rows_as_one_update_per_step(data_dir, tmp_path, monkeypatch):
    # In this process (the driver's flags, parsed as it parses them, through its `Trainer`).
    monkeypatch.setenv('WANDB_MODE', 'disabled')
    rows = {}
    for fused in (1, 5):
        save_dir = tmp_path / f'fused{fused}'
        argv = [f'--env_name={ENV_NAME}', f'--dataset_dir={data_dir}', f'--save_dir={save_dir}', *TINY,
                '--offline_steps=12', '--online_steps=0', '--log_interval=4', '--eval_interval=0',
                f'--fused_steps={fused}']  # fmt: skip
        Trainer(parse_run(main.PRESET, argv), agents).train()
        rows[fused] = read_csv(os.path.join(only_run_dir(save_dir), 'offline_agent.csv'))
    assert [r['step'] for r in rows[1]] == [r['step'] for r in rows[5]] == ['4', '8', '12']
    for a, b in zip(rows[1], rows[5]):
        for key in ('critic/critic_loss', 'actor/actor_loss', 'grad/norm'):
            np.testing.assert_allclose(float(a[key]), float(b[key]), rtol=1e-4, err_msg=key)


@pytest.mark.skipif(ctypes.util.find_library('OSMesa') is None, reason='needs libosmesa6 (OSMesa) to render offscreen')
@pytest.mark.slow
def test_pixel_run_with_frame_stack_and_augmentation(tmp_path):
    """A visual OGBench run end to end: uint8 frames, impala encoder, stacked frames, random crops, both phases."""
    env = dict(subprocess_env(), MUJOCO_GL='osmesa', PYOPENGL_PLATFORM='osmesa')
    data_dir = generate_ogbench(tmp_path / 'data', 'visual-cube-single-play-v0', num_episodes=2, episode_length=20,
                                env=dict(MUJOCO_GL='osmesa', PYOPENGL_PLATFORM='osmesa'))  # fmt: skip
    args = [
        'main.py', '--env_name=visual-cube-single-play-singletask-task1-v0', f'--dataset_dir={data_dir}',
        f'--save_dir={tmp_path}', '--agent.encoder=impala_debug', *TINY[:2], '--agent.batch_size=4',
        '--agent.flow_steps=2', '--agent.actor_num_samples=2', '--offline_steps=4', '--online_steps=4',
        '--start_training=2', '--horizon_length=2', '--frame_stack=2', '--p_aug=0.5', '--eval_episodes=0',
        '--log_interval=2', '--eval_interval=0', '--buffer_size=100',
    ]  # fmt: skip
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next(d for d in glob.glob(os.path.join(str(tmp_path), 'Debug', '*')))
    assert [int(r['step']) for r in read_csv(os.path.join(run_dir, 'offline_agent.csv'))] == [2, 4]
    assert [int(r['step']) for r in read_csv(os.path.join(run_dir, 'online_agent.csv'))] == [6, 8]
    assert 'start-up: ' in proc.stdout
