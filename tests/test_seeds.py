"""Several seeds in one process (`--seeds`): each seed computes what a run with `--seed` alone computes.

The vmapped program may batch matmuls differently from the single-seed one, so losses and parameters agree to
float32 rounding (TOL), not bit for bit. Everything drawn on the host (data batches, environment resets, action
queues, evaluation seeds) is exactly the single run's.
"""

import json
import os

import jax
import numpy as np
import pytest
from helpers import parse_run, read_csv

import main
from agents import agents
from training import Trainer
from utils.errors import UsageError

TOL = dict(rtol=2e-4, atol=2e-5)
# Every seed's environments in this process (`--env_workers=0`): workers step them exactly alike
# (tests/test_online_schedule.py), and each would start a process that imports and builds its environments anew.
TINY = [
    '--env_name=cube-single-play-singletask-task2-v0', '--agent.actor_hidden_dims=(16,16)',
    '--agent.value_hidden_dims=(16,16)', '--agent.batch_size=8', '--eval_envs=1', '--horizon_length=2',
    '--buffer_size=400', '--env_workers=0',
]  # fmt: skip
AGENTS = {
    'qc': [
        '--agent=agents/acfql.py',
        '--agent.actor_type=best-of-n',
        '--agent.flow_steps=2',
        '--agent.actor_num_samples=2',
    ],
    'qc-fql': ['--agent=agents/acfql.py', '--agent.actor_type=distill-ddpg', '--agent.flow_steps=2'],
    'qc-rlpd': ['--agent=agents/acrlpd.py', '--agent.num_qs=2', '--agent.bc_alpha=0.1'],
}
OFFLINE = ['--offline_steps=6', '--online_steps=0', '--fused_steps=3', '--log_interval=3', '--eval_interval=0',
           '--save_interval=6']  # fmt: skip


pytestmark = pytest.mark.usefixtures('no_wandb')


def train(cube_dir, save_dir, agent, *args):
    argv = [*AGENTS[agent], f'--dataset_dir={cube_dir}', f'--save_dir={save_dir}', *TINY, *args]
    trainer = Trainer(parse_run(main.PRESET, argv), agents)
    trainer.train()
    return trainer


def loss_rows(run_dir, name):
    """(step, {key: value}) rows of a CSV, wall-clock columns left out."""
    rows = read_csv(os.path.join(run_dir, name))
    wall_clock = ('step', 'time/total', 'episode.duration')
    return [(r['step'], {k: float(v) for k, v in r.items() if k not in wall_clock and v}) for r in rows]


def assert_rows_close(a, b):
    assert [step for step, _ in a] == [step for step, _ in b]
    for (_, x), (_, y) in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        np.testing.assert_allclose([x[k] for k in x], [y[k] for k in x], **TOL)


# Every seed of one agent type (with an evaluation), and the last seed (made apart from the first seed's environments
# and data) of the others: the vmapped program is the same for every seed, and each comparison costs a compile.
OFFLINE_CASES = [('qc', (0, 1, 2), (0, 1, 2), 1), ('qc-fql', (0, 2), (2,), 0), ('qc-rlpd', (0, 2), (2,), 0)]


@pytest.mark.parametrize('agent, seeds, compared, episodes', OFFLINE_CASES)
@pytest.mark.slow
def test_offline_seeds_log_what_each_seed_logs_alone(cube_dir, tmp_path, agent, seeds, compared, episodes):
    seed_list = ','.join(map(str, seeds))
    args = [*OFFLINE, f'--eval_episodes={episodes}']
    group = train(cube_dir, tmp_path, agent, *args, f'--seeds={seed_list}', '--exp_name=group')
    assert [lane.run_dir for lane in group.lanes] == [str(tmp_path / 'Debug' / f'group_sd{s}') for s in seeds]
    for seed in compared:
        i = seeds.index(seed)
        alone = train(cube_dir, tmp_path, agent, *args, f'--seed={seed}', f'--exp_name=alone{seed}')
        lane_dir, alone_dir = group.lanes[i].run_dir, alone.lanes[0].run_dir
        # The same files as a single-seed run, and a flags.json that is that run's.
        assert sorted(os.listdir(lane_dir)) == sorted(os.listdir(alone_dir))
        with open(os.path.join(lane_dir, 'flags.json')) as f, open(os.path.join(alone_dir, 'flags.json')) as g:
            lane_flags, alone_flags = json.load(f), json.load(g)
        assert lane_flags['seed'] == seed and 'seeds' not in lane_flags
        for flags in (lane_flags, alone_flags):
            for key in ('exp_name', 'seed'):
                flags.pop(key)
        assert lane_flags == alone_flags
        assert_rows_close(loss_rows(lane_dir, 'offline_agent.csv'), loss_rows(alone_dir, 'offline_agent.csv'))
        if episodes:
            assert_rows_close(loss_rows(lane_dir, 'eval.csv'), loss_rows(alone_dir, 'eval.csv'))
        jax.tree_util.tree_map(
            lambda x, y: np.testing.assert_allclose(x, y, **TOL),
            group.agents.agent(i).network.params,
            alone.agents.agent(0).network.params,
        )
    # Seeds differ from one another (the stream of each is its own).
    rows = [loss_rows(lane.run_dir, 'offline_agent.csv')[0][1] for lane in group.lanes]
    assert rows[0]['critic/critic_loss'] != rows[1]['critic/critic_loss']


@pytest.mark.slow
def test_online_seeds_start_like_each_seed_alone(cube_dir, tmp_path):
    """The first chunk and the first update of every seed match its single run; after that, float rounding of the
    vmapped update may change later chunks, so trajectories are allowed to drift and are not compared."""
    online = ['--offline_steps=0', '--online_steps=3', '--start_training=1', '--log_interval=1',
              '--eval_episodes=0', '--eval_interval=0']  # fmt: skip
    group = train(cube_dir, tmp_path, 'qc', *online, '--seeds=0,1', '--exp_name=group')
    for i, seed in enumerate((0, 1)):
        alone = train(cube_dir, tmp_path, 'qc', *online, f'--seed={seed}', f'--exp_name=alone{seed}')
        lane = group.lanes[i]
        # The replay buffer's first online rows hold the first chunk (H = 2 actions); the prefix is shared.
        alone_actions = alone.lanes[0].replay.online['actions']
        np.testing.assert_allclose(lane.replay.online['actions'][:2], alone_actions[:2], **TOL)
        assert lane.replay.size == alone.lanes[0].replay.size == alone.lanes[0].dataset.size + 3
        assert np.shares_memory(lane.replay.prefix['actions'], group.lanes[0].dataset['actions'])
        first_group = loss_rows(lane.run_dir, 'online_agent.csv')[:1]
        first_alone = loss_rows(alone.lanes[0].run_dir, 'online_agent.csv')[:1]
        assert_rows_close(first_group, first_alone)
    first_actions = [lane.replay.online['actions'][0] for lane in group.lanes]
    assert not np.allclose(first_actions[0], first_actions[1])


def test_seed_flags_are_checked():
    assert parse_run(main.PRESET, ['--seeds=3,1']).seeds == (3, 1)
    assert parse_run(main.PRESET, ['--seed=4']).seeds == (4,)
    assert parse_run(main.PRESET, ['--seed=4', '--seeds=4']).seeds == (4,)
    for argv, message in [
        (['--seed=1', '--seeds=0,1'], 'disagree'),
        (['--seeds=0,0'], 'distinct'),
        (['--seeds=0,x'], 'comma-separated integers'),
    ]:
        with pytest.raises(UsageError, match=message):
            parse_run(main.PRESET, argv)
