"""OGBench family on tiny generated play datasets (a few short episodes in a temporary folder)."""

import os
import shutil

import numpy as np
import pytest

from envs import ogbench_utils
from envs.env_utils import EnvError, make_env_and_datasets
from envs.generate_ogbench import generate_dataset

EP_LEN = 40  # Steps per generated episode (OGBench: 1001); each episode gives EP_LEN - 1 transitions.
ENV_NAME = 'cube-single-play-singletask-task2-v0'


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp('ogbench')
    generate_dataset(
        'cube-single-play-v0',
        str(d / 'cube-single-play-v0.npz'),
        num_episodes=3,
        num_val_episodes=1,
        episode_length=EP_LEN,
        seed=0,
        show_progress=False,
    )
    return d


@pytest.fixture(scope='module')
def loaded(data_dir):
    return make_env_and_datasets(ENV_NAME, dataset_dir=str(data_dir), seed=0)


def test_generated_files_have_ogbench_layout(data_dir):
    for name, episodes in (('cube-single-play-v0.npz', 3), ('cube-single-play-v0-val.npz', 1)):
        with np.load(data_dir / name) as f:
            assert set(f.keys()) == {'observations', 'actions', 'terminals', 'qpos', 'qvel'}
            assert f['observations'].shape == (episodes * EP_LEN, 28) and f['observations'].dtype == np.float32
            assert f['actions'].shape == (episodes * EP_LEN, 5) and np.abs(f['actions']).max() <= 1.0
            assert f['terminals'].dtype == bool
            np.testing.assert_array_equal(np.nonzero(f['terminals'])[0], np.arange(1, episodes + 1) * EP_LEN - 1)
            assert f['qpos'].shape[1] == 21 and f['qvel'].shape[1] == 20


def test_generation_is_deterministic(tmp_path):
    paths = []
    for i in range(2):
        paths.append(str(tmp_path / f'run{i}' / 'cube-single-play-v0.npz'))
        generate_dataset(
            'cube-single-v0',
            paths[-1],
            num_episodes=1,
            num_val_episodes=1,
            episode_length=15,
            seed=3,
            show_progress=False,
        )
    with np.load(paths[0]) as a, np.load(paths[1]) as b:
        for k in a.keys():
            np.testing.assert_array_equal(a[k], b[k])


def test_datasets_shapes_dtypes_and_episode_ends(loaded):
    _, _, train, val = loaded
    n = 3 * (EP_LEN - 1)
    assert train.size == n and val.size == EP_LEN - 1
    assert set(train.keys()) == {'observations', 'actions', 'next_observations', 'rewards', 'masks', 'terminals'}
    for k, v in train.items():
        assert v.dtype == np.float32, k
    assert train['observations'].shape == (n, 28) and train['actions'].shape == (n, 5)
    np.testing.assert_array_equal(np.nonzero(train['terminals'])[0], np.arange(1, 4) * (EP_LEN - 1) - 1)
    # next_observations are the following observations inside an episode.
    inside = train['terminals'][:-1] == 0
    np.testing.assert_array_equal(train['next_observations'][:-1][inside], train['observations'][1:][inside])
    assert np.abs(train['actions']).max() <= 1 - 1e-5


def test_rewards_are_relabelled_like_ogbench(loaded, data_dir):
    import ogbench

    env, _, train, _ = loaded
    _, ref, _ = ogbench.make_env_and_datasets(ENV_NAME, dataset_path=str(data_dir / 'cube-single-play-v0.npz'))
    np.testing.assert_array_equal(train['rewards'], ref['rewards'])
    np.testing.assert_array_equal(train['masks'], ref['masks'])
    # One cube: reward is success - 1 and a success step does not bootstrap.
    assert set(np.unique(train['rewards'])) <= {-1.0, 0.0}
    np.testing.assert_array_equal(train['masks'], -train['rewards'])


def test_env_steps_and_reports_episode(loaded):
    env, eval_env, _, _ = loaded
    ob, _ = eval_env.reset(seed=1)
    assert ob.shape == (28,)
    for _ in range(3):
        ob, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert reward in (-1.0, 0.0) and 'success' in info and not any('privileged' in k for k in info)
    # Run to the time limit (200 steps for cube-single) so the monitor closes the episode.
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(np.zeros(5))
    assert {'return', 'length', 'success'} <= set(info['episode'])


def test_frame_stack_and_compact(data_dir):
    env, _, train, _ = make_env_and_datasets(ENV_NAME, dataset_dir=str(data_dir), frame_stack=2, compact_dataset=True)
    assert env.reset()[0].shape == (56,)
    assert 'next_observations' not in train and 'valids' in train and train.size == 3 * EP_LEN


def test_shards_cycle_one_at_a_time(data_dir, tmp_path):
    for i in range(2):
        shutil.copy(data_dir / 'cube-single-play-v0.npz', tmp_path / f'cube-single-play-v0-{i:03d}.npz')
    shutil.copy(data_dir / 'cube-single-play-v0-val.npz', tmp_path / 'cube-single-play-v0-000-val.npz')
    _, _, train, val = make_env_and_datasets(ENV_NAME, ogbench_dataset_dir=str(tmp_path))
    assert train.size == 3 * (EP_LEN - 1) and val.size == EP_LEN - 1
    cycler = ogbench_utils.OGBenchShardCycler(ENV_NAME, str(tmp_path))
    assert len(cycler) == 2 and cycler.current_path.endswith('-000.npz')
    first = cycler.current()
    second = cycler.next()
    assert cycler.current_path.endswith('-001.npz') and cycler.val_dataset() is None
    np.testing.assert_array_equal(first['rewards'], second['rewards'])
    cycler.next()
    assert cycler.index == 0 and np.abs(cycler.current()['actions']).max() <= 1 - 1e-5


def test_missing_dataset_names_path_and_generate_command(tmp_path):
    with pytest.raises(EnvError) as e:
        make_env_and_datasets('puzzle-3x3-play-singletask-task1-v0', dataset_dir=str(tmp_path))
    msg = str(e.value)
    assert os.path.join(str(tmp_path), 'puzzle-3x3-play-v0.npz') in msg
    assert 'python -m envs.generate_ogbench --env_name=puzzle-3x3-play-v0' in msg and '\n' not in msg
    with pytest.raises(EnvError, match='no dataset shards'):
        ogbench_utils.shard_paths(str(tmp_path))


def test_puzzle_generation_stores_button_states(tmp_path):
    path = str(tmp_path / 'puzzle-3x3-play-v0.npz')
    generate_dataset(
        'puzzle-3x3-play-v0', path, num_episodes=1, num_val_episodes=1, episode_length=10, show_progress=False
    )
    with np.load(path) as f:
        assert f['button_states'].shape == (10, 9) and f['button_states'].dtype == np.int64


def test_name_parsing():
    assert ogbench_utils.split_name('cube-double-play-singletask-task3-v0') == (
        'cube-double-singletask-task3-v0',
        'cube-double-play-v0',
    )
    assert ogbench_utils.split_name('scene-play-singletask-v0') == ('scene-singletask-v0', 'scene-play-v0')
    with pytest.raises(EnvError):
        generate_dataset('antmaze-large-v0', 'x.npz')
