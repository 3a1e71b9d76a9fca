"""D4RL-style tasks: AntMaze and Adroit, from D4RL-format hdf5 files read with plain h5py.

Datasets: `<dataset_dir or ~/.d4rl/datasets>/<env_name>.hdf5` with `observations, actions, rewards, terminals,
timeouts`, turned into transitions with D4RL's q-learning semantics (`qlearning_transitions`). The Minari
re-releases (`D4RL/antmaze/umaze-v1`, ...) are a family of their own, `envs.minari_utils`.

Environments: the legacy `d4rl` package when it (and mujoco_py) can be imported, otherwise Gymnasium-Robotics
equivalents with D4RL's observation layout (`GymRoboticsAntMaze`, Adroit `AdroitHand*-v1`).
"""

import contextlib
import os
import re

import gymnasium
import numpy as np
from gymnasium.spaces import Box

from envs.common import (
    GYMNASIUM_ROBOTICS_INSTALL,
    DataError,
    EnvError,
    check_layout,
    check_values,
    dataset_from_arrays,
    load_checked,
    open_hdf5,
    require,
)

DEFAULT_DATASET_DIR = '~/.d4rl/datasets'
_ANTMAZE_RE = re.compile(r'^antmaze-(?P<maze>umaze|medium|large)(?:-(?P<kind>diverse|play))?-v(?P<v>[0-2])$')
_ADROIT_RE = re.compile(r'^(?P<task>pen|door|hammer|relocate)-(?P<kind>human|cloned|expert)-v(?P<v>[01])$')

# D4RL's reference returns for normalized scores (random and expert policies).
REF_SCORES = {
    'antmaze': (0.0, 1.0),
    'pen': (96.262799, 3076.8331),
    'door': (-56.512833, 2880.5693),
    'hammer': (-274.856578, 12794.134825),
    'relocate': (-6.425911, 4233.877797),
}

# D4RL maze layouts (rows top to bottom as D4RL writes them), with its start cell and evaluation goal cell.
_MAZES = {
    'umaze': ([[1, 1, 1, 1, 1], [1, 0, 0, 0, 1], [1, 1, 1, 0, 1], [1, 0, 0, 0, 1], [1, 1, 1, 1, 1]], (1, 1), (3, 1)),
    'medium': (
        [
            [1, 1, 1, 1, 1, 1, 1, 1],
            [1, 0, 0, 1, 1, 0, 0, 1],
            [1, 0, 0, 1, 0, 0, 0, 1],
            [1, 1, 0, 0, 0, 1, 1, 1],
            [1, 0, 0, 1, 0, 0, 0, 1],
            [1, 0, 1, 0, 0, 1, 0, 1],
            [1, 0, 0, 0, 1, 0, 0, 1],
            [1, 1, 1, 1, 1, 1, 1, 1],
        ],
        (1, 1),
        (6, 6),
    ),
    'large': (
        [
            [1] * 12,
            [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1],
            [1, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1],
            [1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1],
            [1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1],
            [1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1],
            [1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 1, 1],
            [1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1],
            [1] * 12,
        ],
        (1, 1),
        (7, 9),
    ),
}
_MAZE_SCALING = 4.0
START_GOAL_NOISE = 0.1
_ADROIT_IDS = {
    'pen': 'AdroitHandPen-v1',
    'door': 'AdroitHandDoor-v1',
    'hammer': 'AdroitHandHammer-v1',
    'relocate': 'AdroitHandRelocate-v1',
}
_MAX_EPISODE_STEPS = {
    'umaze': 700,
    'medium': 1000,
    'large': 1000,
    'pen': 100,
    'door': 200,
    'hammer': 200,
    'relocate': 200,
}


def is_d4rl_env(env_name):
    """Whether `env_name` is a D4RL AntMaze or Adroit name."""
    return bool(_ANTMAZE_RE.match(env_name) or _ADROIT_RE.match(env_name))


def is_antmaze(env_name):
    """Whether `env_name` (D4RL or Minari) is an AntMaze task."""
    return 'antmaze' in env_name


def online_reward_shift(env_name):
    """Reward shift applied to AntMaze data and online rewards (-1: every step costs 1 until the goal)."""
    return -1.0 if is_antmaze(env_name) else 0.0


def _task(env_name):
    m = _ANTMAZE_RE.match(env_name)
    if m:
        return 'antmaze', m['maze']
    m = _ADROIT_RE.match(env_name)
    if m:
        return m['task'], m['task']
    raise EnvError(f'{env_name!r} is not a D4RL AntMaze/Adroit name (e.g. antmaze-large-diverse-v2, pen-human-v1)')


def get_normalized_score(env_name, episode_return):
    """D4RL's normalized score (0 = random, 1 = expert) of an undiscounted return."""
    domain = 'antmaze' if is_antmaze(env_name) else _task(env_name)[0]
    lo, hi = REF_SCORES[domain]
    return (episode_return - lo) / (hi - lo)


def dataset_path(env_name, dataset_dir=None):
    """`<dataset_dir>/<env_name>.hdf5`; raises `EnvError` when it is missing."""
    root = os.path.expanduser(dataset_dir or DEFAULT_DATASET_DIR)
    path = root if root.endswith('.hdf5') else os.path.join(root, f'{env_name}.hdf5')
    if not os.path.exists(path):
        raise EnvError(
            f'D4RL dataset not found at {path}; copy the D4RL hdf5 file of {env_name} there (renamed to '
            f'{env_name}.hdf5), or write a small random-policy file with: '
            f'python -m envs.generate_d4rl --env_name={env_name} --save_dir={os.path.dirname(path)}'
        )
    return path


def qlearning_transitions(observations, actions, rewards, terminals, timeouts):
    """D4RL's q-learning transitions: next observation = following row; rows that hit a time limit are dropped.

    A time-limit row has no recorded next observation, so it cannot form a transition; the very last row of the
    file is dropped for the same reason.
    """
    n = len(observations) - 1
    keep = ~np.asarray(timeouts[:n], dtype=bool)
    idx = np.nonzero(keep)[0]
    return dict(
        observations=observations[idx],
        actions=actions[idx],
        next_observations=observations[idx + 1],
        rewards=rewards[idx],
        dataset_terminals=np.asarray(terminals[idx], dtype=np.float32),
    )


def episode_fields(tr, antmaze):
    """`terminals` (episode ends) and `masks` (bootstrap) of q-learning transitions, as the reference defines them.

    An episode ends where the next transition does not start at this one's next observation; for Adroit, also where
    the data says terminal. Masks are 0 exactly at the data's terminal flags.
    """
    obs, next_obs = tr['observations'], tr['next_observations']
    n = len(obs)
    terminals = np.zeros(n, dtype=np.float32)
    if n > 1:
        jump = np.linalg.norm(obs[1:] - next_obs[:-1], axis=-1) > 1e-6
        terminals[:-1] = jump if antmaze else (jump | (tr['dataset_terminals'][:-1] == 1.0))
    terminals[-1] = 1.0
    masks = 1.0 - tr['dataset_terminals']
    return terminals, masks


def load_d4rl_dataset(path, env_name):
    """A `Dataset` from a D4RL-format hdf5 file (AntMaze rewards shifted by -1)."""
    fields = ('observations', 'actions', 'rewards', 'terminals')
    with open_hdf5(path) as f:
        present = [k for k in (*fields, 'timeouts') if k in f]
        check_layout(path, {k: (f[k].shape, f[k].dtype) for k in present}, required=fields)
        arrays = load_checked(path, lambda: {k: np.asarray(f[k]) for k in present})
    timeouts = arrays.pop('timeouts', np.zeros(len(arrays['rewards']), bool))
    check_values(path, arrays, ends=None)
    if len(arrays['rewards']) < 2:
        raise DataError(f'{path}: only {len(arrays["rewards"])} transitions; a dataset needs at least 2')
    if not (np.any(arrays['terminals']) or np.any(timeouts)):
        raise DataError(f'{path}: no episode end (terminals and timeouts are 0 everywhere); the file is incomplete')
    tr = qlearning_transitions(
        arrays['observations'].astype(np.float32),
        arrays['actions'].astype(np.float32),
        arrays['rewards'].astype(np.float32),
        arrays['terminals'],
        timeouts,
    )
    antmaze = is_antmaze(env_name)
    terminals, masks = episode_fields(tr, antmaze)
    dataset = dataset_from_arrays(
        observations=tr['observations'],
        actions=tr['actions'],
        next_observations=tr['next_observations'],
        rewards=tr['rewards'] + online_reward_shift(env_name),
        terminals=terminals,
        masks=masks,
    )
    dataset.source = path
    return dataset


class GymRoboticsAntMaze(gymnasium.Wrapper):
    """Gymnasium-Robotics AntMaze with D4RL's geometry and observation layout.

    The maze is D4RL's (rows mirrored, because Gymnasium-Robotics counts rows downward along -y), the start and
    goal are D4RL's cells, and xy are shifted so the start cell is the origin as in D4RL. Observation:
    [x, y, rest of the ant state (27)] = 29 numbers. The episode terminates at the goal (sparse reward 1).
    """

    def __init__(self, env_name):
        gym_robotics = require('gymnasium_robotics', GYMNASIUM_ROBOTICS_INSTALL)
        gymnasium.register_envs(gym_robotics)
        maze = _ANTMAZE_RE.match(env_name)['maze']
        layout, start, goal = _MAZES[maze]
        rows = [list(r) for r in layout]
        rows[start[0]][start[1]] = 'r'
        rows[goal[0]][goal[1]] = 'g'
        env = gymnasium.make(
            'AntMaze_UMaze-v4',
            maze_map=rows[::-1],
            continuing_task=False,
            reward_type='sparse',
            max_episode_steps=_MAX_EPISODE_STEPS[maze],
        )
        super().__init__(env)
        # Gymnasium-Robotics writes the maze's XML to a file of its own in the temp folder and never removes it (one
        # per environment made); MuJoCo has read it by now.
        with contextlib.suppress(OSError):
            os.remove(env.unwrapped.tmp_xml_file_path)
        # Gymnasium-Robotics scatters start and goal over +-1 (a quarter cell); D4RL starts within +-0.1 of its cell.
        env.unwrapped.position_noise_range = START_GOAL_NOISE / _MAZE_SCALING
        self.env_name = env_name
        flipped_start = np.array([len(rows) - 1 - start[0], start[1]])
        self.xy_offset = -np.asarray(env.unwrapped.maze.cell_rowcol_to_xy(flipped_start), dtype=np.float64)
        flipped_goal = np.array([len(rows) - 1 - goal[0], goal[1]])
        self.target_goal = np.asarray(env.unwrapped.maze.cell_rowcol_to_xy(flipped_goal)) + self.xy_offset
        dim = 2 + env.observation_space['observation'].shape[0]
        self.observation_space = Box(-np.inf, np.inf, shape=(dim,), dtype=np.float64)

    def _flatten(self, ob):
        return np.concatenate([ob['achieved_goal'] + self.xy_offset, ob['observation']])

    def reset(self, **kwargs):
        ob, info = self.env.reset(**kwargs)
        return self._flatten(ob), info

    def step(self, action):
        ob, reward, terminated, truncated, info = self.env.step(action)
        info['success'] = float(info.get('success', reward > 0))
        return self._flatten(ob), float(reward), terminated, truncated, info

    def get_normalized_score(self, episode_return):
        """D4RL's normalized score of a return."""
        return get_normalized_score(self.env_name, episode_return)


class GymRoboticsAdroit(gymnasium.Wrapper):
    """Gymnasium-Robotics Adroit hand task with D4RL's observation, time limit and normalized score."""

    def __init__(self, env_name):
        gym_robotics = require('gymnasium_robotics', GYMNASIUM_ROBOTICS_INSTALL)
        gymnasium.register_envs(gym_robotics)
        task = _ADROIT_RE.match(env_name)['task']
        super().__init__(gymnasium.make(_ADROIT_IDS[task], max_episode_steps=_MAX_EPISODE_STEPS[task]))
        self.env_name = env_name

    def step(self, action):
        ob, reward, terminated, truncated, info = self.env.step(action)
        info['success'] = float(info.get('success', False))
        return ob, float(reward), terminated, truncated, info

    def get_normalized_score(self, episode_return):
        """D4RL's normalized score of a return."""
        return get_normalized_score(self.env_name, episode_return)


def _make_legacy_d4rl_env(env_name):
    """The original D4RL environment through gymnasium's v21 compatibility layer, or None when unavailable."""
    try:
        import d4rl  # noqa: F401  (registers the environments; needs mujoco_py)
        import shimmy  # noqa: F401  (provides GymV21Environment-v0)
    except Exception:  # noqa: BLE001  d4rl fails in many ways without mujoco_py; any failure means "not usable".
        return None
    return gymnasium.make('GymV21Environment-v0', env_id=env_name)


def make_d4rl_env(env_name, prefer_legacy=True):
    """The environment of a D4RL name: legacy d4rl when importable, else the Gymnasium-Robotics equivalent."""
    if prefer_legacy:
        env = _make_legacy_d4rl_env(env_name)
        if env is not None:
            return env
    if is_antmaze(env_name):
        return GymRoboticsAntMaze(env_name)
    return GymRoboticsAdroit(env_name)


def matches(env_name):
    """Whether this family serves `env_name` (a D4RL AntMaze or Adroit name)."""
    return is_d4rl_env(env_name)


def check_name(env_name):
    """Nothing to check beyond `matches` (its name patterns list the mazes and Adroit tasks)."""


def reward_shift(env_name):
    """Shift of online rewards, matching the shifted offline data (AntMaze: -1)."""
    return online_reward_shift(env_name)


INFO_FILTERS = ()


def make_env(env_name, dataset_dir=None, seed=0):
    """One environment of a D4RL name (legacy `d4rl` when installed, else gymnasium-robotics)."""
    return make_d4rl_env(env_name)


def make_env_and_datasets(env_name, dataset_dir=None, seed=0):
    """(env, eval_env, train_dataset, None) of a D4RL name; online reward shifts are the caller's."""
    dataset = load_d4rl_dataset(dataset_path(env_name, dataset_dir), env_name)
    return make_d4rl_env(env_name), make_d4rl_env(env_name), dataset, None
