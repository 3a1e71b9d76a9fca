"""RoboMimic low-dim tasks (`lift-mh-low_dim`, `can-ph-low_dim`, ...), built with robosuite directly.

The PyPI `robomimic` package needs mujoco_py, so the environment is rebuilt here from the dataset's `env_args`
(the JSON attribute of its `data` group) with robosuite 1.5, and observed through the low-dim keys RoboMimic uses.
Rewards are RoboMimic's sparse success rewards shifted by `REWARD_SHIFT` (-1), offline here and online through the
wrapper that `envs.env_utils` adds.
"""

import inspect
import json
import os
import re

import gymnasium
import numpy as np
from gymnasium.spaces import Box

from envs.common import EnvError, check_layout, check_values, dataset_from_arrays, load_checked, open_hdf5, require

DEFAULT_DATASET_DIR = '~/.robomimic'
DATASET_FILE = 'low_dim_v15.hdf5'
LOW_DIM_KEYS = ('robot0_eef_pos', 'robot0_eef_quat', 'robot0_gripper_qpos', 'object')
MAX_EPISODE_LENGTHS = {'lift': 300, 'can': 300, 'square': 400, 'transport': 800, 'tool_hang': 1000}
REWARD_SHIFT = -1.0
ROBOSUITE_INSTALL = (
    'pip install --no-deps robosuite==1.5.2 && pip install numba==0.68.1 termcolor==3.3.0 '
    'opencv-python-headless==4.13.0.92'
)
_NAME_RE = re.compile(r'^(?P<task>lift|can|square|transport|tool_hang)-(?P<type>mh|ph)-low_dim$')


def is_robomimic_env(env_name):
    """Whether `env_name` is a RoboMimic low-dim name such as `square-mh-low_dim`."""
    return _NAME_RE.match(env_name) is not None


def parse_name(env_name):
    """(task, dataset type) of a RoboMimic name."""
    m = _NAME_RE.match(env_name)
    if m is None:
        raise EnvError(f'{env_name!r} is not a RoboMimic name (<task>-<mh|ph>-low_dim, e.g. lift-mh-low_dim)')
    return m['task'], m['type']


def get_max_episode_length(env_name):
    """Online time limit of a RoboMimic task (the same limits as the reference implementation)."""
    return MAX_EPISODE_LENGTHS[parse_name(env_name)[0]]


def dataset_path(env_name, dataset_dir=None):
    """`<dataset_dir>/<task>/<type>/low_dim_v15.hdf5` (or `dataset_dir` itself when it is an hdf5 file).

    Raises `EnvError` when the file is missing.
    """
    task, kind = parse_name(env_name)
    root = os.path.expanduser(dataset_dir or DEFAULT_DATASET_DIR)
    path = root if root.endswith('.hdf5') else os.path.join(root, task, kind, DATASET_FILE)
    if not os.path.exists(path):
        raise EnvError(
            f'RoboMimic dataset not found at {path}; download {task}/{kind}/{DATASET_FILE} from the RoboMimic v0.5 '
            f'dataset release into that path, or write a small scripted Lift dataset with: '
            f'python -m envs.generate_robomimic --save_path={path}'
        )
    return path


def read_env_args(path):
    """The environment metadata (`env_args` JSON) stored in a RoboMimic hdf5 file."""
    h5py = require('h5py', 'pip install h5py')
    with h5py.File(path, 'r') as f:
        raw = f['data'].attrs['env_args']
    return json.loads(raw)


def make_robosuite_env(env_args, seed=None):
    """A robosuite environment from RoboMimic `env_args`, converting pre-1.5 controller configs."""
    require('robosuite', ROBOSUITE_INSTALL)
    import robosuite
    from robosuite.controllers.composite.composite_controller_factory import refactor_composite_controller_config

    kwargs = dict(env_args.get('env_kwargs', {}))
    robots = kwargs.get('robots', ['Panda'])
    robots = [robots] if isinstance(robots, str) else list(robots)
    if 'controller_configs' in kwargs:
        # Files written for robosuite < 1.5 hold one arm controller; 1.5 expects a composite config around it.
        arms = ['right', 'left'] if robots[0] == 'Baxter' else ['right']
        kwargs['controller_configs'] = refactor_composite_controller_config(
            kwargs['controller_configs'], robots[0], arms
        )
    kwargs.update(
        has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False, ignore_done=True, use_object_obs=True
    )
    for key in ('camera_depths', 'camera_heights', 'camera_widths', 'camera_names', 'render_gpu_device_id'):
        kwargs.pop(key, None)
    if seed is not None:
        kwargs['seed'] = int(seed)
    env_cls = robosuite.environments.base.REGISTERED_ENVS.get(env_args['env_name'])
    if env_cls is None:
        raise EnvError(f'robosuite {robosuite.__version__} has no task {env_args["env_name"]!r} (from the dataset)')
    # Files written by other robosuite versions may carry arguments this version's constructor does not take.
    params = inspect.signature(env_cls.__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return robosuite.make(env_args['env_name'], **kwargs)


def low_dim_observation(raw_obs, keys=LOW_DIM_KEYS):
    """Concatenated low-dim observation; RoboMimic's `object` key is robosuite's `object-state`."""
    parts = []
    for k in keys:
        v = raw_obs['object-state'] if k == 'object' and 'object' not in raw_obs else raw_obs[k]
        parts.append(np.asarray(v, dtype=np.float32).ravel())
    return np.concatenate(parts)


class RobomimicLowDimEnv(gymnasium.Env):
    """Gymnasium view of a robosuite task with RoboMimic's low-dim observation.

    Reward: 1 on success, else 0 (the sparse task reward). The episode terminates on success and is truncated
    after `max_episode_length` steps; `info['success']` is 1.0 or 0.0.
    """

    metadata = {'render_modes': []}

    def __init__(self, env_args, max_episode_length, seed=None, obs_keys=LOW_DIM_KEYS):
        self.env_args = env_args
        self.obs_keys = tuple(obs_keys)
        self.max_episode_length = int(max_episode_length)
        self._seed = seed
        self.env = make_robosuite_env(env_args, seed=seed)
        self._t = 0
        low, high = self.env.action_spec
        self.action_space = Box(low=np.asarray(low, np.float32), high=np.asarray(high, np.float32), dtype=np.float32)
        ob = low_dim_observation(self.env.reset(), self.obs_keys)
        self.observation_space = Box(-np.inf, np.inf, shape=ob.shape, dtype=np.float32)

    @property
    def max_episode_steps(self):
        """Online time limit (read by `envs.common.get_max_episode_steps`)."""
        return self.max_episode_length

    def reset(self, *, seed=None, options=None):
        """Starts an episode; a `seed` rebuilds the task's random generator so resets become reproducible."""
        super().reset(seed=seed)
        if seed is not None:
            self.env.rng = np.random.default_rng(seed)
            self._reseed_placements()
        self._t = 0
        return low_dim_observation(self.env.reset(), self.obs_keys), {}

    def _reseed_placements(self):
        # Object placement samplers hold their own reference to the generator they were built with.
        sampler = getattr(self.env, 'placement_initializer', None)
        stack = [sampler] if sampler is not None else []
        while stack:
            s = stack.pop()
            if hasattr(s, 'rng'):
                s.rng = self.env.rng
            stack.extend(getattr(s, 'samplers', {}).values())

    def step(self, action):
        raw, _, _, info = self.env.step(np.asarray(action, dtype=np.float64))
        self._t += 1
        success = bool(self.env._check_success())
        info = dict(info)
        info['success'] = float(success)
        reward = float(success)
        truncated = not success and self._t >= self.max_episode_length
        return low_dim_observation(raw, self.obs_keys), reward, success, truncated, info

    def get_state(self):
        """Flattened MuJoCo state (as stored in RoboMimic's `states` dataset)."""
        return np.asarray(self.env.sim.get_state().flatten())

    def close(self):
        self.env.close()


def make_robomimic_env(env_name, dataset_path, seed=0):
    """The gymnasium environment of `env_name`, built from the metadata of the hdf5 file at `dataset_path`."""
    return RobomimicLowDimEnv(read_env_args(dataset_path), get_max_episode_length(env_name), seed=seed)


def _stacked(group, keys, n):
    return np.concatenate([np.asarray(group[k], np.float32).reshape(n, -1) for k in keys], axis=-1)


def load_robomimic_dataset(path, obs_keys=LOW_DIM_KEYS, reward_shift=REWARD_SHIFT):
    """A `Dataset` of every demo in a RoboMimic hdf5 file, in demo order.

    `terminals` is 1 at the last step of every demo (and where the file's `dones` is 1); `masks` is 1 - dones, so
    the success step does not bootstrap; rewards are the file's rewards plus `reward_shift`.
    """
    fields = {k: [] for k in ('observations', 'actions', 'rewards', 'terminals', 'masks', 'next_observations')}
    with open_hdf5(path) as f:
        if 'data' not in f:
            raise EnvError(f'{path} is not a RoboMimic file: it has no data/ group')
        demos = sorted(f['data'].keys(), key=lambda d: int(d.split('_')[-1]))
        if not demos:
            raise EnvError(f'the RoboMimic file {path} holds no demos under data/')
        for d in demos:
            g = f['data'][d]
            where = f'{path} (data/{d})'
            check_layout(where, {k: (g[k].shape, g[k].dtype) for k in ('actions', 'rewards', 'dones') if k in g},
                         required=('actions', 'rewards', 'dones'))  # fmt: skip
            # A demo without one of the observation keys is reported by load_checked, naming the file.
            obs = load_checked(where, lambda g=g: _stacked(g['obs'], obs_keys, len(g['actions'])))
            next_obs = load_checked(where, lambda g=g: _stacked(g['next_obs'], obs_keys, len(g['actions'])))
            dones = np.asarray(g['dones'], np.float32)
            terminals = dones.copy()
            terminals[-1] = 1.0
            fields['observations'].append(obs)
            fields['next_observations'].append(next_obs)
            fields['actions'].append(np.asarray(g['actions'], np.float32))
            fields['rewards'].append(np.asarray(g['rewards'], np.float32) + reward_shift)
            fields['terminals'].append(terminals)
            fields['masks'].append(1.0 - dones)
    arrays = {k: np.concatenate(v, axis=0) for k, v in fields.items()}
    check_values(path, arrays)
    dataset = dataset_from_arrays(**arrays)
    dataset.source = path
    return dataset


def make_robomimic_env_and_datasets(env_name, dataset_dir=None, seed=0):
    """(env, eval_env, train_dataset, None) of a RoboMimic name; online rewards are shifted by the caller."""
    path = dataset_path(env_name, dataset_dir)
    require('h5py', 'pip install h5py')
    require('robosuite', ROBOSUITE_INSTALL)
    env = make_robomimic_env(env_name, path, seed=seed)
    eval_env = make_robomimic_env(env_name, path, seed=seed + 1000)
    return env, eval_env, load_robomimic_dataset(path), None


def matches(env_name):
    """Whether this family serves `env_name`."""
    return is_robomimic_env(env_name)


def check_name(env_name):
    """Nothing to check beyond `matches` (its name pattern lists the tasks and dataset types)."""


def reward_shift(env_name):
    """Shift of online rewards, matching the shifted offline data."""
    return REWARD_SHIFT


INFO_FILTERS = ()


def make_env(env_name, dataset_dir=None, seed=0):
    """One environment of a RoboMimic name, built from the `env_args` of its dataset file."""
    return make_robomimic_env(env_name, dataset_path(env_name, dataset_dir), seed=seed)


def make_env_and_datasets(env_name, dataset_dir=None, seed=0):
    """(env, eval_env, train_dataset, None); see `make_robomimic_env_and_datasets`."""
    return make_robomimic_env_and_datasets(env_name, dataset_dir=dataset_dir, seed=seed)
