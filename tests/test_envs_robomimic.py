"""RoboMimic family on a tiny scripted Lift dataset written through robosuite in a temporary folder."""

import json

import numpy as np
import pytest

pytest.importorskip('robosuite')
h5py = pytest.importorskip('h5py')

from envs import robomimic_utils  # noqa: E402
from envs.common import EnvError, get_max_episode_steps  # noqa: E402
from envs.env_utils import make_env_and_datasets  # noqa: E402
from envs.generate_robomimic import generate_dataset, scripted_lift_action  # noqa: E402

ENV_NAME = 'lift-mh-low_dim'


@pytest.fixture(scope='module')
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp('robomimic')
    n = generate_dataset(
        str(d / 'lift' / 'mh' / 'low_dim_v15.hdf5'), num_demos=2, max_steps=150, seed=0, show_progress=False
    )
    assert n == 2  # The scripted policy lifts the cube.
    return d


@pytest.fixture(scope='module')
def loaded(root):
    return make_env_and_datasets(ENV_NAME, dataset_dir=str(root), seed=0)


def test_file_layout(root):
    with h5py.File(root / 'lift' / 'mh' / 'low_dim_v15.hdf5', 'r') as f:
        env_args = json.loads(f['data'].attrs['env_args'])
        assert env_args['env_name'] == 'Lift'
        demo = f['data/demo_0']
        n = demo.attrs['num_samples']
        assert demo['actions'].shape == (n, 7) and demo['dones'][-1] == 1 and demo['rewards'][-1] == 1
        for k in robomimic_utils.LOW_DIM_KEYS:
            assert demo['obs'][k].shape[0] == n and demo['next_obs'][k].shape[0] == n


def test_dataset_rewards_terminals_masks(loaded, root):
    _, _, train, val = loaded
    assert val is None
    assert train['observations'].shape[1] == 19 and train['actions'].shape[1] == 7
    for v in train.values():
        assert v.dtype == np.float32
    ends = np.nonzero(train['terminals'])[0]
    assert len(ends) == 2 and ends[-1] == train.size - 1
    # Shifted sparse reward: -1 everywhere except the success step; no bootstrap from it.
    np.testing.assert_array_equal(train['rewards'][ends], [0.0, 0.0])
    assert (train['rewards'][train['terminals'] == 0] == -1.0).all()
    np.testing.assert_array_equal(train['masks'], train['terminals'] == 0)
    inside = train['terminals'][:-1] == 0
    np.testing.assert_allclose(train['next_observations'][:-1][inside], train['observations'][1:][inside])


def test_env_reward_shift_success_and_limits(loaded):
    env, eval_env, _, _ = loaded
    assert get_max_episode_steps(env) == 300
    ob, _ = env.reset(seed=5)
    assert ob.shape == (19,) and env.observation_space.shape == (19,)
    _, reward, terminated, _, info = env.step(np.zeros(7))
    assert reward == -1.0 and not terminated and info['success'] == 0.0
    # Drive the evaluation env with the scripted policy until it succeeds.
    eval_env.reset(seed=0)
    rs_env = eval_env.unwrapped.env
    rng = np.random.default_rng(0)
    phase = (0, 0)
    for _ in range(150):
        action, phase = scripted_lift_action(rs_env._get_observations(force_update=True), phase, rng, 0.0)
        _, reward, terminated, truncated, info = eval_env.step(action)
        if terminated or truncated:
            break
    assert terminated and reward == 0.0 and info['episode']['success'] == 1.0 and info['episode']['return'] == 1.0


def test_seeded_resets_repeat(loaded):
    env = loaded[0]
    a, _ = env.reset(seed=11)
    b, _ = env.reset(seed=11)
    np.testing.assert_array_equal(a, b)


def test_missing_dataset_and_bad_name(tmp_path):
    with pytest.raises(EnvError) as e:
        make_env_and_datasets('square-ph-low_dim', dataset_dir=str(tmp_path))
    assert str(tmp_path / 'square' / 'ph' / 'low_dim_v15.hdf5') in str(e.value)
    assert 'python -m envs.generate_robomimic' in str(e.value)
    assert not robomimic_utils.is_robomimic_env('lift-xx-low_dim')
    assert robomimic_utils.get_max_episode_length('tool_hang-ph-low_dim') == 1000


def test_env_args_from_other_robosuite_versions():
    from envs.generate_robomimic import lift_env_args

    env_args = lift_env_args()  # pre-1.5 single-arm controller config
    env_args['env_kwargs'].update(camera_names=['agentview'], an_argument_from_another_version=1)
    env = robomimic_utils.make_robosuite_env(env_args, seed=0)
    assert env.action_dim == 7
    env.close()
    with pytest.raises(EnvError, match='no task'):
        robomimic_utils.make_robosuite_env({'env_name': 'NoSuchTask', 'env_kwargs': {}})
