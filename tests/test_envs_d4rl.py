"""D4RL-style family: q-learning semantics on hand-made arrays, and generated AntMaze/Adroit/Minari files."""

import gymnasium
import numpy as np
import pytest

h5py = pytest.importorskip('h5py')

from envs import d4rl_utils  # noqa: E402
from envs.common import EnvError, get_max_episode_steps  # noqa: E402
from envs.env_utils import make_env_and_datasets  # noqa: E402


def _arrays():
    # Rows 0-2 end by time limit at row 2; row 3 is a true terminal (the data goes on from its next state).
    obs = np.arange(6, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    return dict(
        observations=obs,
        actions=np.zeros((6, 1), np.float32),
        rewards=np.array([0, 0, 0, 1, 0, 0], np.float32),
        terminals=np.array([0, 0, 0, 1, 0, 0], bool),
        timeouts=np.array([0, 0, 1, 0, 0, 0], bool),
    )


def test_qlearning_semantics():
    tr = d4rl_utils.qlearning_transitions(**_arrays())
    np.testing.assert_array_equal(tr['observations'][:, 0], [0, 1, 3, 4])  # timeout row 2 and last row dropped
    np.testing.assert_array_equal(tr['next_observations'][:, 0], [1, 2, 4, 5])
    terminals, masks = d4rl_utils.episode_fields(tr, antmaze=False)
    np.testing.assert_array_equal(terminals, [0, 1, 1, 1])  # jump after row 1; terminal at row 3; last row
    np.testing.assert_array_equal(masks, [1, 1, 0, 1])
    terminals, _ = d4rl_utils.episode_fields(tr, antmaze=True)
    np.testing.assert_array_equal(terminals, [0, 1, 0, 1])  # AntMaze episodes go on through the goal


def test_loader_shifts_antmaze_rewards(tmp_path):
    for name in ('antmaze-umaze-v2', 'door-human-v1'):
        with h5py.File(tmp_path / f'{name}.hdf5', 'w') as f:
            for k, v in _arrays().items():
                f.create_dataset(k, data=v)
        ds = d4rl_utils.load_d4rl_dataset(str(tmp_path / f'{name}.hdf5'), name)
        shift = -1.0 if 'antmaze' in name else 0.0
        np.testing.assert_array_equal(ds['rewards'], np.array([0, 0, 1, 0], np.float32) + shift)


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    pytest.importorskip('gymnasium_robotics')
    from envs.generate_d4rl import generate_dataset

    d = tmp_path_factory.mktemp('d4rl')
    for name in ('antmaze-umaze-diverse-v2', 'pen-human-v1'):
        generate_dataset(name, str(d / f'{name}.hdf5'), num_episodes=2, episode_length=15, seed=0)
    return d


@pytest.mark.parametrize(
    'name,obs_dim,act_dim,limit', [('antmaze-umaze-diverse-v2', 29, 8, 700), ('pen-human-v1', 45, 24, 100)]
)
def test_generated_file_loads_with_env(data_dir, name, obs_dim, act_dim, limit):
    env, eval_env, train, val = make_env_and_datasets(name, dataset_dir=str(data_dir), seed=0)
    assert val is None and train.size == 2 * 14
    assert train['observations'].shape == (28, obs_dim) and train['actions'].shape == (28, act_dim)
    np.testing.assert_array_equal(np.nonzero(train['terminals'])[0], [13, 27])
    assert (train['masks'] == 1).all()
    assert get_max_episode_steps(env) == limit
    ob, _ = eval_env.reset(seed=0)
    assert ob.shape == (obs_dim,)
    _, reward, _, _, info = env.step(env.action_space.sample())
    assert 'success' in info
    if 'antmaze' in name:
        assert reward == -1.0  # online shift like the data
        assert np.linalg.norm(ob[:2]) < 0.2  # D4RL frame: the start cell is the origin
        np.testing.assert_allclose(env.get_wrapper_attr('target_goal'), [0.0, 8.0])
        assert d4rl_utils.get_normalized_score(name, 1.0) == 1.0
    else:
        assert d4rl_utils.get_normalized_score(name, 3076.8331) == pytest.approx(1.0)


def test_minari_local_file(tmp_path):
    pytest.importorskip('gymnasium_robotics')
    import gymnasium_robotics

    gymnasium.register_envs(gymnasium_robotics)
    name = 'D4RL/antmaze/umaze-v1'
    path = tmp_path / name / 'data' / 'main_data.hdf5'
    path.parent.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with h5py.File(path, 'w') as f:
        f.attrs['env_spec'] = gymnasium.spec('AntMaze_UMaze-v4').to_json()
        for i, n in enumerate((5, 4)):
            g = f.create_group(f'episode_{i}')
            o = g.create_group('observations')
            o['observation'] = rng.normal(size=(n + 1, 27))
            o['achieved_goal'] = rng.normal(size=(n + 1, 2))
            o['desired_goal'] = rng.normal(size=(n + 1, 2))
            g['actions'] = rng.uniform(-1, 1, size=(n, 8))
            g['rewards'] = np.eye(n)[-1] if i == 0 else np.zeros(n)
            g['terminations'] = np.eye(n)[-1].astype(bool) if i == 0 else np.zeros(n, bool)
            g['truncations'] = np.zeros(n, bool)
    env, _, train, _ = make_env_and_datasets(name, dataset_dir=str(tmp_path))
    assert train.size == 9 and train['observations'].shape == (9, 29)
    np.testing.assert_array_equal(np.nonzero(train['terminals'])[0], [4, 8])
    np.testing.assert_array_equal(train['masks'][[4, 8]], [0, 1])
    assert train['rewards'][4] == 0.0 and train['rewards'][0] == -1.0
    assert env.reset(seed=0)[0].shape == (29,)


def test_missing_dataset_errors(tmp_path):
    with pytest.raises(EnvError) as e:
        make_env_and_datasets('antmaze-large-play-v2', dataset_dir=str(tmp_path))
    assert str(tmp_path / 'antmaze-large-play-v2.hdf5') in str(e.value) and 'envs.generate_d4rl' in str(e.value)
    with pytest.raises(EnvError, match='minari download D4RL/antmaze/large-play-v1'):
        make_env_and_datasets('D4RL/antmaze/large-play-v1', dataset_dir=str(tmp_path))


def test_an_antmaze_environment_leaves_no_file_in_the_temp_folder(tmp_path, monkeypatch):
    """Gymnasium-Robotics writes each maze's XML to a file in the temp folder; the environment removes it once made,
    and still resets and steps (its model was loaded from it)."""
    pytest.importorskip('gymnasium_robotics')
    import tempfile

    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    env = d4rl_utils.GymRoboticsAntMaze('antmaze-umaze-diverse-v2')
    assert list(tmp_path.iterdir()) == []
    env.reset(seed=0)
    assert env.step(env.action_space.sample())[0].shape == (29,)
