"""Minari re-releases of the D4RL datasets (`D4RL/<domain>/<name>-v<k>`), read from local copies with h5py.

The environment is the one recorded in the file's `env_spec` (Gymnasium-Robotics ids); goal-conditioned dict
observations are flattened to D4RL's layout.
"""

import os
import re

import gymnasium
import numpy as np
from gymnasium.spaces import Box

from envs.common import GYMNASIUM_ROBOTICS_INSTALL, EnvError, dataset_from_arrays, require

_MINARI_RE = re.compile(r'^D4RL/(?P<domain>[a-z]+)/(?P<name>[a-z0-9-]+)-v(?P<v>\d+)$')


def matches(env_name):
    """Whether `env_name` is a Minari dataset id of the D4RL collection (`D4RL/<domain>/<name>-v<k>`)."""
    return _MINARI_RE.match(env_name) is not None


def minari_dataset_path(env_name, dataset_dir=None):
    """`<root>/<dataset id>/data/main_data.hdf5` of a local Minari dataset; raises `EnvError` when missing."""
    root = dataset_dir or os.environ.get('MINARI_DATASETS_PATH') or '~/.minari/datasets'
    path = os.path.join(os.path.expanduser(root), env_name, 'data', 'main_data.hdf5')
    if not os.path.exists(path):
        raise EnvError(
            f'Minari dataset not found at {path}; on a machine with network run: minari download {env_name} '
            f'(then copy ~/.minari/datasets/{env_name} here), or set MINARI_DATASETS_PATH / --dataset_dir'
        )
    return path


def _flat_obs(node):
    # Goal-conditioned Minari data stores dict observations; D4RL's layout puts the position (achieved goal) first.
    if hasattr(node, 'keys'):
        parts = [np.asarray(node[k]) for k in ('achieved_goal', 'observation') if k in node]
        return np.concatenate(parts, axis=-1)
    return np.asarray(node)


def load_minari_dataset(path, env_name):
    """A `Dataset` of a local Minari hdf5 file: episodes as stored, terminals at episode ends, masks at terminations."""
    h5py = require('h5py', 'pip install h5py')
    fields = {k: [] for k in ('observations', 'actions', 'rewards', 'terminals', 'masks', 'next_observations')}
    with h5py.File(path, 'r') as f:
        episodes = sorted((k for k in f.keys() if k.startswith('episode_')), key=lambda k: int(k.split('_')[-1]))
        for ep in episodes:
            g = f[ep]
            obs = _flat_obs(g['observations']).astype(np.float32)
            n = len(g['actions'])
            terminals = np.zeros(n, np.float32)
            terminals[-1] = 1.0
            fields['observations'].append(obs[:n])
            fields['next_observations'].append(obs[1 : n + 1])
            fields['actions'].append(np.asarray(g['actions'], np.float32))
            fields['rewards'].append(np.asarray(g['rewards'], np.float32) + reward_shift(env_name))
            fields['terminals'].append(terminals)
            fields['masks'].append(1.0 - np.asarray(g['terminations'], np.float32))
    if not fields['actions']:
        raise EnvError(f'the Minari file {path} holds no episodes')
    return dataset_from_arrays(**{k: np.concatenate(v) for k, v in fields.items()})


class FlattenGoalObservation(gymnasium.ObservationWrapper):
    """Flattens a goal-conditioned dict observation to [achieved_goal, observation] (Minari AntMaze data layout)."""

    def __init__(self, env):
        super().__init__(env)
        space = env.observation_space
        dim = sum(space[k].shape[0] for k in ('achieved_goal', 'observation'))
        self.observation_space = Box(-np.inf, np.inf, shape=(dim,), dtype=np.float64)

    def observation(self, observation):
        return _flat_obs(observation)


def make_minari_env(path):
    """The environment recorded in a Minari file's `env_spec` attribute (Gymnasium-Robotics ids)."""
    h5py = require('h5py', 'pip install h5py')
    with h5py.File(path, 'r') as f:
        spec_json = f.attrs.get('env_spec')
    if spec_json is None:
        raise EnvError(f'the Minari file {path} has no env_spec attribute, so its environment is unknown')
    gym_robotics = require('gymnasium_robotics', GYMNASIUM_ROBOTICS_INSTALL)
    gymnasium.register_envs(gym_robotics)
    spec = gymnasium.envs.registration.EnvSpec.from_json(
        spec_json if isinstance(spec_json, str) else spec_json.decode()
    )
    env = gymnasium.make(spec)
    if isinstance(env.observation_space, gymnasium.spaces.Dict):
        env = FlattenGoalObservation(env)
    return env


def check_name(env_name):
    """Nothing to check beyond `matches` (a local copy is looked up by name)."""


def reward_shift(env_name):
    """Shift of offline and online rewards: -1 for AntMaze (every step costs 1 until the goal, as for D4RL's
    AntMaze in `envs.d4rl_utils`), else 0."""
    m = _MINARI_RE.match(env_name)
    return -1.0 if m is not None and m['domain'] == 'antmaze' else 0.0


INFO_FILTERS = ()


def make_env(env_name, dataset_dir=None, seed=0):
    """The environment recorded in the local Minari file of `env_name`."""
    return make_minari_env(minari_dataset_path(env_name, dataset_dir))


def make_env_and_datasets(env_name, dataset_dir=None, seed=0):
    """(env, eval_env, train_dataset, None) of a local Minari dataset; online reward shifts are the caller's."""
    path = minari_dataset_path(env_name, dataset_dir)
    return make_minari_env(path), make_minari_env(path), load_minari_dataset(path, env_name), None
