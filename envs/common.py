"""Helpers every environment family shares: the user-facing error, optional imports, wrappers and dataset glue.

Family modules (`ogbench_utils`, `robomimic_utils`, `d4rl_utils`, `minari_utils`) import only this module (and
`utils/`); `envs.env_utils` is the registry that finds the family of a name.
"""

import collections
import importlib
import re
import time

import gymnasium
import numpy as np
from gymnasium.spaces import Box

from utils.datasets import Dataset
from utils.errors import UserError

# Install command of Gymnasium-Robotics, which the D4RL and Minari families build their environments with.
GYMNASIUM_ROBOTICS_INSTALL = 'pip install gymnasium-robotics==1.4.2 pettingzoo==1.27.0'


RENDERING_HINT = 'set MUJOCO_GL=egl on a GPU node, or MUJOCO_GL=osmesa on a CPU (apt-get install -y libosmesa6)'


class EnvError(UserError):
    """A problem the user can fix (unknown name, missing data, missing package); its message is one actionable line."""


def require(module_name, install_hint):
    """Imports an optional dependency, or raises `EnvError` naming the command that installs it."""
    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        msg = f'{module_name} is needed for this environment but cannot be imported ({e}); run: {install_hint}'
        raise EnvError(msg) from e


class EpisodeMonitor(gymnasium.Wrapper):
    """Puts episode statistics in `info['episode']` at the last step: return, length, success, duration.

    `success` is the `info['success']` of the last step (0 when the environment does not report one). Info keys that
    match one of `filter_regexes` are dropped, so that loggers do not receive privileged simulator state.
    """

    def __init__(self, env, filter_regexes=None):
        super().__init__(env)
        self.filter_regexes = [re.compile(r) for r in (filter_regexes or [])]
        self.total_timesteps = 0
        self._reset_stats()

    def _reset_stats(self):
        self.reward_sum = 0.0
        self.episode_length = 0
        self.start_time = time.time()

    def step(self, action):
        ob, reward, terminated, truncated, info = self.env.step(action)
        if self.filter_regexes:
            info = {k: v for k, v in info.items() if not any(r.match(k) for r in self.filter_regexes)}
        self.reward_sum += float(reward)
        self.episode_length += 1
        self.total_timesteps += 1
        info['total'] = {'timesteps': self.total_timesteps}
        if terminated or truncated:
            info['episode'] = {
                'final_reward': float(reward),
                'return': self.reward_sum,
                'length': self.episode_length,
                'success': float(info.get('success', 0.0)),
                'duration': time.time() - self.start_time,
            }
            score_fn = getattr(self.unwrapped, 'get_normalized_score', None)
            if score_fn is not None:
                info['episode']['normalized_return'] = 100.0 * score_fn(self.reward_sum)
        return ob, reward, terminated, truncated, info

    def reset(self, **kwargs):
        self._reset_stats()
        return self.env.reset(**kwargs)


class FrameStackWrapper(gymnasium.Wrapper):
    """Concatenates the last `num_stack` observations on the last axis (the first one repeated after a reset)."""

    def __init__(self, env, num_stack):
        super().__init__(env)
        self.num_stack = num_stack
        self.frames = collections.deque(maxlen=num_stack)
        space = env.observation_space
        self.observation_space = Box(
            low=np.concatenate([space.low] * num_stack, axis=-1),
            high=np.concatenate([space.high] * num_stack, axis=-1),
            dtype=space.dtype,
        )

    def _observation(self):
        return np.concatenate(list(self.frames), axis=-1)

    def reset(self, **kwargs):
        ob, info = self.env.reset(**kwargs)
        for _ in range(self.num_stack):
            self.frames.append(ob)
        if 'goal' in info:
            info['goal'] = np.concatenate([info['goal']] * self.num_stack, axis=-1)
        return self._observation(), info

    def step(self, action):
        ob, reward, terminated, truncated, info = self.env.step(action)
        self.frames.append(ob)
        return self._observation(), reward, terminated, truncated, info


class RewardShiftWrapper(gymnasium.RewardWrapper):
    """Adds a constant to every online reward, so online rewards match the shifted offline ones."""

    def __init__(self, env, shift):
        super().__init__(env)
        self.shift = float(shift)

    def reward(self, reward):
        return reward + self.shift


def get_max_episode_steps(env):
    """The time limit of a (possibly wrapped) environment, or None when it has none."""
    cur = env
    while cur is not None:
        steps = getattr(cur, 'max_episode_steps', None) or getattr(cur, '_max_episode_steps', None)
        if steps:
            return int(steps)
        spec = getattr(cur, 'spec', None)
        if spec is not None and spec.max_episode_steps:
            return int(spec.max_episode_steps)
        cur = getattr(cur, 'env', None)
    return None


def clip_actions(dataset, eps):
    """A copy of `dataset` whose actions lie in [-1 + eps, 1 - eps] (no-op when `dataset` or `eps` is None).

    Actors squash with tanh, so log-likelihoods of dataset actions at exactly +-1 would be infinite.
    """
    if dataset is None or eps is None:
        return dataset
    return dataset.copy(add_or_replace=dict(actions=np.clip(dataset['actions'], -1 + eps, 1 - eps)))


def dataset_from_arrays(**fields):
    """A frozen `Dataset` of float32 arrays (observations keep their dtype when they are images)."""
    out = {}
    for k, v in fields.items():
        v = np.asarray(v)
        out[k] = v if (k in ('observations', 'next_observations') and v.dtype == np.uint8) else v.astype(np.float32)
    return Dataset.create(**out)


def describe_error(e):
    """`Type: message` of an exception, also for exceptions whose `str()` fails (PyOpenGL's EGL errors)."""
    try:
        text = str(e)
    except Exception:
        text = ''
    text = ' '.join(text.split())[:300]
    return f'{type(e).__name__}: {text}' if text else type(e).__name__


class DataError(EnvError):
    """A dataset file that cannot be trained on (damaged, incomplete or holding bad values); names the file."""


# The fields every dataset must hold, and those whose values must be finite.
REQUIRED_FIELDS = ('observations', 'actions', 'terminals')
FINITE_FIELDS = ('observations', 'next_observations', 'actions', 'rewards')


def npz_layout(path, required=REQUIRED_FIELDS):
    """{field: (shape, dtype)} of an .npz file read from its array headers only (no data is read); refuses an
    unreadable, truncated or non-archive file, a missing field, or fields of different lengths with `DataError`."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            layout = {}
            for member in archive.namelist():
                if not member.endswith('.npy'):
                    continue
                with archive.open(member) as f:
                    version = np.lib.format.read_magic(f)
                    header = (
                        np.lib.format.read_array_header_2_0
                        if version >= (2, 0)
                        else np.lib.format.read_array_header_1_0
                    )
                    shape, _, dtype = header(f)
                layout[member[: -len('.npy')]] = (tuple(shape), dtype)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as e:
        raise DataError(
            f'cannot read {path}: not a readable .npz archive (truncated or damaged?): {describe_error(e)}'
        ) from e
    check_layout(path, layout, required)
    return layout


def check_layout(path, layout, required=REQUIRED_FIELDS):
    """Refuses missing fields and fields whose first dimensions differ (`layout`: {field: (shape, dtype)})."""
    missing = [k for k in required if k not in layout]
    if missing:
        have = ', '.join(sorted(layout)) or 'none'
        raise DataError(f'{path} has no {", ".join(repr(k) for k in missing)} field (it holds: {have})')
    lengths = {
        k: shape[0] if shape else None for k, (shape, _) in layout.items() if k in required or k in FINITE_FIELDS
    }
    if any(n is None for n in lengths.values()) or len(set(lengths.values())) > 1:
        listed = ', '.join(f'{k} {n}' for k, n in lengths.items())
        raise DataError(f'{path}: fields have different lengths (first dimensions: {listed})')


def check_values(path, arrays, ends='terminals'):
    """Refuses non-finite observations, actions or rewards (before any clipping could hide them) and data without
    an episode end (`ends` all zero) with `DataError`; vectorised, one pass per field."""
    for key in FINITE_FIELDS:
        value = arrays.get(key)
        if value is None or not np.issubdtype(np.asarray(value).dtype, np.floating):
            continue
        bad = ~np.isfinite(value)
        if bad.any():
            rows = np.flatnonzero(bad.reshape(len(value), -1).any(axis=1))
            raise DataError(f'{path}: {key} hold {int(bad.sum())} non-finite values (NaN/inf), first in row {rows[0]}')
    if ends is not None and ends in arrays and not np.asarray(arrays[ends]).any():
        raise DataError(f'{path}: no episode end ({ends} is 0 everywhere); the file is incomplete or not this format')


def check_spaces(path, layout, env, keys=('observations', 'actions')):
    """Refuses data whose per-step shape of `keys` does not fit `env`'s spaces (`DataError`)."""
    for key, space in (('observations', env.observation_space), ('actions', env.action_space)):
        expected = getattr(space, 'shape', None)
        if key not in keys or key not in layout or not expected:
            continue
        shape = layout[key][0][1:]
        if tuple(shape) != tuple(expected):
            raise DataError(
                f'{path}: {key} are {tuple(shape)} per step, the environment {getattr(env.spec, "id", "")} has '
                f'{tuple(expected)}; check the env name and the dataset path'
            )


def load_checked(path, load, what='dataset'):
    """`load()`, with any failure of a third-party reader on a file that passed the checks above reported as one
    `DataError` line naming `path`."""
    try:
        return load()
    except UserError:
        raise
    except Exception as e:  # Readers raise many kinds on damaged files (KeyError, IndexError, zlib.error, ...).
        raise DataError(f'cannot load the {what} {path}: {describe_error(e)}') from e


def check_episode_ends(path, terminals, min_transitions=2):
    """Refuses too few transitions, or `terminals` (episode-end flags, one per row) that mark no end or leave the
    last row open (a cut-off file), with `DataError`."""
    terminals = np.asarray(terminals)
    if len(terminals) < min_transitions:
        raise DataError(f'{path}: only {len(terminals)} transitions; a dataset needs at least {min_transitions}')
    if not terminals.any():
        raise DataError(
            f'{path}: no episode end (terminals is 0 everywhere); the file is incomplete or not this format'
        )
    if not terminals[-1]:
        raise DataError(f'{path}: the last row is not an episode end (terminals[-1] is 0); the file looks cut off')


def open_hdf5(path):
    """`h5py.File(path, 'r')`, with an unreadable, truncated or non-HDF5 file reported as `DataError`."""
    h5py = require('h5py', 'pip install h5py')
    try:
        return h5py.File(path, 'r')
    except OSError as e:
        raise DataError(
            f'cannot read {path}: not a readable HDF5 file (truncated or damaged?): {describe_error(e)}'
        ) from e
