"""The run configuration: absl flags defined per driver preset, turned once into a frozen, validated `RunConfig`.

Everything below the drivers (the trainer, the chunk sampler, the loggers) takes a `RunConfig`; nothing else reads
absl flags. Agent hyperparameters stay in the agent's ml_collections config (`RunConfig.agent`); `horizon_length`
and `discount` are resolved once here, from the driver flags or `--agent.*`, so that every later reader sees one
value.
"""

import dataclasses
import os
from typing import Any

from absl import flags
from ml_collections import config_flags

from log_utils import get_flag_dict
from utils.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Preset:
    """What tells the drivers apart: defaults, whether there is an offline phase, where online batches come from.

    Attributes:
        agent_file: Default `--agent` config file.
        buffer_size: Default `--buffer_size`.
        offline: Whether the run has an offline phase (and its flags: `--offline_steps`, `--fused_steps`, shards).
        online_data_fraction: Share of every online batch drawn from the offline data; the rest comes from the
            replay buffer (0: replay only, as `main.py`; 0.5: RLPD's symmetric sampling, as `main_online.py`).
        replay_starts_with_data: The replay buffer starts as a copy of the offline data; else it starts empty and
            the online phase takes uniform random actions until `start_training`.
    """

    agent_file: str
    buffer_size: int
    offline: bool
    online_data_fraction: float
    replay_starts_with_data: bool


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Every run setting, typed and validated (`from_flags`). Field meanings are the flag help strings."""

    run_group: str
    seed: int  # The first of `seeds`.
    seeds: tuple  # Seeds trained together in this process (one for an ordinary run).
    seed_chunk: int
    env_name: str
    save_dir: str
    dataset_dir: str | None
    offline_steps: int
    fused_steps: int
    online_steps: int
    buffer_size: int
    log_interval: int
    eval_interval: int
    save_interval: int
    start_training: int
    utd_ratio: int
    eval_episodes: int
    video_episodes: int
    video_frame_skip: int
    eval_envs: int
    dataset_proportion: float
    dataset_replace_interval: int
    ogbench_dataset_dir: str | None
    sparse: bool
    frame_stack: int | None
    p_aug: float | None
    save_all_online_states: bool
    exp_name: str | None
    resume: bool
    keep_checkpoints: int
    max_runtime: float
    preset: Preset
    agent: Any  # The resolved agent ConfigDict (horizon_length and discount set from the flags).
    flag_record: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)  # flags.json content.

    @property
    def horizon_length(self):
        """Action chunk length H (the agent config's, resolved from `--horizon_length`/`--agent.horizon_length`)."""
        return self.agent['horizon_length']

    @property
    def discount(self):
        """Discount factor (the agent config's, resolved like the horizon)."""
        return self.agent['discount']

    @property
    def batch_size(self):
        """Chunks per update batch (the agent config's `batch_size`)."""
        return self.agent['batch_size']

    @property
    def random_steps(self):
        """Online steps that take uniform random actions before the agent acts: steps 1..start_training when the
        buffer starts empty (the reference's `i <= start_training`; the first update comes at `start_training`)."""
        return 0 if self.preset.replay_starts_with_data else self.start_training

    @property
    def num_seeds(self):
        return len(self.seeds)

    def for_seed(self, seed):
        """The single-seed run of `seed` (and its flags.json record), as `--seed=seed` alone would configure it."""
        record = dict(self.flag_record, seed=seed, seeds=None) if self.flag_record else {}
        return dataclasses.replace(self, seed=seed, seeds=(seed,), flag_record=record)

    def replace(self, **changes):
        """A validated copy with some fields changed (tests and notebooks build runs this way); a new `seed` alone
        makes a single-seed run of it."""
        if 'seed' in changes and 'seeds' not in changes:
            changes['seeds'] = (changes['seed'],)
        return validate(dataclasses.replace(self, **changes))


def define_flags(preset, flag_values=flags.FLAGS):
    """Defines the drivers' absl flags (the reference's names and defaults) in `flag_values`; `preset.offline`
    adds the offline-phase ones."""
    fv = dict(flag_values=flag_values)
    flags.DEFINE_string('run_group', 'Debug', 'Run group (folder under save_dir and wandb group).', **fv)
    flags.DEFINE_integer('seed', 0, 'Random seed.', **fv)
    flags.DEFINE_list(
        'seeds', None, 'Several seeds trained in this process as one vmapped program, e.g. 0,1,2,3; each seed gets '
        'its own run directory, as if run alone with --seed (refused with a different --seed).', **fv
    )  # fmt: skip
    flags.DEFINE_integer(
        'seed_chunk', 0, 'With --seeds: seeds vmapped together, the others loop inside the same compiled call '
        '(0: all seeds on a GPU/TPU, 1 on a CPU).', **fv
    )  # fmt: skip
    flags.DEFINE_string('env_name', 'cube-triple-play-singletask-task2-v0', 'Environment (and dataset) name.', **fv)
    flags.DEFINE_string('save_dir', 'exp/', 'Where run directories are created.', **fv)
    flags.DEFINE_string('dataset_dir', None, 'Dataset location (default per family, e.g. ~/.ogbench/data).', **fv)
    if preset.offline:
        flags.DEFINE_integer('offline_steps', 1000000, 'Offline gradient steps.', **fv)
        flags.DEFINE_integer('fused_steps', 100, 'Offline updates per compiled call (1: one call per update).', **fv)
    flags.DEFINE_integer('online_steps', 1000000, 'Online environment steps.', **fv)
    flags.DEFINE_integer('buffer_size', preset.buffer_size, 'Replay buffer capacity.', **fv)
    flags.DEFINE_integer('log_interval', 5000, 'Steps between training-metric logs.', **fv)
    flags.DEFINE_integer('eval_interval', 100000, 'Steps between evaluations (0: only at the end of each phase).', **fv)
    flags.DEFINE_integer('save_interval', -1, 'Steps between checkpoints (<= 0: none).', **fv)
    flags.DEFINE_integer('start_training', 5000, 'Online step from which the agent is updated.', **fv)
    flags.DEFINE_integer('utd_ratio', 1, 'Updates per online environment step (fused into one batch_update).', **fv)
    flags.DEFINE_float('discount', 0.99, 'Discount factor (also sets the agent config).', **fv)
    flags.DEFINE_integer('eval_episodes', 50, 'Evaluation episodes.', **fv)
    flags.DEFINE_integer('video_episodes', 0, 'Rendered evaluation episodes.', **fv)
    flags.DEFINE_integer('video_frame_skip', 3, 'Keep one rendered frame every this many steps.', **fv)
    flags.DEFINE_integer(
        'eval_envs', 10, 'Environment copies stepped in lockstep during evaluation (1: sequential).', **fv
    )
    flags.DEFINE_float(
        'dataset_proportion', 1.0, 'Fraction of the offline dataset to use (its first transitions).', **fv
    )
    flags.DEFINE_integer(
        'dataset_replace_interval', 1000, 'Steps between dataset shards (offline updates, and online steps where '
        'batches draw offline data).', **fv
    )  # fmt: skip
    flags.DEFINE_string('ogbench_dataset_dir', None, 'Folder of OGBench dataset shards (*.npz) to cycle through.', **fv)
    flags.DEFINE_integer('horizon_length', 5, 'Action chunk length H (also sets the agent config).', **fv)
    flags.DEFINE_bool('sparse', False, 'Sparse rewards: -1 on every non-success step (scene, puzzle).', **fv)
    flags.DEFINE_integer(
        'frame_stack', None, 'Observations stacked on the last axis (pixel runs; None: no stacking).', **fv
    )
    flags.DEFINE_float('p_aug', None, 'Probability of a random-crop augmentation of image batches (None: none).', **fv)
    flags.DEFINE_bool('save_all_online_states', False, 'Save qpos/qvel (and button states) of every online step.', **fv)
    flags.DEFINE_string('exp_name', None, 'Run directory name under save_dir/run_group (default: a unique name).', **fv)
    flags.DEFINE_bool(
        'resume', False, 'Continue the run --exp_name from its latest checkpoint (fresh start if none).', **fv
    )
    flags.DEFINE_integer('keep_checkpoints', 3, 'Full training checkpoints kept in <run_dir>/checkpoints.', **fv)
    flags.DEFINE_float(
        'max_runtime', 0, 'Seconds after which the run checkpoints and exits cleanly (0: no limit).', **fv
    )
    config_flags.DEFINE_config_file('agent', preset.agent_file, lock_config=False, **fv)


# Flags of `define_flags` that only the offline preset defines, with the value an online-only run implies.
_OFFLINE_ONLY = dict(offline_steps=0, fused_steps=1)

_INT_MINIMUMS = dict(
    online_steps=0, buffer_size=1, log_interval=1, eval_interval=0, start_training=0, utd_ratio=1, eval_episodes=0,
    video_episodes=0, video_frame_skip=1, offline_steps=0, dataset_replace_interval=0, fused_steps=1, eval_envs=1,
    keep_checkpoints=1, seed_chunk=0,
)  # fmt: skip


def _given_on_command_line(name, argv):
    return any(arg == f'--{name}' or arg.startswith(f'--{name}=') for arg in argv)


def resolve_agent_config(config, horizon_length, discount, argv):
    """A copy of the agent config with `horizon_length` and `discount` taken from the driver flags.

    `--agent.horizon_length` / `--agent.discount` win when the driver flag is not given on the command line, and
    are refused when both are given with different values.
    """
    config = config.copy_and_resolve_references()
    for name, flag_value in (('horizon_length', horizon_length), ('discount', discount)):
        if _given_on_command_line(f'agent.{name}', argv):
            if _given_on_command_line(name, argv) and config[name] != flag_value:
                raise UsageError(
                    f'--{name}={flag_value} and --agent.{name}={config[name]} disagree; give only --{name}'
                )
            continue
        config[name] = flag_value
    return config


def from_flags(flag_values, argv, preset):
    """The validated `RunConfig` of parsed absl flags; `argv` is the command line (to see which flags were given)."""
    derived = ('seeds', 'preset', 'agent', 'flag_record')
    names = [f.name for f in dataclasses.fields(RunConfig) if f.name not in derived]
    values = {}
    for name in names:
        if name in flag_values:
            values[name] = flag_values[name].value
        elif name in _OFFLINE_ONLY:
            values[name] = _OFFLINE_ONLY[name]
        else:
            raise KeyError(f'flag --{name} is not defined; call define_flags first')
    seeds = resolve_seeds(flag_values.seed, flag_values.seeds, argv)
    values['seed'] = seeds[0]
    agent = resolve_agent_config(flag_values.agent, flag_values.horizon_length, flag_values.discount, argv)
    record = get_flag_dict(flag_values)
    record['agent'] = agent.to_dict()
    return validate(RunConfig(**values, seeds=seeds, preset=preset, agent=agent, flag_record=record))


def resolve_seeds(seed, seeds, argv):
    """The run's seeds: `--seeds` when given (refused with a `--seed` on the command line that differs from
    it), else `(seed,)`."""
    if not seeds:
        return (seed,)
    try:
        resolved = tuple(int(s) for s in seeds)
    except ValueError as e:
        given = ','.join(seeds)
        raise UsageError(f'--seeds must be comma-separated integers, e.g. --seeds=0,1,2,3; got {given}') from e
    if _given_on_command_line('seed', argv) and resolved != (seed,):
        raise UsageError(f'--seed={seed} and --seeds={",".join(seeds)} disagree; give only --seeds')
    return resolved


def validate(run):
    """Returns `run` when every setting is usable; raises `UsageError` with one actionable line otherwise."""
    for name, minimum in _INT_MINIMUMS.items():
        value = getattr(run, name)
        if value is None or value < minimum:
            raise UsageError(f'--{name} must be >= {minimum}, got {value}')
    if len(set(run.seeds)) != len(run.seeds) or min(run.seeds) < 0:
        raise UsageError(f'--seeds must be distinct non-negative integers, got {",".join(map(str, run.seeds))}')
    if run.num_seeds > 1 and run.ogbench_dataset_dir is not None:
        raise UsageError('--seeds with --ogbench_dataset_dir is not supported; run one process per seed (--seed)')
    horizon = run.horizon_length
    if horizon is None or horizon < 1:
        raise UsageError(f'--horizon_length must be >= 1, got {horizon}')
    if not 0.0 < run.dataset_proportion <= 1.0:
        raise UsageError(f'--dataset_proportion must be in (0, 1], got {run.dataset_proportion}')
    if run.max_runtime < 0:
        raise UsageError(f'--max_runtime must be >= 0, got {run.max_runtime}')
    if run.frame_stack is not None and run.frame_stack < 1:
        raise UsageError(f'--frame_stack must be >= 1 (or unset), got {run.frame_stack}')
    if run.p_aug is not None and not 0.0 <= run.p_aug <= 1.0:
        raise UsageError(f'--p_aug must be in [0, 1] (or unset), got {run.p_aug}')
    if run.resume and not run.exp_name:
        raise UsageError('--resume needs --exp_name, the name of the run directory to continue')
    for name in ('dataset_dir', 'ogbench_dataset_dir'):
        path = getattr(run, name)
        if path is not None and not os.path.isdir(path):
            raise UsageError(f'--{name} {path} is not a directory')
    replay_share = 1.0 - run.preset.online_data_fraction
    if run.online_steps > 0 and replay_share > 0 and not run.preset.replay_starts_with_data:
        if run.start_training < horizon:
            raise UsageError(
                f'--start_training ({run.start_training}) must be >= the horizon length ({horizon}), so that the '
                'replay buffer holds a full chunk before the first update'
            )
    return run
