"""One entry point for every environment family: `make_env_and_datasets(env_name, ...)`.

Families (see `get_env_family`):
    ogbench    OGBench single-task manipulation, e.g. `cube-single-play-singletask-task2-v0`.
    robomimic  RoboMimic low-dim tasks, e.g. `lift-mh-low_dim`.
    d4rl       D4RL AntMaze / Adroit, e.g. `antmaze-large-diverse-v2`, `pen-human-v1`.
    minari     Minari re-releases of D4RL, e.g. `D4RL/antmaze/umaze-v1` (local copies only).

Family modules are imported lazily so that, for example, OGBench works without robosuite or h5py-only D4RL support.
"""

import collections
import re
import sys
import time

import gymnasium
import numpy as np
from gymnasium.spaces import Box

from utils.datasets import Dataset

FAMILIES = ('ogbench', 'robomimic', 'd4rl', 'minari')
FAMILY_EXAMPLES = (
    'ogbench: cube-single-play-singletask-task2-v0, scene-play-singletask-task1-v0, '
    'puzzle-3x3-play-singletask-task4-v0; '
    'robomimic: lift-mh-low_dim, can-ph-low_dim, square-mh-low_dim; '
    'd4rl: antmaze-large-diverse-v2, pen-human-v1, door-cloned-v1; '
    'minari: D4RL/antmaze/umaze-v1'
)


class EnvError(Exception):
    """A problem the user can fix (unknown name, missing data, missing package); its message is one actionable line."""


def run_cli(main, argv=None):
    """Runs `main(argv)` and turns an `EnvError` into one line on stderr and exit status 2 (no traceback)."""
    try:
        return main(argv)
    except EnvError as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(2)


def require(module_name, install_hint):
    """Imports an optional dependency, or raises `EnvError` naming the command that installs it."""
    import importlib

    try:
        return importlib.import_module(module_name)
    except ImportError as e:
        msg = f'{module_name} is needed for this environment but cannot be imported ({e}); run: {install_hint}'
        raise EnvError(msg) from e


def get_env_family(env_name):
    """Name of the family that serves `env_name` (one of `FAMILIES`); raises `EnvError` for unknown names."""
    from envs import d4rl_utils, ogbench_utils, robomimic_utils

    if ogbench_utils.is_ogbench_env(env_name):
        return 'ogbench'
    if robomimic_utils.is_robomimic_env(env_name):
        return 'robomimic'
    if d4rl_utils.is_minari_env(env_name):
        return 'minari'
    if d4rl_utils.is_d4rl_env(env_name):
        return 'd4rl'
    families = ', '.join(FAMILIES)
    raise EnvError(f'unknown environment {env_name!r}; supported families ({families}), e.g. {FAMILY_EXAMPLES}')


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


def make_env_and_datasets(
    env_name,
    frame_stack=None,
    action_clip_eps=1e-5,
    dataset_dir=None,
    ogbench_dataset_dir=None,
    compact_dataset=False,
    seed=0,
):
    """Makes the training and evaluation environments and the offline datasets of `env_name`.

    Args:
        env_name: Environment (dataset) name; `get_env_family` lists the families.
        frame_stack: Number of observations to stack in the environments (None: no stacking). Datasets stack at
            sampling time through their own `frame_stack` option.
        action_clip_eps: Dataset actions are clipped to [-1 + eps, 1 - eps] (None: no clipping).
        dataset_dir: Where to look for the dataset (default per family: ~/.ogbench/data, ~/.robomimic,
            ~/.d4rl/datasets, ~/.minari/datasets).
        ogbench_dataset_dir: OGBench only: a folder of dataset shards (`*.npz`); the first shard is returned, and
            `envs.ogbench_utils.OGBenchShardCycler` moves to the next ones.
        compact_dataset: OGBench only: no `next_observations` field (a `valids` field marks usable transitions).
        seed: Seed of the environments and of the datasets' generators.

    Returns:
        (env, eval_env, train_dataset, val_dataset): gymnasium environments wrapped in `EpisodeMonitor` (and
        `FrameStackWrapper`), with online rewards already shifted like the offline ones (episode statistics stay
        unshifted); `Dataset` objects, val may be None.
    """
    family = get_env_family(env_name)
    if family != 'ogbench' and ogbench_dataset_dir is not None:
        raise EnvError(f'--ogbench_dataset_dir only applies to OGBench environments, not {env_name!r}')
    if family == 'ogbench':
        from envs import ogbench_utils

        env, eval_env, train_dataset, val_dataset = ogbench_utils.make_ogbench_env_and_datasets(
            env_name, dataset_dir=dataset_dir, shard_dir=ogbench_dataset_dir, compact_dataset=compact_dataset
        )
    elif family == 'robomimic':
        from envs import robomimic_utils

        env, eval_env, train_dataset, val_dataset = robomimic_utils.make_robomimic_env_and_datasets(
            env_name, dataset_dir=dataset_dir, seed=seed
        )
    else:
        from envs import d4rl_utils

        env, eval_env, train_dataset, val_dataset = d4rl_utils.make_d4rl_env_and_datasets(
            env_name, dataset_dir=dataset_dir
        )

    envs = [_wrap_env(e, family, env_name, frame_stack) for e in (env, eval_env)]
    env, eval_env = envs
    env.reset(seed=seed)
    eval_env.reset(seed=seed + 1)

    train_dataset = clip_actions(train_dataset, action_clip_eps)
    val_dataset = clip_actions(val_dataset, action_clip_eps)
    train_dataset.seed(seed)
    if val_dataset is not None:
        val_dataset.seed(seed + 1)
    return env, eval_env, train_dataset, val_dataset


def _wrap_env(env, family, env_name, frame_stack):
    """The wrappers every environment of `family` gets: episode statistics, reward shift, frame stacking."""
    reward_shift = 0.0
    filters = []
    if family == 'ogbench':
        filters = ['.*privileged.*', '.*proprio.*']
    elif family == 'robomimic':
        from envs import robomimic_utils

        reward_shift = robomimic_utils.REWARD_SHIFT
    else:
        from envs import d4rl_utils

        reward_shift = d4rl_utils.online_reward_shift(env_name)
    # The monitor sits below the shift: `info['episode']` reports the task's own return, as in the reference and
    # as D4RL's normalized scores expect, while the agent receives the shifted reward.
    env = EpisodeMonitor(env, filter_regexes=filters)
    if reward_shift:
        env = RewardShiftWrapper(env, reward_shift)
    if frame_stack is not None:
        env = FrameStackWrapper(env, frame_stack)
    return env


def make_eval_envs(env_name, num_envs, dataset_dir=None, frame_stack=None, seed=0):
    """`num_envs` more evaluation environments of `env_name`, wrapped like those of `make_env_and_datasets`.

    For batched evaluation; RoboMimic needs the dataset (its env is built from the file's `env_args`).
    """
    family = get_env_family(env_name)
    raw = []
    for i in range(num_envs):
        if family == 'ogbench':
            from envs import ogbench_utils

            raw.append(ogbench_utils.make_ogbench_env(env_name))
        elif family == 'robomimic':
            from envs import robomimic_utils

            path = robomimic_utils.dataset_path(env_name, dataset_dir)
            raw.append(robomimic_utils.make_robomimic_env(env_name, path, seed=seed + 2000 + i))
        else:
            from envs import d4rl_utils

            if d4rl_utils.is_minari_env(env_name):
                raw.append(d4rl_utils.make_minari_env(d4rl_utils.minari_dataset_path(env_name, dataset_dir)))
            else:
                raw.append(d4rl_utils.make_d4rl_env(env_name))
    return [_wrap_env(e, family, env_name, frame_stack) for e in raw]


def dataset_from_arrays(**fields):
    """A frozen `Dataset` of float32 arrays (observations keep their dtype when they are images)."""
    out = {}
    for k, v in fields.items():
        v = np.asarray(v)
        out[k] = v if (k in ('observations', 'next_observations') and v.dtype == np.uint8) else v.astype(np.float32)
    return Dataset.create(**out)
