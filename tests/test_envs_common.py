"""Wrappers (`envs.common`), name dispatch and error reporting of `envs.env_utils` (mostly no simulator)."""

import ast
import inspect
import os
import subprocess
import sys
import textwrap

import gymnasium
import numpy as np
import pytest
from gymnasium.spaces import Box

from envs.common import (
    EnvError,
    EpisodeMonitor,
    FrameStackWrapper,
    RewardShiftWrapper,
    clip_actions,
    get_max_episode_steps,
)
from envs.env_utils import get_env_family
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


ENVS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'envs')
ENVS_MODULES = sorted(
    name[: -len('.py')] for name in os.listdir(ENVS_DIR) if name.endswith('.py') and name != '__init__.py'
)


def _envs_imports(module):
    """`envs` modules that `envs/<module>.py` imports anywhere (function-level imports too), read with `ast`."""
    with open(os.path.join(ENVS_DIR, f'{module}.py')) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else f'envs.{node.module}'
            names = [f'{base}.{alias.name}' if base == 'envs' else base for alias in node.names]
        else:
            continue
        found.update(name for name in names if name.startswith('envs.'))
    return found


def test_every_envs_module_imports_alone_in_a_fresh_interpreter():
    assert {'common', 'env_utils', 'ogbench_utils', 'generate_ogbench'} <= set(ENVS_MODULES)
    procs = {
        name: subprocess.Popen(
            [sys.executable, '-c', f'import envs.{name}'],
            cwd=os.path.dirname(ENVS_DIR),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ENVS_MODULES
    }
    failed = {name: p.communicate(timeout=120)[1][-2000:] for name, p in procs.items()}
    failed = {name: err for name, err in failed.items() if procs[name].returncode != 0}
    assert not failed, failed


def test_family_modules_import_only_envs_common_and_share_one_interface():
    from envs import env_utils

    assert list(env_utils.FAMILIES) == ['ogbench', 'robomimic', 'd4rl', 'minari']
    for family in env_utils.FAMILIES.values():
        module = family.__name__.split('.')[-1]
        assert _envs_imports(module) <= {'envs.common'}, (module, _envs_imports(module))
        for attr in ('matches', 'make_env', 'make_env_and_datasets', 'reward_shift', 'INFO_FILTERS'):
            assert hasattr(family, attr), (module, attr)
        params = list(inspect.signature(family.make_env).parameters)
        assert params == ['env_name', 'dataset_dir', 'seed'], (module, params)
        params = list(inspect.signature(family.make_env_and_datasets).parameters)
        assert params[:3] == ['env_name', 'dataset_dir', 'seed'], (module, params)
    # Nothing in envs/ but the registry imports the registry: no import circle through it.
    assert [m for m in ENVS_MODULES if 'envs.env_utils' in _envs_imports(m)] == []
    assert _envs_imports('env_utils') >= {f'envs.{f.__name__.split(".")[-1]}' for f in env_utils.FAMILIES.values()}


def test_ast_reader_sees_imports():
    assert _envs_imports('generate_robomimic') >= {'envs.common', 'envs.robomimic_utils'}
    assert 'envs.ogbench_utils' in _envs_imports('env_utils')


def test_family_interface_values():
    from envs import d4rl_utils, minari_utils, ogbench_utils, robomimic_utils

    assert ogbench_utils.INFO_FILTERS == ('.*privileged.*', '.*proprio.*') and ogbench_utils.reward_shift('x') == 0.0
    assert robomimic_utils.reward_shift('lift-mh-low_dim') == -1.0
    assert d4rl_utils.reward_shift('antmaze-large-diverse-v2') == -1.0 and d4rl_utils.reward_shift('pen-human-v1') == 0
    assert (
        minari_utils.reward_shift('D4RL/antmaze/umaze-v1') == -1.0
        and minari_utils.reward_shift('D4RL/pen/human-v2') == 0
    )
    assert ogbench_utils.matches('visual-cube-single-play-singletask-task1-v0')
    assert not d4rl_utils.matches('D4RL/antmaze/umaze-v1') and not minari_utils.matches('antmaze-umaze-v2')


def test_envs_error_is_a_user_error():
    from utils.errors import UserError

    assert issubclass(EnvError, UserError) and EnvError.exit_code == 2
    import envs.env_utils

    assert not hasattr(envs.env_utils, 'run_cli')


def test_ogbench_only_options_are_refused_elsewhere(tmp_path):
    from envs.env_utils import make_env_and_datasets, make_run_envs

    with pytest.raises(EnvError, match='--ogbench_dataset_dir only applies to OGBench'):
        make_run_envs('antmaze-large-diverse-v2', ogbench_dataset_dir=str(tmp_path))
    with pytest.raises(EnvError, match='--ogbench_dataset_dir only applies to OGBench'):
        make_env_and_datasets('lift-mh-low_dim', ogbench_dataset_dir=str(tmp_path))
    with pytest.raises(EnvError, match='compact_dataset only applies to OGBench'):
        make_env_and_datasets('pen-human-v1', compact_dataset=True)
    with pytest.raises(EnvError, match='at least one evaluation environment'):
        make_run_envs('pen-human-v1', num_eval_envs=0)
