"""Wrappers, name dispatch and error reporting of `envs.env_utils` (no simulator needed except where noted)."""

import subprocess
import sys
import textwrap

import gymnasium
import numpy as np
import pytest
from gymnasium.spaces import Box

from envs.env_utils import (
    EnvError,
    EpisodeMonitor,
    FrameStackWrapper,
    RewardShiftWrapper,
    clip_actions,
    get_env_family,
    get_max_episode_steps,
)
from utils.datasets import Dataset


class CountingEnv(gymnasium.Env):
    """Observation = step count (2 numbers); reward 1 per step; succeeds and terminates at step 3."""

    observation_space = Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
    action_space = Box(-1, 1, shape=(1,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        done = self.t == 3
        return np.full(2, self.t, np.float32), 1.0, done, False, {'success': float(done), 'privileged/x': 1}


def test_episode_monitor_reports_return_length_success_and_filters_info():
    env = RewardShiftWrapper(EpisodeMonitor(CountingEnv(), filter_regexes=['.*privileged.*']), -1.0)
    env.reset(seed=0)
    for _ in range(2):
        _, r, term, _, info = env.step(np.zeros(1))
        assert r == 0.0 and not term and 'episode' not in info and 'privileged/x' not in info
    _, _, term, _, info = env.step(np.zeros(1))
    assert term
    # The agent sees shifted rewards; the statistics keep the task's own return.
    assert info['episode']['return'] == 3.0 and info['episode']['length'] == 3 and info['episode']['success'] == 1.0
    env.reset()
    _, _, _, _, info = env.step(np.zeros(1))
    assert info['total']['timesteps'] == 4


def test_frame_stack_repeats_first_frame_then_slides():
    env = FrameStackWrapper(CountingEnv(), 3)
    assert env.observation_space.shape == (6,)
    ob, _ = env.reset()
    np.testing.assert_array_equal(ob, np.zeros(6))
    ob, *_ = env.step(np.zeros(1))
    ob, *_ = env.step(np.zeros(1))
    np.testing.assert_array_equal(ob, [0, 0, 1, 1, 2, 2])


def test_max_episode_steps_found_through_wrappers():
    env = EpisodeMonitor(gymnasium.wrappers.TimeLimit(CountingEnv(), 17))
    assert get_max_episode_steps(env) == 17
    assert get_max_episode_steps(CountingEnv()) is None


def test_clip_actions_keeps_other_fields():
    ds = Dataset.create(observations=np.zeros((3, 1)), actions=np.array([[-1.0], [0.5], [1.0]]))
    clipped = clip_actions(ds, 1e-5)
    np.testing.assert_allclose(clipped['actions'][:, 0], [-1 + 1e-5, 0.5, 1 - 1e-5])
    assert clip_actions(ds, None) is ds and clip_actions(None, 1e-5) is None


@pytest.mark.parametrize(
    'name,family',
    [
        ('cube-single-play-singletask-task2-v0', 'ogbench'),
        ('cube-quadruple-play-100m-singletask-task1-v0', 'ogbench'),
        ('puzzle-4x4-play-singletask-v0', 'ogbench'),
        ('square-mh-low_dim', 'robomimic'),
        ('lift-ph-low_dim', 'robomimic'),
        ('antmaze-large-diverse-v2', 'd4rl'),
        ('antmaze-umaze-v2', 'd4rl'),
        ('relocate-expert-v1', 'd4rl'),
        ('D4RL/antmaze/medium-play-v1', 'minari'),
    ],
)
def test_family_dispatch(name, family):
    assert get_env_family(name) == family


def test_unknown_name_lists_families():
    with pytest.raises(EnvError, match='unknown environment .*ogbench, robomimic, d4rl, minari'):
        get_env_family('halfcheetah-medium-v2')


def test_cli_error_is_one_line_without_traceback():
    res = subprocess.run(
        [sys.executable, '-m', 'envs.generate_ogbench', '--env_name=not-an-env'], capture_output=True, text=True
    )
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.startswith('error:')]
    assert len(lines) == 1 and 'Traceback' not in res.stderr


def test_ogbench_path_needs_no_optional_family(tmp_path):
    """OGBench names dispatch and report missing data with robosuite, gymnasium_robotics, h5py and d4rl blocked."""
    code = textwrap.dedent(f"""
        import sys
        for mod in ('robosuite', 'gymnasium_robotics', 'd4rl', 'h5py', 'robomimic'):
            sys.modules[mod] = None  # makes `import mod` fail
        from envs.env_utils import EnvError, make_env_and_datasets
        try:
            make_env_and_datasets('cube-single-play-singletask-task1-v0', dataset_dir={str(tmp_path)!r})
        except EnvError as e:
            assert 'generate_ogbench' in str(e), e
            print('ok')
    """)
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert res.stdout.strip().endswith('ok'), res.stderr[-2000:]
