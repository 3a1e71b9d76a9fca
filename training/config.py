"""The run configuration: every run setting declared once, as a field of `RunConfig`, with its default, help text,
bounds and phase; the drivers' absl flags are generated from these declarations (`define_flags`) and turned once
into a frozen, validated `RunConfig` (`from_flags`).

Everything below the drivers (the trainer, the loops, the chunk sampler, the loggers) takes a `RunConfig`; nothing
else reads absl flags. Agent hyperparameters stay in the agent's ml_collections config (`RunConfig.agent`), and that
config is the one place of the chunk length and the discount: the driver flags `--horizon_length` and `--discount`
are aliases that set `--agent.horizon_length` and `--agent.discount`.
"""

import dataclasses
import difflib
import importlib.util
import inspect
import json
import os
import re
import sys
import textwrap
from typing import Any

from absl import flags
from ml_collections import config_flags

from agents import agent_module
from evaluation import EVAL_EPISODES
from log_utils import jsonable
from training import paper_settings
from utils.config_rules import check_config
from utils.errors import UsageError, UserError

# Driver flags that only set a key of the agent config, with the driver's value for a key the agent config leaves
# unset when neither spelling is used (None: the agent config always sets it; its value is the default).
AGENT_ALIASES = dict(horizon_length=5, discount=None)
# Old flag names, refused with the new name.
RENAMED_FLAGS = dict(seed_chunk='seeds_per_vmap', env_threads='env_workers')
# How `--help` groups the run settings (every `RunConfig` field is in one group).
SETTING_GROUPS = dict(
    run=('env_name', 'seeds', 'run_group', 'save_dir', 'exp_name', 'resume', 'protocol'),
    data=('dataset_dir', 'dataset_proportion', 'sparse', 'ogbench_dataset_dir', 'dataset_replace_interval',
          'frame_stack', 'p_aug', 'buffer_size'),
    training=('offline_steps', 'online_steps', 'start_training', 'utd_ratio', 'balanced_sampling'),
    evaluation=('eval_interval', 'eval_episodes', 'eval_envs', 'video_episodes', 'video_frame_skip'),
    logging=('log_interval', 'save_all_online_states'),
    checkpoints=('save_interval', 'keep_checkpoints', 'max_runtime'),
    speed=('fused_steps', 'fuse_online_updates', 'device_replay', 'seeds_per_vmap', 'env_workers',
           'compilation_cache_dir'),
)  # fmt: skip
HELP_ARGS = ('-h', '--help', '--helpshort', '-?')


@dataclasses.dataclass(frozen=True)
class Preset:
    """What tells the drivers apart: defaults, whether there is an offline phase, where online batches come from.
    A resumed run must have the preset it was started with (`resume_conflicts`).

    Attributes:
        driver: The driver script (`main.py`), as `flags.json` names it.
        agent_file: Default `--agent` config file.
        buffer_size: Default `--buffer_size`.
        offline: Whether the run has an offline phase (and the settings of phase 'offline').
        online_data_fraction: Share of every online batch drawn from the offline data; the rest comes from the
            replay buffer (0: replay only, as `main.py`; 0.5: RLPD's symmetric sampling, as `main_online.py`).
        replay_starts_with_data: The replay buffer starts as a copy of the offline data; else it starts empty and
            the online phase takes uniform random actions until `start_training`.
    """

    driver: str
    agent_file: str
    buffer_size: int
    offline: bool
    online_data_fraction: float
    replay_starts_with_data: bool


# What a setting is to a resumed run (`resume_conflicts`): DEFINES the run (a resume with another value is refused),
# MAY_CHANGE between starts of one run (each start's changes are recorded), or NAMES where the run directory is.
# LOCATION: a folder that may move between starts, while whether it is given at all defines the run.
DEFINES, MAY_CHANGE, LOCATION, NAMES = 'defines', 'may change', 'location', 'names'


def setting(default, help, on_resume, kind=None, minimum=None, maximum=None, above=None, phase=None, flag_default=None):
    """One run setting: a dataclass field whose metadata `define_flags` and `validate` read.

    Args:
        default: The value of a run that does not set it (a driver without an offline phase runs no offline steps).
        help: The flag's help text.
        on_resume: DEFINES, MAY_CHANGE, LOCATION or NAMES: what the setting is to a resumed run.
        kind: The flag type (int, float, str, bool, list); by default the type of `default`.
        minimum, maximum: Inclusive bounds; `above`: an exclusive lower bound. An unset (None) value passes.
        phase: 'offline' for a setting that only drivers with an offline phase define.
        flag_default: A function of the `Preset` that gives the flag's default where it depends on the driver.
    """
    assert on_resume in (DEFINES, MAY_CHANGE, LOCATION, NAMES), on_resume
    meta = dict(help=help, kind=kind or type(default), minimum=minimum, maximum=maximum, above=above, phase=phase,
                on_resume=on_resume)  # fmt: skip
    meta['flag_default'] = default if flag_default is None else flag_default
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Every run setting, typed and validated; field metadata holds each flag's help text and bounds."""

    run_group: str = setting('Debug', 'Run group (folder under save_dir and wandb group).', on_resume=NAMES)
    seeds: tuple = setting((0,), 'Seeds trained in this process as one vmapped program, e.g. 0,1,2,3; each seed gets '
                           'its own run directory, as if run alone with --seed=s (--seed=s is --seeds=s).', kind=list,
                           on_resume=DEFINES)
    env_workers: int = setting(-1, 'Worker processes that hold the training environments, and with --seeds the other '
                               'seeds\' evaluation copies, dealt round-robin: a worker steps through each action '
                               'chunk as soon as it is sampled, while this process trains, and the seeds\' '
                               'environments step side by side (0: every environment in this process; -1: none for '
                               'one seed, else one per seed, at most one per CPU core). Results do not depend on '
                               'it.', minimum=-1, on_resume=MAY_CHANGE)
    seeds_per_vmap: int = setting(0, 'With --seeds: seeds vmapped together, the others loop inside the same compiled '
                                  'call (0: all seeds on a GPU/TPU, 1 on a CPU).', minimum=0, on_resume=MAY_CHANGE)
    env_name: str = setting('cube-triple-play-singletask-task2-v0', 'Environment (and dataset) name.',
                            on_resume=DEFINES)
    save_dir: str = setting('exp/', 'Where run directories are created.', on_resume=NAMES)
    dataset_dir: str | None = setting(None, 'Dataset location (default per family, e.g. ~/.ogbench/data).', kind=str,
                                      on_resume=MAY_CHANGE)  # a location: the same data, moved
    offline_steps: int = setting(1000000, 'Offline gradient steps.', minimum=0, phase='offline', on_resume=MAY_CHANGE)
    fused_steps: int = setting(100, 'Offline updates per compiled call (1: one call per update).', minimum=1,
                               phase='offline', on_resume=MAY_CHANGE)
    online_steps: int = setting(1000000, 'Online environment steps.', minimum=0, on_resume=MAY_CHANGE)
    buffer_size: int = setting(1000000, 'Replay buffer capacity.', minimum=1,
                               flag_default=lambda preset: preset.buffer_size, on_resume=DEFINES)
    log_interval: int = setting(5000, 'Steps between training-metric logs.', minimum=1, on_resume=MAY_CHANGE)
    eval_interval: int = setting(100000, 'Steps between evaluations (0: only at the end of each phase).', minimum=0,
                                 on_resume=MAY_CHANGE)
    save_interval: int = setting(-1, 'Steps between checkpoints (<= 0: none).', on_resume=MAY_CHANGE)
    start_training: int = setting(5000, 'Online step from which the agent is updated.', minimum=0, on_resume=DEFINES)
    utd_ratio: int = setting(1, 'Updates per online environment step, each on its own batch.', minimum=1,
                             on_resume=DEFINES)
    balanced_sampling: bool = setting(False, 'Online phase as main_online.py\'s (the QAM reference\'s flag): the '
                                      'replay buffer starts empty, random actions until --start_training, then every '
                                      'batch half offline data, half replay (False: replay seeded with the data).',
                                      phase='offline', on_resume=DEFINES)
    fuse_online_updates: bool = setting(True, 'Hold the online updates of a chunk\'s steps and run them as one '
                                        'compiled call (sooner when the agents are read: a policy query, log, '
                                        'evaluation, checkpoint): the same updates in the same order (False: one call '
                                        'per step, as the reference).', on_resume=MAY_CHANGE)
    device_replay: bool = setting(True, 'Keep the dataset and the replay buffers in device memory and gather the '
                                  'online batches inside the update from indices drawn on the host: the same batches, '
                                  'a few kilobytes moved per step (state observations; pixels, frame stacking, '
                                  'augmentation and dataset shards sample on the host).', on_resume=MAY_CHANGE)
    eval_episodes: int = setting(EVAL_EPISODES, 'Evaluation episodes.', minimum=0, on_resume=MAY_CHANGE)
    video_episodes: int = setting(0, 'Rendered evaluation episodes.', minimum=0, on_resume=MAY_CHANGE)
    video_frame_skip: int = setting(3, 'Keep one rendered frame every this many steps.', minimum=1,
                                    on_resume=MAY_CHANGE)
    eval_envs: int = setting(10, 'Environment copies stepped in lockstep during evaluation (1: sequential).', minimum=1,
                             on_resume=MAY_CHANGE)
    dataset_proportion: float = setting(1.0, 'Fraction of the offline dataset to use (its first transitions).',
                                        above=0.0, maximum=1.0, on_resume=DEFINES)
    dataset_replace_interval: int = setting(1000, 'Steps between dataset shards (offline updates, and online steps '
                                            'where batches draw offline data).', minimum=0, on_resume=DEFINES)
    ogbench_dataset_dir: str | None = setting(None, 'Folder of OGBench dataset shards (*.npz) to cycle through.',
                                              kind=str, on_resume=LOCATION)
    sparse: bool = setting(False, 'Sparse rewards: -1 on every non-success step (scene, puzzle).', on_resume=DEFINES)
    frame_stack: int | None = setting(None, 'Observations stacked on the last axis (pixel runs; None: no stacking).',
                                      kind=int, minimum=1, on_resume=DEFINES)
    p_aug: float | None = setting(None, 'Probability of a random-crop augmentation of image batches (None: none).',
                                  kind=float, minimum=0.0, maximum=1.0, on_resume=DEFINES)
    save_all_online_states: bool = setting(False, 'Save qpos/qvel (and button states) of every online step.',
                                           on_resume=MAY_CHANGE)
    exp_name: str | None = setting(None, 'Run directory name under save_dir/run_group (default: a unique name).',
                                   kind=str, on_resume=NAMES)
    resume: bool = setting(False, 'Continue the run --exp_name from its latest checkpoint (fresh start if none); the '
                           'settings that define the run must be those it was started with.', on_resume=NAMES)
    keep_checkpoints: int = setting(3, 'Full training checkpoints kept in <run_dir>/checkpoints.', minimum=1,
                                    on_resume=MAY_CHANGE)
    max_runtime: float = setting(0.0, 'Seconds after which the run checkpoints and exits cleanly (0: no limit).',
                                 minimum=0.0, on_resume=MAY_CHANGE)
    compilation_cache_dir: str | None = setting(
        None, 'Persistent XLA compilation cache, shared by runs with the same shapes (a sweep, a requeued job) so that '
        'they load their compiled programs instead of compiling them again; safe for concurrent and killed processes '
        '(entries are written whole); bounded at 16 GiB when a run starts, oldest entries removed. Default: '
        '$JAX_COMPILATION_CACHE_DIR, else ~/.cache/qc-jax/xla; "none": off.', kind=str, on_resume=MAY_CHANGE)
    protocol: str = setting('auto', "The paper whose protocol the run follows: qc (Li, Zhou, Levine 2025) or qam (Li, "
                            'Levine 2026). The run says where its settings differ from that paper\'s for its method '
                            'and task, and sweep.py table and log_utils plot --paper face it with that paper\'s '
                            'curves. auto: the paper of the agent (agents/qam.py: qam; the others: qc).',
                            on_resume=MAY_CHANGE)
    preset: Preset = None  # The driver's preset.
    agent: Any = None  # The agent ConfigDict; holds horizon_length and discount.

    @property
    def seed(self):
        """The first of `seeds` (the seed of a single-seed run)."""
        return self.seeds[0]

    @property
    def horizon_length(self):
        """Action chunk length H (the agent config's `horizon_length`)."""
        return self.agent['horizon_length']

    @property
    def discount(self):
        """Discount factor (the agent config's)."""
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

    @property
    def flag_record(self):
        """What `flags.json` records: every setting by its flag name (`seed` for one seed, `seeds` for several),
        the resolved agent config under `agent`, the driver's preset under `preset`, and the name of the run's
        method in the paper of its protocol under `paper_method` (for the plots)."""
        record = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata and f.name != 'seeds'}
        if self.num_seeds == 1:
            record['seed'] = self.seed
        else:
            record['seeds'] = list(self.seeds)
        record['agent'] = self.agent.to_dict()
        record['preset'] = dataclasses.asdict(self.preset)
        record['paper_method'] = paper_settings.method_of(self.agent, self.protocol)  # None: not in that paper
        return record

    def for_seed(self, seed):
        """The single-seed run of `seed`, as `--seed=seed` alone would configure it."""
        return dataclasses.replace(self, seeds=(seed,))

    def replace(self, **changes):
        """A validated copy with some fields changed (tests and notebooks build runs this way)."""
        return validate(dataclasses.replace(self, **changes))


def define_flags(preset, flag_values=flags.FLAGS):
    """Defines the drivers' absl flags in `flag_values`, one per `RunConfig` field (the reference's names and
    defaults), plus the `--seed`, `--horizon_length` and `--discount` aliases and the `--agent` config file."""
    fv = dict(flag_values=flag_values)
    definers = {int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string,
                bool: flags.DEFINE_bool, list: flags.DEFINE_list}  # fmt: skip
    for field in dataclasses.fields(RunConfig):
        meta = field.metadata
        if not meta or (meta['phase'] == 'offline' and not preset.offline):
            continue
        default = meta['flag_default'](preset) if callable(meta['flag_default']) else meta['flag_default']
        if meta['kind'] is list:
            default = None  # `--seeds` unset: the seed of `--seed`.
        definers[meta['kind']](field.name, default, meta['help'], **fv)
    flags.DEFINE_integer('seed', 0, 'Random seed (the same as --seeds=SEED).', **fv)
    for name, default in AGENT_ALIASES.items():
        define = flags.DEFINE_integer if isinstance(default, int) else flags.DEFINE_float
        shown = default if default is not None else 'that of the agent config'
        define(name, None, f'Alias of --agent.{name} (default {shown}).', **fv)
    for old, new in RENAMED_FLAGS.items():
        flags.DEFINE_string(old, None, f'Renamed: use --{new}.', **fv)
    config_flags.DEFINE_config_file('agent', preset.agent_file, lock_config=False, **fv)


def _present(flag_values, name):
    """Whether `--name` was given on the command line (ml_collections registers `agent.*` overrides when given)."""
    return name in flag_values and bool(flag_values[name].present)


def resolve_agent_config(flag_values):
    """A copy of the agent config with the `--horizon_length`/`--discount` aliases applied: an alias sets the key;
    the two spellings with different values are refused; neither gives the driver's default."""
    config = flag_values.agent.copy_and_resolve_references()
    for name, default in AGENT_ALIASES.items():
        alias = flag_values[name].value
        if _present(flag_values, f'agent.{name}'):
            if alias is not None and config[name] != alias:
                raise UsageError(f'--{name}={alias} and --agent.{name}={config[name]} disagree; give only --{name}')
        elif alias is not None:
            config[name] = alias
        elif config.get(name) is None and default is not None:
            config[name] = default
    return config


def resolve_seeds(flag_values):
    """The run's seeds: `--seeds` when given (refused with a `--seed` that differs from it), else `(--seed,)`."""
    seed, seeds = flag_values.seed, flag_values.seeds
    if not seeds:
        return (seed,)
    try:
        resolved = tuple(int(s) for s in seeds)
    except ValueError as e:
        given = ','.join(seeds)
        raise UsageError(f'--seeds must be comma-separated integers, e.g. --seeds=0,1,2,3; got {given}') from e
    if _present(flag_values, 'seed') and resolved != (seed,):
        raise UsageError(f'--seed={seed} and --seeds={",".join(seeds)} disagree; give only --seeds')
    return resolved


def from_flags(flag_values, preset):
    """The validated `RunConfig` of absl flags parsed from `define_flags(preset)`."""
    for old, new in RENAMED_FLAGS.items():
        if _present(flag_values, old):
            raise UsageError(f'--{old} was renamed: use --{new}={flag_values[old].value}')
    values = {}
    for field in dataclasses.fields(RunConfig):
        if field.metadata and field.name in flag_values and field.name != 'seeds':
            values[field.name] = flag_values[field.name].value
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    if not preset.offline:
        values['offline_steps'] = 0  # A driver without an offline phase (no offline flags) runs none.
    agent = resolve_agent_config(flag_values)
    run = validate(RunConfig(**values, seeds=resolve_seeds(flag_values), preset=preset, agent=agent))
    for line in paper_settings.notes(run.env_name, run.sparse, run.agent, run.protocol):
        print(line, flush=True)  # a paper task run with other settings than the paper's: said, then trained
    return run


def _check_bounds(name, value, meta):
    if value is None or meta['kind'] not in (int, float):
        return
    low, high, above = meta['minimum'], meta['maximum'], meta['above']
    if above is not None and high is not None and not above < value <= high:
        raise UsageError(f'--{name} must be in ({above}, {high}], got {value}')
    if low is not None and high is not None and not low <= value <= high:
        raise UsageError(f'--{name} must be in [{low}, {high}] (or unset), got {value}')
    if low is not None and value < low:
        raise UsageError(f'--{name} must be >= {low}, got {value}')


def check_agent_config(config):
    """Refuses an agent config whose values break the rules its agent file declares next to `get_config()`
    (`CONFIG_RULES`). An `agent_name` outside the `agents` registry is left to `training.setup.create_agents`,
    which checks it against the classes the run was given."""
    module = agent_module(config)
    if module is None:
        return
    where = os.path.relpath(module.__file__)
    if not hasattr(module, 'CONFIG_RULES'):
        raise UsageError(f'{where} declares no CONFIG_RULES next to get_config() (see utils/config_rules.py)')
    check_config(config, module.CONFIG_RULES, where, getattr(module, 'CONFIG_CHECKS', ()))


def _check_observations(run, pixels):
    """Refuses settings that need the other kind of observations than the task's (images or states)."""
    from utils.encoders import encoder_modules

    encoder = run.agent.get('encoder')
    if encoder is not None and not pixels:
        raise UsageError(f'--agent.encoder={encoder} is an image encoder, and {run.env_name} observes states; leave '
                         '--agent.encoder unset, or train on a visual- task')  # fmt: skip
    if pixels and encoder is None:
        if 'encoder' not in run.agent:
            raise UsageError(f'{run.env_name} observes images, and {run.agent.get("agent_name")} has no image encoder '
                             '(no --agent.encoder setting); train it on a state task')  # fmt: skip
        given = ', '.join(f'--agent.encoder={name}' for name in encoder_modules)
        raise UsageError(f'{run.env_name} observes images, which the agent reads through an image encoder; give one: '
                         f'{given}')  # fmt: skip
    if run.p_aug is not None and not pixels:
        raise UsageError(f'--p_aug={run.p_aug} crops images, and {run.env_name} observes states; leave --p_aug unset')


def validate(run):
    """Returns `run` when every setting is usable (with `balanced_sampling`, its preset's online sources are
    main_online.py's); raises `UsageError` with one actionable line otherwise."""
    if run.balanced_sampling:
        preset = dataclasses.replace(run.preset, online_data_fraction=0.5, replay_starts_with_data=False)
        run = dataclasses.replace(run, preset=preset)
    for field in dataclasses.fields(run):
        if field.metadata:
            _check_bounds(field.name, getattr(run, field.name), field.metadata)
    if run.protocol == 'auto':
        run = dataclasses.replace(run, protocol=paper_settings.protocol_of(run.agent))
    if run.protocol not in paper_settings.PROTOCOL_NAMES:
        raise UsageError(f'--protocol must be auto, {" or ".join(paper_settings.PROTOCOL_NAMES)}, got {run.protocol}')
    if not run.seeds or len(set(run.seeds)) != len(run.seeds) or min(run.seeds) < 0:
        raise UsageError(f'--seeds must be distinct non-negative integers, got {",".join(map(str, run.seeds))}')
    if run.num_seeds > 1 and run.ogbench_dataset_dir is not None:
        raise UsageError('--seeds with --ogbench_dataset_dir is not supported; run one process per seed (--seed)')
    horizon = run.horizon_length
    if horizon is None or horizon < 1:
        raise UsageError(f'--horizon_length must be >= 1, got {horizon}')
    if run.resume and not run.exp_name:
        raise UsageError('--resume needs --exp_name, the name of the run directory to continue')
    for name in ('dataset_dir', 'ogbench_dataset_dir'):
        path = getattr(run, name)
        if path is not None and not os.path.isdir(path):
            raise UsageError(f'--{name} {path} is not a directory')
    check_agent_config(run.agent)
    from envs.env_utils import get_env_family, observes_pixels

    get_env_family(run.env_name)  # An unknown environment or task is refused before anything loads.
    _check_observations(run, observes_pixels(run.env_name))
    replay_share = 1.0 - run.preset.online_data_fraction
    if run.online_steps > 0 and replay_share > 0 and not run.preset.replay_starts_with_data:
        if run.start_training < horizon:
            raise UsageError(
                f'--start_training ({run.start_training}) must be >= the horizon length ({horizon}), so that the '
                'replay buffer holds a full chunk before the first update'
            )
    return run


# What a resumed run may change.


def comparable(value):
    """`value` as `flags.json` holds it once read back (`log_utils.save_flags`), so that a record and a run compare
    alike."""
    return json.loads(json.dumps(jsonable(value)))


def _shown(value):
    if isinstance(value, list):
        return '(' + ','.join(map(_shown, value)) + ')'
    return str(value)


def resume_conflicts(record, run):
    """What keeps the single-seed `run` from resuming the run recorded in `record` (its effective `flags.json`,
    `analysis.run_files.read_flags`): one phrase per setting that DEFINES the run and differs (every agent key, the
    seed, the driver) and per LOCATION given on one side only ([] when it may resume). A setting the record lacks
    (added to the code after the run started) counts as its default."""
    now = comparable(run.flag_record)
    conflicts = []

    def differs(flag, recorded, given):
        if recorded != given:
            conflicts.append(f'{flag}={_shown(recorded)} (now {_shown(given)})')

    for field in dataclasses.fields(RunConfig):
        meta = field.metadata
        if not meta or meta['on_resume'] not in (DEFINES, LOCATION):
            continue
        if field.name == 'seeds':  # one seed's run: its record names the seed
            differs('--seed', record.get('seed', 0), now['seed'])
            continue
        default = meta['flag_default'](run.preset) if callable(meta['flag_default']) else meta['flag_default']
        recorded, given = record.get(field.name, comparable(default)), now[field.name]
        if meta['on_resume'] == DEFINES or (recorded is None) != (given is None):  # a LOCATION may move
            differs(f'--{field.name}', recorded, given)
    module = agent_module(run.agent)
    agent_record, defaults = record.get('agent', {}), comparable(module.get_config() if module else {})
    for key in dict.fromkeys([*agent_record, *now['agent']]):
        given = now['agent'].get(key, '<no such setting>')
        flag = f'--{key}' if key in AGENT_ALIASES else f'--agent.{key}'  # as the command line spells it
        differs(flag, agent_record.get(key, defaults.get(key, '<not recorded>')), given)
    recorded_preset = record.get('preset')
    if recorded_preset is not None and recorded_preset.get('driver') != run.preset.driver:
        conflicts.append(f'the driver {recorded_preset.get("driver")} (now {run.preset.driver})')
    elif recorded_preset is not None:
        for key, given in now['preset'].items():
            differs(f'the preset\'s {key}', recorded_preset.get(key), given)
    return conflicts


def length_conflicts(record, run, done_step):
    """What keeps the single-seed `run` from resuming the run recorded in `record` at log step `done_step` (its
    checkpoint's): a phase length below the steps done, or an offline length changed after that phase ended."""
    conflicts = []
    offline_end = int(record.get('offline_steps') or 0)
    if done_step <= offline_end:
        if run.offline_steps < done_step:
            conflicts.append(f'--offline_steps={run.offline_steps} is below the {done_step} offline steps done')
    else:
        if run.offline_steps != offline_end:
            conflicts.append(f'--offline_steps={offline_end} (now {run.offline_steps}; the offline phase has ended)')
        if run.online_steps < done_step - offline_end:
            conflicts.append(f'--online_steps={run.online_steps} is below the {done_step - offline_end} online steps '
                             'done')  # fmt: skip
    return conflicts


# `--help` and the checks of the command line that run before absl parses it.


def load_agent_file(path):
    """The module of an agent config file (what `--agent=PATH` names); `UsageError` when it is missing."""
    if not os.path.isfile(path):
        agents_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'agents')
        known = ', '.join(sorted(f'agents/{f}' for f in os.listdir(agents_dir) if f.endswith('.py') and f[0] != '_'))
        raise UsageError(f'--agent={path}: no such agent file (agent files: {known})')
    spec = importlib.util.spec_from_file_location(f'agent_config_{abs(hash(path))}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def agent_file_of(argv, preset):
    """The agent file an argv names (`--agent=PATH` or `--agent PATH`), else the driver's default."""
    for i, arg in enumerate(argv):
        if arg.startswith('--agent='):
            return arg.split('=', 1)[1]
        if arg == '--agent' and i + 1 < len(argv):
            return argv[i + 1]
    return preset.agent_file


def agent_key_comments(module):
    """{key: its comment in `get_config()`}."""
    comments = {}
    for line in inspect.getsource(module.get_config).splitlines():
        m = re.match(r'\s*(\w+)=.*#\s*(.*)$', line)
        if m:
            comments[m[1]] = m[2]
    return comments


def check_agent_args(argv, preset):
    """Refuses, before absl parses them, a missing agent file and `--agent.KEY` names its `get_config()` lacks."""
    path = agent_file_of(argv, preset)
    keys = set(load_agent_file(path).get_config().keys())
    for arg in argv[1:]:
        m = re.match(r'--agent\.(\w+)', arg)
        if m and m[1] not in keys:
            close = difflib.get_close_matches(m[1], sorted(keys), n=1)
            hint = f'; did you mean --agent.{close[0]}?' if close else f'; its settings: {", ".join(sorted(keys))}'
            raise UsageError(f'unknown agent setting --agent.{m[1]} ({path}){hint}')


def _rows(rows, width=120, name_width=32):
    """`rows` of (flag, text) as an indented two-column block; a flag longer than its column gets a line of its
    own."""
    out = []
    for name, text in rows:
        lines = textwrap.wrap(text, width - name_width - 4) or ['']
        if len(name) >= name_width:
            out.append(f'    {name}')
            lines = [' ' * name_width + line for line in lines]
            out += ['    ' + line for line in lines]
            continue
        out.append(f'    {name:<{name_width}}{lines[0]}')
        out += [' ' * (name_width + 4) + line for line in lines[1:]]
    return out


def help_text(preset, agent_path, program, summary):
    """`--help`: every run setting by group with its default, then the agent file's keys with their defaults and
    the comments of its `get_config()`."""
    fields = {f.name: f for f in dataclasses.fields(RunConfig) if f.metadata}
    lines = [f'{program}: {summary}', '', 'Run settings (--name=value; default in brackets):']
    for group, names in SETTING_GROUPS.items():
        rows = []
        for name in names:
            meta = fields[name].metadata
            if meta['phase'] == 'offline' and not preset.offline:
                continue
            default = meta['flag_default'](preset) if callable(meta['flag_default']) else meta['flag_default']
            if isinstance(default, tuple):  # a list flag (`--seeds`): given as comma-separated values
                default = ','.join(map(str, default))
            rows.append((f'--{name}', f'{meta["help"]} [{default}]'))
        lines += [f'  {group}', *_rows(rows)]
    module = load_agent_file(agent_path)
    config = module.get_config()
    lines += ['  aliases', *_rows([
        ('--seed', 'The same as --seeds=SEED (one seed). [0]'),
        *[(f'--{k}', f'Sets --agent.{k}. [{v if v is not None else config.get(k)}]') for k, v in AGENT_ALIASES.items()],
    ])]  # fmt: skip
    comments = agent_key_comments(module)
    lines += ['', f'Agent settings of {agent_path} (--agent.key=value; --agent=FILE picks another agent):']
    keys = [*comments, *(k for k in config if k not in comments)]  # the order of `get_config()`
    lines += _rows([(f'--agent.{k}', f'{comments.get(k, "")} [{config[k]}]') for k in keys if k in config])
    from envs.ogbench_utils import MODEL_CACHE_ENV

    lines += ['', 'Environment variables:', *_rows([(
        f'${MODEL_CACHE_ENV}', 'Folder where the MuJoCo models OGBench environments compile are kept for later '
        'processes to load (unset: each process compiles its own; the test suite sets it).')])]  # fmt: skip
    lines += ['', '--helpfull lists every flag, absl\'s own included.']
    return '\n'.join(lines)


def flags_parser(preset, summary, flag_values=flags.FLAGS):
    """The `flags_parser` of a driver's `absl.app.run`, which defines the driver's flags (`define_flags`) in
    `flag_values` and parses them: `--help` prints `help_text` and exits 0; a missing agent file, an unknown
    `--agent.KEY` and anything absl refuses (unknown flags, bad values) end in one line and exit 2, before anything
    is loaded."""

    def parse(argv):
        program = os.path.basename(argv[0])
        try:
            if any(arg in HELP_ARGS for arg in argv[1:]):
                try:
                    print(help_text(preset, agent_file_of(argv, preset), program, summary), flush=True)
                except BrokenPipeError:  # `--help | head`: the reader has what it wanted
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(0)
            check_agent_args(argv, preset)  # before the config flag reads its overrides from the command line
            define_flags(preset, flag_values)
            try:
                remaining = flag_values(argv)
            except flags.Error as e:
                raise UsageError(' '.join(str(e).split())) from e
            if len(remaining) > 1:  # absl hands words that are not flags (or follow `--`) to main, which ignores them
                raise UsageError(f'unexpected argument {remaining[1]!r}: settings are --name=value (see --help)')
            return remaining
        except UserError as e:
            print(f'{e.prefix}{e}', file=sys.stderr, flush=True)
            sys.exit(e.exit_code)

    return parse
