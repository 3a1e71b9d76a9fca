"""One training run, built from a `RunConfig`: run directory, environments, data, agent, logs, checkpoints, phases.

    run = from_flags(FLAGS, sys.argv, PRESET)  # training.config: flags -> a validated RunConfig
    Trainer(run, agents).train()             # offline phase, online phase, final summary

The trainer owns everything it checkpoints: the agent, the offline dataset (and its shard cycler), the replay
buffer, the generators of the online loop and the counters. Full checkpoints go to `<run_dir>/checkpoints` every
`save_interval` steps and when a stop is requested; `--resume` continues from the newest valid one. Params-only
`params_<step>.pkl` files are written beside them for notebooks.
"""

import os
import pickle
import time

import flax
import jax
import numpy as np
import tqdm

from envs.env_state import get_env_state
from envs.env_utils import make_run_envs
from evaluation import evaluate, monitor_stats
from log_utils import Loggers, drop_rows_after, get_exp_name, save_flags, setup_wandb
from training.actor import OnlineActor, episode_row
from training.data import (
    ChunkSampler,
    make_replay_buffer,
    process_dataset,
    replay_capacity,
    source_counts,
    sparsify_rewards,
)
from training.schedule import block_end, every, is_eval_step
from utils.checkpoints import CheckpointManager, check_disk_space, checkpoint_steps
from utils.errors import UsageError, UserError
from utils.flax_utils import save_agent
from utils.guards import StopRequest, check_dataset_matches_env, check_finite
from utils.io_utils import atomic_write_bytes

FUSED_BLOCK_BYTES = 256 * 2**20  # Upper bound on the host memory of one block of pre-sampled offline batches.


class StopTraining(UserError):
    """A requested stop (SIGTERM/SIGINT or `--max_runtime`) after a checkpoint was written; the run exits 0."""

    exit_code = 0
    prefix = ''


def create_agent(agent_classes, config, seed, dataset):
    """Builds the agent named by `config.agent_name` from one example transition of `dataset`."""
    name = config.get('agent_name')
    if name not in agent_classes:
        raise UsageError(f'unknown agent_name {name!r} in the agent config; known: {", ".join(sorted(agent_classes))}')
    example = dataset.example()
    try:
        return agent_classes[name].create(seed, example['observations'], example['actions'], config)
    except ValueError as e:
        raise UsageError(str(e)) from e


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


def seconds_since_process_start():
    """Wall-clock age of this process (Linux `/proc`), or None where it cannot be read."""
    try:
        with open('/proc/self/stat') as f:
            start_ticks = float(f.read().rsplit(')', 1)[1].split()[19])
        with open('/proc/uptime') as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf('SC_CLK_TCK'))
    except (OSError, ValueError, IndexError):
        return None


class Trainer:
    """One run of a `RunConfig` (see the module docstring); `agent_classes` maps `agent_name` to agent classes."""

    def __init__(self, run, agent_classes):
        self.run = run
        self.startup = {'imports': seconds_since_process_start()}  # Seconds per start-up stage, for the summary.
        clock = time.perf_counter()
        group_dir = run_dir_for(run.save_dir, run.run_group, '')  # Fails early on an unwritable save_dir.
        self.exp_name = run.exp_name or get_exp_name(run.seed, env_name=run.env_name)
        self.run_dir = os.path.join(group_dir, self.exp_name)
        checkpoint_dir = os.path.join(self.run_dir, 'checkpoints')
        if not run.resume and checkpoint_steps(checkpoint_dir):
            raise UsageError(
                f'{self.run_dir} already holds checkpoints; add --resume to continue it, or pick another --exp_name'
            )

        envs = make_run_envs(
            run.env_name,
            dataset_dir=run.dataset_dir,
            ogbench_dataset_dir=run.ogbench_dataset_dir,
            seed=run.seed,
            frame_stack=run.frame_stack,
            num_eval_envs=max(1, min(run.eval_envs, run.eval_episodes + run.video_episodes)),
        )
        self.env, self.eval_envs, self.shards = envs.env, envs.eval_envs, envs.shards
        check_dataset_matches_env(envs.train_dataset, self.env, frame_stack=run.frame_stack)
        self.dataset = self._process(envs.train_dataset)
        self.startup['envs and data'] = time.perf_counter() - clock
        clock = time.perf_counter()
        self.agent = create_agent(agent_classes, run.agent, run.seed, self.dataset)
        self.startup['agent'] = time.perf_counter() - clock
        self.action_dim = self.dataset['actions'].shape[-1]
        self.replay = None  # Made by the online phase, from the dataset as it is then (the last shard).

        self.log_step = 0
        self.postfix = {}
        self.phase_times = {}
        self.resume_state = None
        self._created = time.perf_counter()
        # The run directory is made only once everything above was accepted.
        self._check_disk()
        self.checkpoints = CheckpointManager(checkpoint_dir, keep=run.keep_checkpoints)
        if run.resume:
            loaded = self.checkpoints.load_latest()
            if loaded is None:
                print(f'No checkpoint in {checkpoint_dir}; starting {self.exp_name} from scratch.', flush=True)
            else:
                self._restore(loaded[0])
        self._open_logs()
        self.stop = StopRequest(max_runtime=run.max_runtime or None)

    def _process(self, dataset):
        run = self.run
        return process_dataset(
            dataset, run.dataset_proportion, run.sparse, frame_stack=run.frame_stack, p_aug=run.p_aug
        )

    def _check_disk(self):
        """Refuses to start when the disk cannot hold `keep + 1` checkpoints (agent, plus a full replay buffer when
        there is an online phase)."""
        per_checkpoint = sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(self.agent))
        if self.run.online_steps > 0:
            per_checkpoint += self.dataset.transition_nbytes() * replay_capacity(self.run, self.dataset)
        check_disk_space(self.run_dir, (self.run.keep_checkpoints + 1) * per_checkpoint, 'checkpoints')

    def _open_logs(self):
        run_dir_for(self.run_dir, '', '')
        save_flags(self.run_dir, self.run.flag_record)
        if self.resume_state is not None:
            # Rows logged after the checkpoint are logged again by the resumed run.
            for name in os.listdir(self.run_dir):
                if name.endswith('.csv'):
                    drop_rows_after(os.path.join(self.run_dir, name), self.log_step)
        run_id = None if self.resume_state is None else self.resume_state.get('wandb_id')
        self.wandb_run = setup_wandb(
            project='qc',
            group=self.run.run_group,
            name=self.exp_name,
            config=self.run.flag_record,
            dir=self.run_dir,
            run_id=run_id,
        )
        self.loggers = Loggers(self.run_dir, wandb_run=self.wandb_run)

    def _restore(self, state):
        """Restores what every phase shares; the online phase restores its own part from `resume_state`."""
        self.resume_state = state
        self.agent = flax.serialization.from_state_dict(self.agent, state['agent'])
        self.log_step = state['log_step']
        self.phase_times = dict(state['phase_times'])
        if self.shards is not None and state.get('shard_index') is not None:
            self.dataset = self._process(self.shards.seek(state['shard_index']))
        self.dataset.rng.bit_generator.state = state['dataset_rng']
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
            dataset_rng=self.dataset.rng.bit_generator.state,
            shard_index=None if self.shards is None else self.shards.index,
            phase_times=dict(self.phase_times),
            wandb_id=None if self.wandb_run is None else self.wandb_run.id,
            online=online,
        )
        return self.checkpoints.save(state, self.log_step)

    def evaluate(self):
        """Evaluates the current agent (seeds fixed per run, independent of the step) and logs `eval`."""
        run = self.run
        stats, _, renders = evaluate(
            self.agent,
            self.eval_envs[0],
            self.action_dim,
            num_eval_episodes=run.eval_episodes,
            num_video_episodes=run.video_episodes,
            video_frame_skip=run.video_frame_skip,
            seed=run.seed * 100_000,
            record_trajectories=False,
            envs=self.eval_envs if len(self.eval_envs) > 1 else None,
        )
        self.loggers.log('eval', stats, self.log_step)
        if renders:
            self.loggers.log_video('eval', renders, self.log_step)
        self.postfix['eval_success'] = stats.get('success', float('nan'))
        return stats

    def _first_update_done(self):
        if 'first update' not in self.startup:
            self.startup['first update'] = time.perf_counter() - self._created

    def _after_step(self, phase, i, last_step, info, phase_start, bar, online_state=None):
        """Logging, evaluation, checkpoints and stop requests at the end of step `i` of `phase`.

        The checkpoint comes last, so everything a step logs is on disk before a checkpoint says the step is done.
        """
        run = self.run
        if info is not None and every(i, run.log_interval):
            info = scalar_info(info)
            check_finite(info, self.log_step, last_checkpoint=self.checkpoints.last_path)
            info['time/total'] = time.time() - phase_start
            self.loggers.log(f'{phase}_agent', info, self.log_step)
            self.postfix.update(critic=info.get('critic/critic_loss'), actor=info.get('actor/actor_loss'))
            bar.set_postfix(self.postfix, refresh=False)
        if is_eval_step(i, last_step, run.eval_interval):
            self.evaluate()
            bar.set_postfix(self.postfix, refresh=False)
        stopping = self.stop.should_stop()
        if every(i, run.save_interval):
            save_agent(self.agent, self.run_dir, self.log_step)
        if every(i, run.save_interval) or stopping:
            self.phase_times[f'{phase}_time'] = time.time() - phase_start
            self.save_checkpoint(phase, i, online=online_state() if online_state else None)
        if stopping:
            self.finish(quiet=True)
            raise StopTraining(
                f'Stopped at step {self.log_step} ({self.stop.reason}); checkpoint written. Continue with: '
                f'--exp_name={self.exp_name} --resume'
            )

    def train(self):
        """The offline phase, then the online phase (when `online_steps > 0`), then the summary."""
        self.offline_phase()
        if self.run.online_steps > 0:
            self.online_phase()
        self.finish()

    def offline_phase(self):
        """`offline_steps` updates on dataset chunks, cycling dataset shards when given.

        Updates run in blocks of up to `fused_steps` per compiled call (`batch_update`) on batches sampled in the
        same order as one update per step; blocks end on every step that logs, saves or evaluates, so those happen
        exactly where the flags put them. `--fused_steps=1` is the reference's one-call-per-update loop.
        """
        run = self.run
        i = self._resume_point('offline')
        if i is None:
            return
        phase_start = time.time() - self.phase_times.get('offline_time', 0.0)
        sampler = ChunkSampler([('data', self.dataset, run.batch_size)], run.horizon_length, run.discount)
        # Cap the pre-sampled block so its host copy stays small (image observations): a chunk holds the first
        # observation and the H next observations, besides the smaller fields.
        chunk_bytes = (run.horizon_length + 1) * self.dataset.transition_nbytes()
        max_block = max(1, min(run.fused_steps, FUSED_BLOCK_BYTES // (chunk_bytes * run.batch_size)))
        replace_interval = run.dataset_replace_interval if self.shards is not None else 0
        bar = tqdm.tqdm(
            total=run.offline_steps, initial=i, desc='offline', dynamic_ncols=True, disable=run.offline_steps == 0
        )
        try:
            while i < run.offline_steps:
                if every(i + 1, replace_interval):
                    self.dataset = self._process(self.shards.next())
                    sampler.set_source('data', self.dataset)
                end = block_end(
                    i,
                    max_block,
                    run.offline_steps,
                    (run.log_interval, run.save_interval, run.eval_interval),
                    before=(replace_interval,),
                )
                batch = sampler.sample_block(end - i)  # (U, B, ...)
                if max_block == 1:
                    self.agent, info = self.agent.update({k: v[0] for k, v in batch.items()})
                else:
                    self.agent, info = self.agent.batch_update(batch)
                self.log_step += end - i
                bar.update(end - i)
                i = end
                # One small transfer per block: a NaN stops the run before it reaches a log row or a checkpoint.
                info = scalar_info(info)
                self._first_update_done()
                check_finite(info, self.log_step, last_checkpoint=self.checkpoints.last_path)
                self._after_step('offline', i, run.offline_steps, info, phase_start, bar)
        finally:
            bar.close()
        self.phase_times['offline_time'] = time.time() - phase_start

    def online_phase(self):
        """`online_steps` environment steps with open-loop chunks, adding every transition to the replay buffer.

        From `start_training` on, each step runs `utd_ratio` updates fused in one `batch_update` on a
        (utd_ratio, batch_size, ...) batch of the chunk sampler (replay only, or data and replay, per the preset).
        The first `run.random_steps` steps take uniform random actions. A resumed run restores the buffer and
        generators and starts a new episode.
        """
        run = self.run
        start = self._resume_point('online')
        if start is None:
            return
        self.replay = make_replay_buffer(run, self.dataset)
        data_count, replay_count = source_counts(run.batch_size, run.preset.online_data_fraction)
        sampler = ChunkSampler(
            [('data', self.dataset, data_count), ('replay', self.replay, replay_count)],
            run.horizon_length,
            run.discount,
        )
        actor = OnlineActor(
            self.env,
            self.action_dim,
            seed=run.seed,
            reward_fn=sparsify_rewards if run.sparse else None,
            state_fn=get_env_state if run.save_all_online_states else None,
            frame_dim=self.dataset['observations'].shape[-1] if run.frame_stack else None,
        )
        action_rng = np.random.default_rng(run.seed)
        finished_episodes = []  # `monitor_stats` of the episodes since the last `env` log row.
        states = dict(steps=[], qpos=[], qvel=[], button_states=[])
        if start > 0:
            saved = self.resume_state['online']
            self.replay.load_state(saved['buffer'])
            actor.rng = jax.numpy.asarray(saved['actor_rng'])
            action_rng.bit_generator.state = saved['action_rng']
            finished_episodes = list(saved['finished_episodes'])
            states = {k: list(v) for k, v in saved['states'].items()}

        def online_state():
            return dict(
                buffer=self.replay.state_dict(),
                actor_rng=np.asarray(actor.rng),
                action_rng=action_rng.bit_generator.state,
                finished_episodes=list(finished_episodes),
                states=states,
            )

        phase_start = time.time() - self.phase_times.get('online_time', 0.0)
        bar = tqdm.trange(
            start + 1, run.online_steps + 1, initial=start, total=run.online_steps, desc='online', dynamic_ncols=True,
            disable=run.online_steps == 0,
        )  # fmt: skip
        try:
            for i in bar:
                self.log_step += 1
                action = actor.random_action(action_rng) if i <= run.random_steps else None
                transition, info, done = actor.step(self.agent, action=action)
                self.replay.add_transition(transition)
                if run.save_all_online_states:
                    states['steps'].append(i)
                    for key, value in actor.last_state.items():
                        states[key].append(value)
                if done:
                    finished_episodes.append(monitor_stats(info))
                if finished_episodes and every(i, run.log_interval):
                    self.loggers.log('env', episode_row(finished_episodes), self.log_step)
                    finished_episodes = []
                update_info = None
                if i >= run.start_training:
                    self.agent, update_info = self.agent.batch_update(sampler.sample(run.utd_ratio))
                    self._first_update_done()
                self._after_step(
                    'online', i, run.online_steps, update_info, phase_start, bar, online_state=online_state
                )
        finally:
            bar.close()
        self.phase_times['online_time'] = time.time() - phase_start
        if run.save_all_online_states and states['steps']:
            data = {k: np.stack(v) for k, v in states.items() if v}
            data.update(self.phase_times)
            atomic_write_bytes(os.path.join(self.run_dir, 'data.pkl'), pickle.dumps(data))

    def startup_line(self):
        """Where start-up time went, e.g. 'start-up: imports 4.1 s, envs and data 1.2 s, agent 0.8 s, ...'."""
        parts = [f'{name} {seconds:.1f} s' for name, seconds in self.startup.items() if seconds is not None]
        return 'start-up: ' + ', '.join(parts)

    def finish(self, quiet=False):
        """Closes the logs, wandb and the signal handlers; says where the run is and where start-up time went."""
        self.stop.close()
        self.loggers.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None
        if not quiet:
            print(self.startup_line(), flush=True)
            print(f'Run finished: {self.run_dir}', flush=True)
