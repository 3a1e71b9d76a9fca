"""Pieces shared by the drivers (`main.py`, `main_online.py`): checks, data processing, the online actor, logging.

Nothing here knows about a particular agent or environment: agents come from the config's `agent_name`, and
environment quirks (reward shifts, state export) live in `envs/`.
"""

import os
import pickle
import sys
import time

import flax
import jax
import numpy as np
import tqdm
from absl import flags
from ml_collections import config_flags

from envs.env_state import get_env_state
from envs.env_utils import EnvError, make_env_and_datasets, make_eval_envs
from evaluation import evaluate
from log_utils import Loggers, drop_rows_after, get_exp_name, get_flag_dict, save_flags, setup_wandb
from utils.checkpoints import (
    CheckpointError,
    CheckpointManager,
    DatasetMismatchError,
    NonFiniteError,
    StopRequest,
    check_dataset_matches_env,
    check_disk_space,
    check_finite,
    checkpoint_steps,
)
from utils.datasets import Dataset
from utils.flax_utils import save_agent
from utils.io_utils import atomic_write_bytes

FUSED_BLOCK_BYTES = 256 * 2**20  # Upper bound on the host memory of one block of pre-sampled offline batches.


class UsageError(Exception):
    """A bad flag or input; the drivers print its one-line message and exit non-zero without a traceback."""


class StopTraining(Exception):
    """A requested stop (SIGTERM/SIGINT or `--max_runtime`) after a checkpoint was written; the run exits 0."""


def exit_on_user_errors(main_fn):
    """Wraps an absl `main(argv)`: user errors end with one line on stderr and exit status 2, a non-finite loss
    with one line and status 1, and a requested stop (checkpoint written) with one line and status 0."""

    def wrapped(argv):
        try:
            return main_fn(argv)
        except (UsageError, EnvError, CheckpointError, DatasetMismatchError) as e:
            print(f'error: {e}', file=sys.stderr, flush=True)
            sys.exit(2)
        except NonFiniteError as e:
            print(f'error: {e}', file=sys.stderr, flush=True)
            sys.exit(1)
        except StopTraining as e:
            print(str(e), file=sys.stderr, flush=True)
            sys.exit(0)

    return wrapped


def check_flags(flags_obj, int_at_least, proportions=()):
    """Refuses flags below their minimum (`{name: minimum}`) and proportions outside (0, 1]."""
    for name, minimum in int_at_least.items():
        value = getattr(flags_obj, name)
        if value is None or value < minimum:
            raise UsageError(f'--{name} must be >= {minimum}, got {value}')
    for name in proportions:
        value = getattr(flags_obj, name)
        if not 0.0 < value <= 1.0:
            raise UsageError(f'--{name} must be in (0, 1], got {value}')


def _given_on_command_line(name, argv):
    return any(arg == f'--{name}' or arg.startswith(f'--{name}=') for arg in argv)


def resolve_agent_config(config, flags_obj, argv):
    """The agent config with `horizon_length` and `discount` taken from the driver flags (one source of truth).

    `--agent.horizon_length` / `--agent.discount` are accepted when the driver flag is not given, and refused when
    both are given with different values.
    """
    config = config.copy_and_resolve_references()
    for name in ('horizon_length', 'discount'):
        flag_value = getattr(flags_obj, name)
        if _given_on_command_line(f'agent.{name}', argv):
            if _given_on_command_line(name, argv) and config[name] != flag_value:
                raise UsageError(
                    f'--{name}={flag_value} and --agent.{name}={config[name]} disagree; give only --{name}'
                )
            continue
        config[name] = flag_value
    if config['horizon_length'] is None or config['horizon_length'] < 1:
        raise UsageError(f'--horizon_length must be >= 1, got {config["horizon_length"]}')
    return config


def sparsify_rewards(rewards):
    """Sparse rewards of the paper's scene/puzzle runs: -1 on every step that is not a success step, else 0."""
    return (np.asarray(rewards) != 0.0) * -1.0


def process_dataset(dataset, dataset_proportion=1.0, sparse=False, compact=True):
    """Keeps the first `dataset_proportion` of the transitions, optionally sparsifies the rewards, and (by default)
    stores each observation once; the sampled batches are the same either way."""
    if compact and not dataset.compact:
        rebuilt = Dataset.create(frame_stack=dataset.frame_stack, p_aug=dataset.p_aug, compact=True, **dict(dataset))
        rebuilt.rng.bit_generator.state = dataset.rng.bit_generator.state
        dataset = rebuilt
    if dataset_proportion < 1.0:
        dataset = dataset.take_first(int(dataset.size * dataset_proportion))
    if sparse:
        dataset = dataset.copy(add_or_replace=dict(rewards=sparsify_rewards(dataset['rewards']).astype(np.float32)))
    return dataset


def create_agent(agent_classes, config, seed, dataset):
    """Builds the agent named by `config.agent_name` from example observations/actions of `dataset`."""
    name = config.get('agent_name')
    if name not in agent_classes:
        raise UsageError(f'unknown agent_name {name!r} in the agent config; known: {", ".join(sorted(agent_classes))}')
    example = dataset.sample(1)
    try:
        return agent_classes[name].create(seed, example['observations'], example['actions'], config)
    except ValueError as e:
        raise UsageError(str(e)) from e


def is_eval_step(step, last_step, eval_interval):
    """Evaluate every `eval_interval` steps and once after the last step of a phase (never twice on one step)."""
    return step == last_step or (eval_interval > 0 and step % eval_interval == 0)


def every(step, interval):
    """True on multiples of a positive `interval`."""
    return interval > 0 and step % interval == 0


def block_end(step, max_steps, last_step, intervals=(), before=()):
    """Last step of a block of at most `max_steps` updates that follows `step`.

    The block never runs past `last_step` or the next multiple of any positive interval in `intervals` (steps that
    log, save or evaluate end a block), and stops just before the next multiple of any positive interval in
    `before` (steps that must begin a block, such as a dataset shard change).
    """
    first = step + 1
    end = min(step + max_steps, last_step)
    for interval in intervals:
        if interval > 0:
            end = min(end, -(-first // interval) * interval)
    for interval in before:
        if interval > 0:
            end = min(end, (first // interval + 1) * interval - 1)
    return max(end, first)


@jax.jit
def fused_updates(agent, batches):
    """Runs `agent.update` over the leading axis of `batches` in one compiled scan; returns the last step's info.

    Same update sequence as calling `update` once per batch, without a host round trip per update.
    """
    agent, infos = jax.lax.scan(lambda a, b: a.update(b), agent, batches)
    return agent, jax.tree_util.tree_map(lambda x: x[-1], infos)


def stack_batches(batches):
    """Stacks a list of batches (dicts of arrays) into one with a leading axis."""
    return {k: np.stack([b[k] for b in batches]) for k in batches[0]}


class OnlineActor:
    """Acts in an environment with open-loop action chunks and turns each step into a replay transition.

    A new chunk is sampled only when the action queue is empty; the queue is cleared whenever an episode ends.
    With `state_fn`, `last_state` holds the simulator state each step reached, taken before any reset.
    """

    def __init__(self, env, action_dim, seed, reward_fn=None, state_fn=None):
        self.env = env
        self.action_dim = action_dim
        self.reward_fn = reward_fn
        self.state_fn = state_fn
        self.last_state = None
        self.rng = jax.random.PRNGKey(seed)
        self.queue = []
        self.observation, _ = env.reset()

    def _next_action(self, agent):
        if not self.queue:
            self.rng, key = jax.random.split(self.rng)
            chunk = np.asarray(agent.sample_actions(observations=self.observation, rng=key))
            self.queue = list(chunk.reshape(-1, self.action_dim))
        return self.queue.pop(0)

    def random_action(self, rng):
        """A uniform random action in [-1, 1] (used before training starts)."""
        return rng.uniform(-1.0, 1.0, size=self.action_dim).astype(np.float32)

    def step(self, agent=None, action=None):
        """Takes one env step with `action`, or with the agent's queued chunk. Returns (transition, info, done)."""
        if action is None:
            action = self._next_action(agent)
        next_observation, reward, terminated, truncated, info = self.env.step(np.clip(action, -1.0, 1.0))
        if self.state_fn is not None:
            self.last_state = self.state_fn(self.env)
        if self.reward_fn is not None:
            reward = self.reward_fn(reward)
        done = terminated or truncated
        transition = dict(
            observations=self.observation,
            actions=np.asarray(action, dtype=np.float32),
            rewards=np.float32(reward),
            terminals=np.float32(done),
            masks=np.float32(1.0 - terminated),
            next_observations=next_observation,
        )
        if done:
            self.observation, _ = self.env.reset()
            self.queue = []
        else:
            self.observation = next_observation
        return transition, info, done


def episode_metrics(info):
    """Scalar episode statistics from the EpisodeMonitor's `info['episode']` (return, length, success)."""
    return {f'episode.{k}': float(v) for k, v in info.get('episode', {}).items() if np.ndim(v) == 0}


def mean_metrics(rows):
    """Per-key means of a list of metric dicts, plus `episodes`, the number of rows."""
    keys = {k for row in rows for k in row}
    means = {k: float(np.mean([row[k] for row in rows if k in row])) for k in sorted(keys)}
    means['episodes'] = len(rows)
    return means


def scalar_info(info):
    """Python floats of a JAX/NumPy info dict (one device-to-host transfer)."""
    return {k: float(v) for k, v in jax.device_get(info).items()}


def run_dir_for(save_dir, run_group, exp_name):
    """The directory `save_dir/run_group/exp_name` (empty parts skipped), created; refuses an unwritable location."""
    run_dir = os.path.join(save_dir, *(p for p in (run_group, exp_name) if p))
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f'cannot create the run directory {run_dir} ({e.strerror}); choose another --save_dir') from e
    if not os.access(run_dir, os.W_OK):
        raise UsageError(f'the run directory {run_dir} is not writable; choose another --save_dir')
    return run_dir


def define_flags(offline, buffer_size, agent_file):
    """Defines the drivers' absl flags (the reference's names and defaults); `offline` adds the offline-phase ones."""
    flags.DEFINE_string('run_group', 'Debug', 'Run group (folder under save_dir and wandb group).')
    flags.DEFINE_integer('seed', 0, 'Random seed.')
    flags.DEFINE_string('env_name', 'cube-triple-play-singletask-task2-v0', 'Environment (and dataset) name.')
    flags.DEFINE_string('save_dir', 'exp/', 'Where run directories are created.')
    flags.DEFINE_string('dataset_dir', None, 'Dataset location (default per family, e.g. ~/.ogbench/data).')
    if offline:
        flags.DEFINE_integer('offline_steps', 1000000, 'Offline gradient steps.')
        flags.DEFINE_integer('fused_steps', 100, 'Offline updates per compiled call (1: one call per update).')
    flags.DEFINE_integer('online_steps', 1000000, 'Online environment steps.')
    flags.DEFINE_integer('buffer_size', buffer_size, 'Replay buffer capacity.')
    flags.DEFINE_integer('log_interval', 5000, 'Steps between training-metric logs.')
    flags.DEFINE_integer('eval_interval', 100000, 'Steps between evaluations (0: only at the end of each phase).')
    flags.DEFINE_integer('save_interval', -1, 'Steps between checkpoints (<= 0: none).')
    flags.DEFINE_integer('start_training', 5000, 'Online step from which the agent is updated.')
    flags.DEFINE_integer('utd_ratio', 1, 'Updates per online environment step (fused into one batch_update).')
    flags.DEFINE_float('discount', 0.99, 'Discount factor (also sets the agent config).')
    flags.DEFINE_integer('eval_episodes', 50, 'Evaluation episodes.')
    flags.DEFINE_integer('video_episodes', 0, 'Rendered evaluation episodes.')
    flags.DEFINE_integer('video_frame_skip', 3, 'Keep one rendered frame every this many steps.')
    flags.DEFINE_integer('eval_envs', 10, 'Environment copies stepped in lockstep during evaluation (1: sequential).')
    flags.DEFINE_float('dataset_proportion', 1.0, 'Fraction of the offline dataset to use (its first transitions).')
    if offline:
        flags.DEFINE_integer('dataset_replace_interval', 1000, 'Offline steps between dataset shards.')
        flags.DEFINE_string('ogbench_dataset_dir', None, 'Folder of OGBench dataset shards (*.npz) to cycle through.')
    flags.DEFINE_integer('horizon_length', 5, 'Action chunk length H (also sets the agent config).')
    flags.DEFINE_bool('sparse', False, 'Sparse rewards: -1 on every non-success step (scene, puzzle).')
    flags.DEFINE_bool('save_all_online_states', False, 'Save qpos/qvel (and button states) of every online step.')
    flags.DEFINE_string('exp_name', None, 'Run directory name under save_dir/run_group (default: a unique name).')
    flags.DEFINE_bool('resume', False, 'Continue the run --exp_name from its latest checkpoint (fresh start if none).')
    flags.DEFINE_integer('keep_checkpoints', 3, 'Full training checkpoints kept in <run_dir>/checkpoints.')
    flags.DEFINE_float('max_runtime', 0, 'Seconds after which the run checkpoints and exits cleanly (0: no limit).')
    config_flags.DEFINE_config_file('agent', agent_file, lock_config=False)


class Trainer:
    """One run: flags checked, run directory, environments, data, agent, loggers, checkpoints, training phases.

    Full checkpoints (agent with optimizer state and key, data and action generators, replay buffer, counters) go
    to `<run_dir>/checkpoints` every `save_interval` steps and when a stop is requested; `--resume` continues from
    the newest valid one. Params-only `params_<step>.pkl` files are written beside them for notebooks.
    """

    def __init__(self, flags_obj, argv, agent_classes):
        self.flags = f = flags_obj
        minimums = dict(
            online_steps=0, buffer_size=1, log_interval=1, eval_interval=0, start_training=0, utd_ratio=1,
            eval_episodes=0, video_episodes=0, video_frame_skip=1, horizon_length=1, offline_steps=0,
            dataset_replace_interval=0, fused_steps=1, eval_envs=1, keep_checkpoints=1,
        )  # fmt: skip
        check_flags(f, {k: v for k, v in minimums.items() if k in f}, proportions=('dataset_proportion',))
        if f.max_runtime < 0:
            raise UsageError(f'--max_runtime must be >= 0, got {f.max_runtime}')
        if f.resume and not f.exp_name:
            raise UsageError('--resume needs --exp_name, the name of the run directory to continue')
        self.config = resolve_agent_config(f.agent, f, argv)
        for name in ('dataset_dir', 'ogbench_dataset_dir'):
            path = getattr(f, name, None)
            if path is not None and not os.path.isdir(path):
                raise UsageError(f'--{name} {path} is not a directory')

        group_dir = run_dir_for(f.save_dir, f.run_group, '')  # Fails early on an unwritable save_dir.
        self.exp_name = f.exp_name or get_exp_name(f.seed, env_name=f.env_name)
        self.run_dir = os.path.join(group_dir, self.exp_name)
        checkpoint_dir = os.path.join(self.run_dir, 'checkpoints')
        if not f.resume and checkpoint_steps(checkpoint_dir):
            raise UsageError(
                f'{self.run_dir} already holds checkpoints; add --resume to continue it, or pick another --exp_name'
            )

        shard_dir = getattr(f, 'ogbench_dataset_dir', None)
        self.env, self.eval_env, dataset, _ = make_env_and_datasets(
            f.env_name, dataset_dir=f.dataset_dir, ogbench_dataset_dir=shard_dir, seed=f.seed
        )
        check_dataset_matches_env(dataset, self.env)
        self.shards = None
        if shard_dir is not None:
            from envs.ogbench_utils import OGBenchShardCycler

            self.shards = OGBenchShardCycler(f.env_name, shard_dir, seed=f.seed)
        num_eval_envs = min(f.eval_envs, f.eval_episodes + f.video_episodes)
        self.eval_envs = None
        if num_eval_envs > 1:
            extra = make_eval_envs(f.env_name, num_eval_envs - 1, dataset_dir=f.dataset_dir, seed=f.seed)
            self.eval_envs = [self.eval_env, *extra]
        self.train_dataset = process_dataset(dataset, f.dataset_proportion, f.sparse)
        self.agent = create_agent(agent_classes, self.config, f.seed, self.train_dataset)
        self.action_dim = self.train_dataset['actions'].shape[-1]

        self.log_step = 0
        self.postfix = {}
        self.phase_times = {}
        self.resume_state = None
        # The run directory is made only once everything above was accepted.
        self._check_disk()
        self.checkpoints = CheckpointManager(checkpoint_dir, keep=f.keep_checkpoints)
        if f.resume:
            loaded = self.checkpoints.load_latest()
            if loaded is None:
                print(f'No checkpoint in {checkpoint_dir}; starting {self.exp_name} from scratch.', flush=True)
            else:
                self._restore(loaded[0])
        self._open_logs()
        self.stop = StopRequest(max_runtime=f.max_runtime or None)

    def _check_disk(self):
        """Refuses to start when the disk cannot hold `keep + 1` checkpoints (agent, plus a full replay buffer when
        there is an online phase)."""
        per_checkpoint = sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(self.agent))
        if self.flags.online_steps > 0:
            per_checkpoint += self.train_dataset.transition_nbytes() * self.flags.buffer_size
        check_disk_space(self.run_dir, (self.flags.keep_checkpoints + 1) * per_checkpoint, 'checkpoints')

    def _open_logs(self):
        f = self.flags
        run_dir_for(self.run_dir, '', '')
        flag_dict = get_flag_dict()
        flag_dict['agent'] = self.config.to_dict()
        save_flags(self.run_dir, flag_dict)
        if self.resume_state is not None:
            # Rows logged after the checkpoint are logged again by the resumed run.
            for name in os.listdir(self.run_dir):
                if name.endswith('.csv'):
                    drop_rows_after(os.path.join(self.run_dir, name), self.log_step)
        run_id = None if self.resume_state is None else self.resume_state.get('wandb_id')
        self.wandb_run = setup_wandb(
            project='qc', group=f.run_group, name=self.exp_name, config=flag_dict, dir=self.run_dir, run_id=run_id
        )
        self.loggers = Loggers(self.run_dir, wandb_run=self.wandb_run)

    def _restore(self, state):
        """Restores what every phase shares; the phase loops restore their own part from `resume_state`."""
        self.resume_state = state
        self.agent = flax.serialization.from_state_dict(self.agent, state['agent'])
        self.log_step = state['log_step']
        self.phase_times = dict(state['phase_times'])
        if self.shards is not None and state.get('shard_index') is not None:
            shard = self.shards.seek(state['shard_index'])
            self.train_dataset = process_dataset(shard, self.flags.dataset_proportion, self.flags.sparse)
        self.train_dataset.rng.bit_generator.state = state['dataset_rng']
        print(f'Resuming {self.exp_name} at step {self.log_step} ({state["phase"]} phase).', flush=True)

    def _resume_point(self, phase):
        """Steps of `phase` already done: 0 for a fresh phase, None for one a resumed run has already finished."""
        state = self.resume_state
        if state is None:
            return 0
        if state['phase'] == phase:
            return state['phase_step']
        order = ('offline', 'online')
        return None if order.index(state['phase']) > order.index(phase) else 0

    def save_checkpoint(self, phase, step, online=None):
        """Writes a full checkpoint at the end of `step` of `phase`; `online` holds the online loop's state."""
        # Never write non-finite parameters: the previous checkpoint stays the last good one.
        check_finite({}, self.log_step, params=self.agent.network.params, last_checkpoint=self.checkpoints.last_path)
        state = dict(
            phase=phase,
            phase_step=step,
            log_step=self.log_step,
            agent=jax.device_get(flax.serialization.to_state_dict(self.agent)),
            dataset_rng=self.train_dataset.rng.bit_generator.state,
            shard_index=None if self.shards is None else self.shards.index,
            phase_times=dict(self.phase_times),
            wandb_id=None if self.wandb_run is None else self.wandb_run.id,
            online=online,
        )
        return self.checkpoints.save(state, self.log_step)

    def sample_dataset_chunks(self, batch_size):
        """Chunks of the (processed) offline dataset at the config's horizon and discount."""
        return self.train_dataset.sample_sequence(batch_size, self.config['horizon_length'], self.config['discount'])

    def evaluate(self):
        """Evaluates the current agent (seeds fixed per run, independent of the step) and logs `eval`."""
        f = self.flags
        stats, _, renders = evaluate(
            self.agent,
            self.eval_env,
            self.action_dim,
            num_eval_episodes=f.eval_episodes,
            num_video_episodes=f.video_episodes,
            video_frame_skip=f.video_frame_skip,
            seed=f.seed * 100_000,
            record_trajectories=False,
            envs=self.eval_envs,
        )
        self.loggers.log('eval', stats, self.log_step)
        if renders:
            self.loggers.log_video('eval', renders, self.log_step)
        self.postfix['eval_success'] = stats.get('success', float('nan'))
        return stats

    def _after_step(self, phase, i, last_step, info, phase_start, bar, online_state=None):
        """Logging, evaluation, checkpoints and stop requests at the end of step `i` of `phase`.

        The checkpoint comes last, so everything a step logs is on disk before a checkpoint says the step is done.
        """
        f = self.flags
        if info is not None and every(i, f.log_interval):
            info = scalar_info(info)
            check_finite(info, self.log_step, last_checkpoint=self.checkpoints.last_path)
            info['time/total'] = time.time() - phase_start
            self.loggers.log(f'{phase}_agent', info, self.log_step)
            self.postfix.update(critic=info.get('critic/critic_loss'), actor=info.get('actor/actor_loss'))
            bar.set_postfix(self.postfix, refresh=False)
        if is_eval_step(i, last_step, f.eval_interval):
            self.evaluate()
            bar.set_postfix(self.postfix, refresh=False)
        stopping = self.stop.should_stop()
        if every(i, f.save_interval):
            save_agent(self.agent, self.run_dir, self.log_step)
        if every(i, f.save_interval) or stopping:
            self.phase_times[f'{phase}_time'] = time.time() - phase_start
            self.save_checkpoint(phase, i, online=online_state() if online_state else None)
        if stopping:
            self.finish(quiet=True)
            raise StopTraining(
                f'Stopped at step {self.log_step} ({self.stop.reason}); checkpoint written. Continue with: '
                f'--exp_name={self.exp_name} --resume'
            )

    def offline_phase(self):
        """`offline_steps` updates on dataset chunks, cycling dataset shards when given.

        Updates run in blocks of up to `fused_steps` per compiled call (`fused_updates`) on batches sampled in the
        same order as one update per step; blocks end on every step that logs, saves or evaluates, so those
        happen exactly where the flags put them. `--fused_steps=1` is the reference's one-call-per-update loop.
        """
        f = self.flags
        i = self._resume_point('offline')
        if i is None:
            return
        phase_start = time.time() - self.phase_times.get('offline_time', 0.0)
        batch_size = self.config['batch_size']
        # Cap the pre-sampled block so its host copy stays small (image observations); a sampled chunk holds about
        # two copies of every field per step.
        chunk_bytes = 2 * self.config['horizon_length'] * self.train_dataset.transition_nbytes()
        max_block = max(1, min(f.fused_steps, FUSED_BLOCK_BYTES // (chunk_bytes * batch_size)))
        replace_interval = f.dataset_replace_interval if self.shards is not None else 0
        bar = tqdm.tqdm(
            total=f.offline_steps, initial=i, desc='offline', dynamic_ncols=True, disable=f.offline_steps == 0
        )
        try:
            while i < f.offline_steps:
                if every(i + 1, replace_interval):
                    self.train_dataset = process_dataset(self.shards.next(), f.dataset_proportion, f.sparse)
                end = block_end(
                    i,
                    max_block,
                    f.offline_steps,
                    (f.log_interval, f.save_interval, f.eval_interval),
                    before=(replace_interval,),
                )
                batches = [self.sample_dataset_chunks(batch_size) for _ in range(end - i)]
                if max_block == 1:
                    self.agent, info = self.agent.update(batches[0])
                else:
                    self.agent, info = fused_updates(self.agent, stack_batches(batches))
                self.log_step += end - i
                bar.update(end - i)
                i = end
                # One small transfer per block: a NaN stops the run before it reaches a log row or a checkpoint.
                info = scalar_info(info)
                check_finite(info, self.log_step, last_checkpoint=self.checkpoints.last_path)
                self._after_step('offline', i, f.offline_steps, info, phase_start, bar)
        finally:
            bar.close()
        self.phase_times['offline_time'] = time.time() - phase_start

    def online_phase(self, replay_buffer, sample_batch, random_steps=0):
        """`online_steps` environment steps with open-loop chunks, adding every transition to `replay_buffer`.

        From `start_training` on, each step runs `utd_ratio` updates fused in one `batch_update` on
        `sample_batch()`, whose leaves are shaped (utd_ratio, batch_size, ...). The first `random_steps` steps take
        uniform random actions. A resumed run restores the buffer and generators and starts a new episode.
        """
        f = self.flags
        start = self._resume_point('online')
        if start is None:
            return
        actor = OnlineActor(
            self.env,
            self.action_dim,
            seed=f.seed,
            reward_fn=sparsify_rewards if f.sparse else None,
            state_fn=get_env_state if f.save_all_online_states else None,
        )
        action_rng = np.random.default_rng(f.seed)
        finished_episodes = []  # Episode statistics since the last `env` log row.
        states = dict(steps=[], qpos=[], qvel=[], button_states=[])
        if start > 0:
            saved = self.resume_state['online']
            replay_buffer.load_state(saved['buffer'])
            actor.rng = jax.numpy.asarray(saved['actor_rng'])
            action_rng.bit_generator.state = saved['action_rng']
            finished_episodes = list(saved['finished_episodes'])
            states = {k: list(v) for k, v in saved['states'].items()}

        def online_state():
            return dict(
                buffer=replay_buffer.state_dict(),
                actor_rng=np.asarray(actor.rng),
                action_rng=action_rng.bit_generator.state,
                finished_episodes=list(finished_episodes),
                states=states,
            )

        phase_start = time.time() - self.phase_times.get('online_time', 0.0)
        bar = tqdm.trange(
            start + 1, f.online_steps + 1, initial=start, total=f.online_steps, desc='online', dynamic_ncols=True,
            disable=f.online_steps == 0,
        )  # fmt: skip
        try:
            for i in bar:
                self.log_step += 1
                action = actor.random_action(action_rng) if i <= random_steps else None
                transition, info, done = actor.step(self.agent, action=action)
                replay_buffer.add_transition(transition)
                if f.save_all_online_states:
                    states['steps'].append(i)
                    for key, value in actor.last_state.items():
                        states[key].append(value)
                if done:
                    finished_episodes.append(episode_metrics(info))
                if finished_episodes and every(i, f.log_interval):
                    self.loggers.log('env', mean_metrics(finished_episodes), self.log_step)
                    finished_episodes = []
                update_info = None
                if i >= f.start_training:
                    self.agent, update_info = self.agent.batch_update(sample_batch())
                self._after_step('online', i, f.online_steps, update_info, phase_start, bar, online_state=online_state)
        finally:
            bar.close()
        self.phase_times['online_time'] = time.time() - phase_start
        if f.save_all_online_states and states['steps']:
            data = {k: np.stack(v) for k, v in states.items() if v}
            data.update(self.phase_times)
            atomic_write_bytes(os.path.join(self.run_dir, 'data.pkl'), pickle.dumps(data))

    def finish(self, quiet=False):
        """Closes the logs, wandb and the signal handlers; says where the run is."""
        self.stop.close()
        self.loggers.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None
        if not quiet:
            print(f'Run finished: {self.run_dir}', flush=True)


def stack_utd(batch, utd_ratio, batch_size):
    """Reshapes a batch of utd_ratio * batch_size chunks into (utd_ratio, batch_size, ...) leaves."""
    return {k: v.reshape((utd_ratio, batch_size, *v.shape[1:])) for k, v in batch.items()}
