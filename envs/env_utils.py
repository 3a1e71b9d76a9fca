"""One entry point for every environment family: `make_env_and_datasets(env_name, ...)`, and `make_run_envs` for
the trainer.

Families (`FAMILIES`, tried in order by `get_env_family`):
    ogbench    OGBench single-task manipulation, e.g. `cube-single-play-singletask-task2-v0`, and its pixel-based
               `visual-` variants, e.g. `visual-cube-single-play-singletask-task1-v0`.
    robomimic  RoboMimic low-dim tasks, e.g. `lift-mh-low_dim`.
    d4rl       D4RL AntMaze / Adroit, e.g. `antmaze-large-diverse-v2`, `pen-human-v1`.
    minari     Minari re-releases of D4RL, e.g. `D4RL/antmaze/umaze-v1` (local copies only).

Every family module has the same interface, and imports nothing of `envs` but `envs.common`:
    matches(env_name) -> bool                               whether the family serves the name;
    check_name(env_name)                                    raises `EnvError` for a served name it lacks (a task);
    make_env(env_name, dataset_dir=None, seed=0)            one raw environment (extra evaluation copies);
    make_env_and_datasets(env_name, dataset_dir=None, seed=0, ...)
                                                            (env, eval_env, train, val), raw, unclipped, unseeded;
    reward_shift(env_name) -> float                         added to online rewards, as to the offline ones;
    INFO_FILTERS                                            regexes of info keys the EpisodeMonitor drops;
and optionally
    is_visual(env_name) -> bool                             whether the observations are images (else: states).
Family modules import their optional packages lazily (`envs.common.require`), so, for example, OGBench works
without robosuite or h5py. This module adds what all families share: the wrappers, action clipping and seeding.
"""

import dataclasses

from envs import d4rl_utils, minari_utils, ogbench_utils, robomimic_utils
from envs.common import EnvError, EpisodeMonitor, FrameStackWrapper, RewardShiftWrapper, clip_actions
from utils import seeding

FAMILIES = {'ogbench': ogbench_utils, 'robomimic': robomimic_utils, 'd4rl': d4rl_utils, 'minari': minari_utils}
FAMILY_EXAMPLES = (
    'ogbench: cube-single-play-singletask-task2-v0, scene-play-singletask-task1-v0, '
    'puzzle-3x3-play-singletask-task4-v0, visual-cube-single-play-singletask-task1-v0; '
    'robomimic: lift-mh-low_dim, can-ph-low_dim, square-mh-low_dim; '
    'd4rl: antmaze-large-diverse-v2, pen-human-v1, door-cloned-v1; '
    'minari: D4RL/antmaze/umaze-v1'
)


def get_env_family(env_name):
    """Name of the family that serves `env_name` (a key of `FAMILIES`); raises `EnvError` for unknown names and
    for tasks the family lacks."""
    for name, module in FAMILIES.items():
        if module.matches(env_name):
            module.check_name(env_name)
            return name
    families = ', '.join(FAMILIES)
    raise EnvError(f'unknown environment {env_name!r}; supported families ({families}), e.g. {FAMILY_EXAMPLES}')


def observes_pixels(env_name):
    """Whether the observations of `env_name` (a name `get_env_family` accepts) are images."""
    module = FAMILIES[get_env_family(env_name)]
    return bool(getattr(module, 'is_visual', lambda name: False)(env_name))


@dataclasses.dataclass(frozen=True)
class RunEnvs:
    """What a training run needs from `envs/`.

    Attributes:
        env: The training environment, wrapped (see `make_env_and_datasets`) and reset with `seed`.
        eval_envs: `num_eval_envs` evaluation environments wrapped the same way; the first is the `eval_env` of
            `make_env_and_datasets` (reset with `seed + 1`), the others are made with seeds `seed + 2000 + i`.
        train_dataset: The offline training data, actions clipped, generator on the run's `dataset` stream
            (`utils.seeding`).
        val_dataset: The validation data (generator on the `val_dataset` stream), or None.
        shards: For a sharded OGBench dataset the one `OGBenchShardCycler` of the run, whose `current()` is
            `train_dataset` and which the trainer advances; else None.
    """

    env: object
    eval_envs: list
    train_dataset: object
    val_dataset: object
    shards: object


def make_env_and_datasets(env_name, **kwargs):
    """Makes the training and evaluation environments and the offline datasets of `env_name`.

    Args:
        env_name: Environment (dataset) name; `get_env_family` lists the families.
        frame_stack: Number of observations to stack in the environments (None: no stacking). Datasets stack at
            sampling time through their own `frame_stack` option.
        action_clip_eps: Dataset actions are clipped to [-1 + eps, 1 - eps] (None: no clipping).
        dataset_dir: Where to look for the dataset (default per family: ~/.ogbench/data, ~/.robomimic,
            ~/.d4rl/datasets, ~/.minari/datasets).
        ogbench_dataset_dir: OGBench only: a folder of dataset shards (`*.npz`); the first shard is returned
            (`make_run_envs` also returns the `envs.ogbench_utils.OGBenchShardCycler` that moves to the next ones).
        compact_dataset: OGBench only: no `next_observations` field (a `valids` field marks usable transitions).
        seed: Seed of the environments and of the datasets' generators.

    Returns:
        (env, eval_env, train_dataset, val_dataset): gymnasium environments wrapped in `EpisodeMonitor` (and
        `FrameStackWrapper`), with online rewards already shifted like the offline ones (episode statistics stay
        unshifted); `Dataset` objects, val may be None.
    """
    run = make_run_envs(env_name, **kwargs)
    return run.env, run.eval_envs[0], run.train_dataset, run.val_dataset


def make_run_envs(
    env_name,
    frame_stack=None,
    action_clip_eps=1e-5,
    dataset_dir=None,
    ogbench_dataset_dir=None,
    compact_dataset=False,
    seed=0,
    num_eval_envs=1,
    with_val=True,
):
    """The environments and datasets of a training run of `env_name`, as a `RunEnvs`.

    The arguments are those of `make_env_and_datasets`, plus `num_eval_envs` (at least 1) evaluation environments,
    and `with_val=False` to leave the validation data unread (`val_dataset` None). With `ogbench_dataset_dir`, the
    training data is the first shard of the returned `shards` cycler.
    """
    if num_eval_envs < 1:
        raise EnvError(f'need at least one evaluation environment, got num_eval_envs={num_eval_envs}')
    family = FAMILIES[get_env_family(env_name)]
    shards = None
    if family is not ogbench_utils and (ogbench_dataset_dir is not None or compact_dataset):
        flag = '--ogbench_dataset_dir' if ogbench_dataset_dir is not None else 'compact_dataset'
        raise EnvError(f'{flag} only applies to OGBench environments, not {env_name!r}')
    if ogbench_dataset_dir is not None:
        # One cycler serves the first shard here and the later ones to the trainer; it clips and seeds itself.
        shards = ogbench_utils.OGBenchShardCycler(
            env_name, ogbench_dataset_dir, compact_dataset=compact_dataset, action_clip_eps=action_clip_eps, seed=seed
        )
        env, eval_env = family.make_env(env_name), family.make_env(env_name)
        train_dataset = shards.current()
        val_dataset = shards.val_dataset() if with_val else None
    else:
        options = {'compact_dataset': True} if compact_dataset else {}
        if not with_val and family is ogbench_utils:
            options['with_val'] = False  # Only OGBench has validation files.
        env, eval_env, train_dataset, val_dataset = family.make_env_and_datasets(
            env_name, dataset_dir=dataset_dir, seed=seed, **options
        )
        train_dataset = clip_actions(train_dataset, action_clip_eps)
        val_dataset = clip_actions(val_dataset, action_clip_eps)
        train_dataset.seed(seeding.stream(seed, 'dataset'))
    if val_dataset is not None:
        val_dataset.seed(seeding.stream(seed, 'val_dataset'))
    env, eval_envs = _seeded_envs(family, env_name, env, eval_env, seed, num_eval_envs, dataset_dir, frame_stack)
    return RunEnvs(env, eval_envs, train_dataset, val_dataset, shards)


def make_seed_envs(env_name, seed, num_eval_envs=1, dataset_dir=None, frame_stack=None):
    """(env, eval_envs) of one more seed of a multi-seed run: the environments `make_run_envs(seed=seed)` gives,
    without loading the datasets again."""
    family = FAMILIES[get_env_family(env_name)]
    env, eval_env = (family.make_env(env_name, dataset_dir=dataset_dir, seed=seed) for _ in range(2))
    return _seeded_envs(family, env_name, env, eval_env, seed, num_eval_envs, dataset_dir, frame_stack)


def seed_env_list(env_name, seed, num_eval_envs=1, dataset_dir=None, frame_stack=None):
    """The environments of `make_seed_envs` as one list, the training environment first; `num_eval_envs=0`: the
    training environment alone (what an environment worker process builds, `envs.workers`)."""
    if num_eval_envs == 0:
        family = FAMILIES[get_env_family(env_name)]
        env = _wrap_env(family.make_env(env_name, dataset_dir=dataset_dir, seed=seed), family, env_name, frame_stack)
        env.reset(seed=seed)
        return [env]
    env, eval_envs = make_seed_envs(env_name, seed, num_eval_envs, dataset_dir=dataset_dir, frame_stack=frame_stack)
    return [env, *eval_envs]


def _seeded_envs(family, env_name, env, eval_env, seed, num_eval_envs, dataset_dir, frame_stack):
    """Wraps and seeds the training and first evaluation environment and adds the extra evaluation ones."""
    env, eval_env = (_wrap_env(e, family, env_name, frame_stack) for e in (env, eval_env))
    env.reset(seed=seed)
    eval_env.reset(seed=seed + 1)
    extra = _make_extra_eval_envs(family, env_name, num_eval_envs - 1, dataset_dir, frame_stack, seed)
    return env, [eval_env, *extra]


def _wrap_env(env, family, env_name, frame_stack):
    """The wrappers every environment gets: episode statistics, its family's reward shift, frame stacking."""
    # The monitor sits below the shift: `info['episode']` reports the task's own return, as in the reference and
    # as D4RL's normalized scores expect, while the agent receives the shifted reward.
    env = EpisodeMonitor(env, filter_regexes=list(family.INFO_FILTERS))
    shift = family.reward_shift(env_name)
    if shift:
        env = RewardShiftWrapper(env, shift)
    if frame_stack is not None:
        env = FrameStackWrapper(env, frame_stack)
    return env


def _make_extra_eval_envs(family, env_name, num_envs, dataset_dir, frame_stack, seed):
    raw = [family.make_env(env_name, dataset_dir=dataset_dir, seed=seed + 2000 + i) for i in range(num_envs)]
    return [_wrap_env(e, family, env_name, frame_stack) for e in raw]
