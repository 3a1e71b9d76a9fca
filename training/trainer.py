"""One training run, built from a `RunConfig`: run directories, environments, data, agents, logs, checkpoints, phases.

    run = from_flags(FLAGS, sys.argv, PRESET)  # training.config: flags -> a validated RunConfig
    Trainer(run, agents).train()             # offline phase, online phase, final summary

A run trains one seed or several (`--seeds`). Several seeds are one program: the agents are a vmapped
`training.seeds.SeedGroup`, updated and sampled together, while each seed keeps on the host what a run of that seed
alone would have (a `Lane`): its data sampling stream over the one shared offline dataset, environments, action
queue, replay buffer, logs and checkpoints, in its own run directory.

The trainer owns everything it checkpoints: the agents, the offline dataset (and its shard cycler), the replay
buffers, the generators of the online loop and the counters. Full checkpoints go to `<run_dir>/checkpoints` every
`save_interval` steps and when a stop is requested, one per seed; `--resume` continues all seeds from the newest
step every seed has. Params-only `params_<step>.pkl` files are written beside them for notebooks.
"""

import dataclasses
import json
import os
import pickle
import tempfile
import time

import jax
import numpy as np
import tqdm

from envs.common import RENDERING_HINT, DataError, describe_error
from envs.env_state import get_env_state
from envs.env_utils import make_run_envs, make_seed_envs
from envs.gl_backend import rendering_disabled_reason
from evaluation import evaluate, monitor_stats
from log_utils import Loggers, drop_rows_after, get_exp_name, save_flags, setup_wandb
from training.actor import OnlineActor, episode_row, policy_actions
from training.data import (
    ChunkSampler,
    make_replay_buffer,
    process_dataset,
    replay_capacity,
    source_counts,
    sparsify_rewards,
)
from training.schedule import block_end, every, is_eval_step
from training.seeds import SeedGroup
from utils import seeding
from utils.checkpoints import CheckpointManager, check_disk_space, checkpoint_steps
from utils.errors import UsageError, UserError
from utils.flax_utils import save_agent
from utils.guards import NonFiniteError, StopRequest, check_dataset_matches_env, check_finite, non_finite_fields
from utils.io_utils import atomic_write_bytes
from utils.plotting import metric_column, read_csv

FINISHED_FILE = 'finished.json'  # Written into each run directory once its run has trained to the end.
FUSED_BLOCK_BYTES = 256 * 2**20  # Upper bound on the host memory of one block of pre-sampled offline batches.
EVAL_SEED_LIMIT = 2**31  # Episode seeds stay in int32 (32-bit JAX keeps only the low 32 bits of a larger seed).


class StopTraining(UserError):
    """A requested stop (SIGTERM/SIGINT or `--max_runtime`) after a checkpoint was written; the run exits 0."""

    exit_code = 0
    prefix = ''


def create_agents(agent_classes, config, seeds, dataset, chunk='auto'):
    """The `SeedGroup` of `seeds` of the agent named by `config.agent_name`, from one example of `dataset`;
    `chunk` seeds are vmapped together (see `SeedGroup.create`)."""
    name = config.get('agent_name')
    if name not in agent_classes:
        raise UsageError(f'unknown agent_name {name!r} in the agent config; known: {", ".join(sorted(agent_classes))}')
    for key in getattr(agent_classes[name], 'INERT_CONFIG_KEYS', ()):
        if config.get(key) is not None:
            print(
                f'warning: --agent.{key}={config[key]} has no effect ({name} reads no such setting, nor does the '
                'reference; accepted so that reference command lines run)',
                flush=True,
            )
    example = dataset.example()
    try:
        return SeedGroup.create(
            agent_classes[name], seeds, example['observations'], example['actions'], config, chunk=chunk
        )
    except ValueError as e:
        raise UsageError(str(e)) from e


def seed_infos(info, num_seeds):
    """Python-float info dicts, one per seed, of a (S,)-leading JAX info dict (one device-to-host transfer)."""
    host = jax.device_get(info)
    return [{k: float(v[i]) for k, v in host.items()} for i in range(num_seeds)]


def check_chunk_fits(dataset, run):
    """Refuses a dataset shorter than one action chunk (`horizon_length` transitions)."""
    if dataset.size < run.horizon_length:
        source = dataset.source or f'the {run.env_name} dataset'
        raise DataError(
            f'{source}: {dataset.size} transitions, fewer than one action chunk (--horizon_length={run.horizon_length})'
        )


def check_writable(path):
    """Refuses a `path` that could not be created or written, leaving nothing behind: a directory must be
    creatable in its nearest existing ancestor."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        # A directory made and removed at once: permission bits alone miss root on read-only or virtual filesystems.
        os.rmdir(tempfile.mkdtemp(prefix='.qc-write-check-', dir=existing))
    except OSError as e:
        raise UsageError(f'cannot create or write {path} ({existing}: {e.strerror}); choose another --save_dir') from e


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


def seed_exp_names(run):
    """(base name, one run directory name per seed): `--exp_name` (or a unique name) for one seed, and
    `<base>_sd<seed>` for each of several."""
    if run.num_seeds == 1:
        name = run.exp_name or get_exp_name(run.seed, env_name=run.env_name)
        return name, [name]
    base = run.exp_name or get_exp_name('-'.join(map(str, run.seeds)), env_name=run.env_name)
    return base, [f'{base}_sd{s}' for s in run.seeds]


def rendering_problem(env):
    """Why `env` cannot render a video frame here (one phrase), or None when it renders one."""
    reason = rendering_disabled_reason()
    if reason:
        return reason
    try:
        env.reset(seed=0)  # Evaluation episodes reset with their own seeds, so this reset changes none of them.
        frame = env.render()
    except Exception as e:  # Any backend failure (mujoco.FatalError, EGLError, ...) means the same to the user.
        return f'{describe_error(e)}; {RENDERING_HINT}'
    if frame is None:
        return f'{type(env).__name__}.render() returned no frame'
    return None


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


@dataclasses.dataclass
class Lane:
    """What one seed of a run owns on the host, exactly what a single-seed run of `run.seed` would own."""

    run: object  # The single-seed `RunConfig` (`run.for_seed`): its seed and flags.json record.
    exp_name: str
    run_dir: str
    env: object
    eval_envs: list
    dataset: object  # Shares the arrays of the run's dataset; has its own sampling generator.
    eval_rng: object = None  # Draws each evaluation's episode seeds; advances from one evaluation to the next.
    checkpoints: object = None
    loggers: object = None
    wandb_run: object = None
    resume_state: dict = None
    replay: object = None  # Made by the online phase.

    def __post_init__(self):
        if self.eval_rng is None:
            self.eval_rng = seeding.generator(self.seed, 'evaluation')

    @property
    def seed(self):
        return self.run.seed


class Trainer:
    """One run of a `RunConfig` (see the module docstring); `agent_classes` maps `agent_name` to agent classes."""

    def __init__(self, run, agent_classes):
        self.run = run
        self.startup = {'imports': seconds_since_process_start()}  # Seconds per start-up stage, for the summary.
        clock = time.perf_counter()
        group_dir = os.path.join(run.save_dir, run.run_group or '')
        check_writable(group_dir)  # Fails early on an unwritable save_dir; nothing is created before the checks.
        self.exp_name, names = seed_exp_names(run)
        if not run.resume:
            for name in names:
                if checkpoint_steps(os.path.join(group_dir, name, 'checkpoints')):
                    raise UsageError(
                        f'{os.path.join(group_dir, name)} already holds checkpoints; add --resume to continue it, '
                        'or pick another --exp_name'
                    )

        num_eval_envs = max(1, min(run.eval_envs, run.eval_episodes + run.video_episodes))
        envs = make_run_envs(
            run.env_name,
            dataset_dir=run.dataset_dir,
            ogbench_dataset_dir=run.ogbench_dataset_dir,
            seed=run.seed,
            frame_stack=run.frame_stack,
            num_eval_envs=num_eval_envs,
        )
        self.shards = envs.shards
        if run.video_episodes > 0:
            reason = rendering_problem(envs.eval_envs[0])
            if reason:
                # Checked before any update, so a run never trains to its end and then dies at a video.
                print(f'warning: videos are off ({reason}); training goes on as with --video_episodes=0', flush=True)
                run = dataclasses.replace(run, video_episodes=0)
                self.run = run
        check_dataset_matches_env(envs.train_dataset, envs.env, frame_stack=run.frame_stack)
        check_chunk_fits(envs.train_dataset, run)
        dataset = self._process(envs.train_dataset)
        self.lanes = []
        for s, name in zip(run.seeds, names, strict=True):
            if s == run.seed:
                env, eval_envs, lane_dataset = envs.env, envs.eval_envs, dataset
            else:
                env, eval_envs = make_seed_envs(
                    run.env_name, s, num_eval_envs=num_eval_envs, dataset_dir=run.dataset_dir,
                    frame_stack=run.frame_stack,
                )  # fmt: skip
                lane_dataset = dataset.copy()  # Same arrays, own generator seeded like `--seed=s` alone.
                lane_dataset.seed(seeding.stream(s, 'dataset'))
            self.lanes.append(Lane(run.for_seed(s), name, os.path.join(group_dir, name), env, eval_envs, lane_dataset))
        self.startup['envs and data'] = time.perf_counter() - clock
        clock = time.perf_counter()
        self.agents = create_agents(agent_classes, run.agent, run.seeds, dataset, chunk=run.seed_chunk or 'auto')
        self.startup['agent'] = time.perf_counter() - clock
        self.action_dim = dataset['actions'].shape[-1]

        self.log_step = 0
        self.postfix = {}
        self.phase_times = {}
        self.resumed_phase = None
        self._created = time.perf_counter()
        # The run directories are made only once everything above was accepted.
        self._check_disk()
        for lane in self.lanes:
            lane.checkpoints = CheckpointManager(os.path.join(lane.run_dir, 'checkpoints'), keep=run.keep_checkpoints)
        if run.resume:
            self._resume()
        for lane in self.lanes:
            self._open_logs(lane)
        self.stop = StopRequest(max_runtime=run.max_runtime or None)

    # Single-seed views, for tests and notebooks.

    @property
    def agent(self):
        """The first seed's agent."""
        return self.agents.agent(0)

    @property
    def dataset(self):
        """The first seed's offline dataset."""
        return self.lanes[0].dataset

    @property
    def replay(self):
        """The first seed's replay buffer (None before the online phase)."""
        return self.lanes[0].replay

    @property
    def run_dir(self):
        """The first seed's run directory."""
        return self.lanes[0].run_dir

    def _process(self, dataset):
        run = self.run
        return process_dataset(
            dataset, run.dataset_proportion, run.sparse, frame_stack=run.frame_stack, p_aug=run.p_aug
        )

    def _check_disk(self):
        """Refuses to start when the disk cannot hold `keep + 1` checkpoints of every seed (agent, plus the online
        part of a replay buffer when there is an online phase)."""
        per_seed = sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(self.agents.agents))
        per_seed //= self.agents.num_seeds
        if self.run.online_steps > 0:
            # A checkpointed buffer holds the online transitions only (the offline data is the run's dataset).
            rows = min(replay_capacity(self.run, self.dataset), self.run.online_steps)
            per_seed += self.dataset.transition_nbytes() * rows
        needed = (self.run.keep_checkpoints + 1) * per_seed * self.agents.num_seeds
        check_disk_space(self.lanes[0].run_dir, needed, 'checkpoints')

    def _open_logs(self, lane):
        run_dir_for(lane.run_dir, '', '')
        save_flags(lane.run_dir, lane.run.flag_record)
        if lane.resume_state is not None:
            # Rows logged after the checkpoint are logged again by the resumed run.
            for name in os.listdir(lane.run_dir):
                if name.endswith('.csv'):
                    drop_rows_after(os.path.join(lane.run_dir, name), self.log_step)
        lane.wandb_run = setup_wandb(
            project='qc',
            group=self.run.run_group,
            name=lane.exp_name,
            config=lane.run.flag_record,
            dir=lane.run_dir,
            run_id=None if lane.resume_state is None else lane.resume_state.get('wandb_id'),
            several=self.run.num_seeds > 1,
        )
        lane.loggers = Loggers(lane.run_dir, wandb_run=lane.wandb_run)

    def _resume(self):
        """Loads every seed's checkpoint at the newest step all seeds have (a kill between two seeds' files leaves
        some seeds one checkpoint ahead)."""
        loaded = [lane.checkpoints.load_latest() for lane in self.lanes]
        missing = [lane for lane, state in zip(self.lanes, loaded, strict=True) if state is None]
        if len(missing) == len(self.lanes):
            print(f'No checkpoint in {self.lanes[0].checkpoints.directory}; starting {self.exp_name} from scratch.')
            return
        if missing:
            raise UsageError(
                f'seed {missing[0].seed} has no checkpoint in {missing[0].checkpoints.directory} while other seeds '
                'do; resume with the same --seeds as the interrupted run'
            )
        step = min(s for _, s in loaded)
        states = []
        for lane, (state, lane_step) in zip(self.lanes, loaded, strict=True):
            if lane_step > step:
                state, _ = lane.checkpoints.load_latest(max_step=step)
            states.append(state)
        self._restore(states)

    def _restore(self, states):
        """Restores what every phase shares; the online phase restores its own part from each lane's state."""
        self.agents.load_state_dicts([s['agent'] for s in states])
        first = states[0]
        self.log_step = first['log_step']
        self.phase_times = dict(first['phase_times'])
        self.resumed_phase = (first['phase'], first['phase_step'])
        for lane, state in zip(self.lanes, states, strict=True):
            lane.resume_state = state
            if self.shards is not None and state.get('shard_index') is not None:
                lane.dataset = self._process(self.shards.seek(state['shard_index']))
                # The next shard samples with the stream it had before (checkpoints of earlier versions lack it).
                self.shards.loads = state.get('shard_loads', self.shards.loads)
            lane.dataset.rng.bit_generator.state = state['dataset_rng']
            if state.get('eval_rng') is not None:  # absent from checkpoints of earlier versions
                lane.eval_rng.bit_generator.state = state['eval_rng']
        print(f'Resuming {self.exp_name} at step {self.log_step} ({first["phase"]} phase).', flush=True)

    def _resume_point(self, phase):
        """Steps of `phase` already done: 0 for a fresh phase, None for one a resumed run has already finished."""
        if self.resumed_phase is None:
            return 0
        resumed, step = self.resumed_phase
        if resumed == phase:
            return step
        order = ('offline', 'online')
        return None if order.index(resumed) > order.index(phase) else 0

    def check_finite(self, infos=None, params=False):
        """Stops the run, naming the seed, when a seed's info (or parameters, with `params`) holds NaN/inf."""
        several = self.agents.num_seeds > 1
        for i, lane in enumerate(self.lanes):
            lane_params = self.agents.agent(i).network.params if params else None
            check_finite(
                {} if infos is None else infos[i], self.log_step, params=lane_params,
                last_checkpoint=lane.checkpoints.last_path, seed=lane.seed if several else None,
            )  # fmt: skip

    def save_checkpoint(self, phase, step, online=None):
        """Writes every seed's full checkpoint at the end of `step` of `phase`; `online[i]` holds seed i's online
        loop state. Old checkpoints are pruned only once every seed's new one is on disk."""
        # Never write non-finite parameters: the previous checkpoint stays the last good one.
        self.check_finite(params=True)
        agent_states = self.agents.state_dicts()
        for i, lane in enumerate(self.lanes):
            state = dict(
                phase=phase,
                phase_step=step,
                log_step=self.log_step,
                agent=agent_states[i],
                dataset_rng=lane.dataset.rng.bit_generator.state,
                shard_index=None if self.shards is None else self.shards.index,
                shard_loads=None if self.shards is None else self.shards.loads,
                eval_rng=lane.eval_rng.bit_generator.state,
                phase_times=dict(self.phase_times),
                wandb_id=None if lane.wandb_run is None else lane.wandb_run.id,
                online=None if online is None else online[i],
            )
            lane.checkpoints.save(state, self.log_step, prune=False)
        for lane in self.lanes:
            lane.checkpoints.prune()

    def evaluate(self):
        """Evaluates every seed's current agent on fresh episode starts and logs `eval`.

        Each evaluation draws one base seed from the seed's evaluation generator (checkpointed, so a resumed run draws
        what the uninterrupted one draws); episode i then resets with `base + i` and samples with keys of its own, so
        the episodes do not depend on the number of environment copies.
        """
        run = self.run
        successes = []
        for i, lane in enumerate(self.lanes):
            episodes = run.eval_episodes + run.video_episodes
            stats, _, renders = evaluate(
                self.agents.agent(i),
                lane.eval_envs[0],
                self.action_dim,
                num_eval_episodes=run.eval_episodes,
                num_video_episodes=run.video_episodes,
                video_frame_skip=run.video_frame_skip,
                seed=int(lane.eval_rng.integers(0, EVAL_SEED_LIMIT - episodes)),
                record_trajectories=False,
                envs=lane.eval_envs if len(lane.eval_envs) > 1 else None,
            )
            lane.loggers.log('eval', stats, self.log_step)
            if renders:
                lane.loggers.log_video('eval', renders, self.log_step)
            successes.append(stats.get('success', float('nan')))
        self.postfix['eval_success'] = float(np.mean(successes))

    def _first_update_done(self):
        if 'first update' not in self.startup:
            self.startup['first update'] = time.perf_counter() - self._created

    def _after_step(self, phase, i, last_step, infos, phase_start, bar, online_state=None):
        """Logging, evaluation, checkpoints and stop requests at the end of step `i` of `phase`; `infos` holds one
        float info dict per seed (or None on steps without an update).

        The checkpoint comes last, so everything a step logs is on disk before a checkpoint says the step is done.
        """
        run = self.run
        if infos is not None and every(i, run.log_interval):
            elapsed = time.time() - phase_start
            for lane, info in zip(self.lanes, infos, strict=True):
                lane.loggers.log(f'{phase}_agent', dict(info, **{'time/total': elapsed}), self.log_step)
            for key, name in (('critic/critic_loss', 'critic'), ('actor/actor_loss', 'actor')):
                self.postfix[name] = float(np.mean([info.get(key, np.nan) for info in infos]))
            bar.set_postfix(self.postfix, refresh=False)
        if is_eval_step(i, last_step, run.eval_interval):
            self.evaluate()
            bar.set_postfix(self.postfix, refresh=False)
        stopping = self.stop.should_stop()
        if every(i, run.save_interval):
            for j, lane in enumerate(self.lanes):
                save_agent(self.agents.agent(j), lane.run_dir, self.log_step)
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
        samplers = [
            ChunkSampler([('data', lane.dataset, run.batch_size)], run.horizon_length, run.discount)
            for lane in self.lanes
        ]
        # Cap the pre-sampled block so its host copy stays small (image observations): a chunk holds the first
        # observation and the H next observations, besides the smaller fields.
        chunk_bytes = (run.horizon_length + 1) * self.dataset.transition_nbytes() * run.num_seeds
        max_block = max(1, min(run.fused_steps, FUSED_BLOCK_BYTES // (chunk_bytes * run.batch_size)))
        replace_interval = run.dataset_replace_interval if self.shards is not None else 0
        bar = tqdm.tqdm(
            total=run.offline_steps, initial=i, desc='offline', dynamic_ncols=True, disable=run.offline_steps == 0
        )
        try:
            while i < run.offline_steps:
                if every(i + 1, replace_interval):
                    # Shards come with one seed only (`validate`).
                    self._next_shard(samplers[0], 'offline', i)
                end = block_end(
                    i,
                    max_block,
                    run.offline_steps,
                    (run.log_interval, run.save_interval, run.eval_interval),
                    before=(replace_interval,),
                )
                batches = [sampler.sample_block(end - i) for sampler in samplers]  # S x (U, B, ...)
                if max_block == 1:
                    info = self.agents.update([{k: v[0] for k, v in batch.items()} for batch in batches])
                else:
                    info = self.agents.batch_update(batches)
                self.log_step += end - i
                bar.update(end - i)
                i = end
                # One small transfer per block: a NaN stops the run before it reaches a log row or a checkpoint.
                infos = seed_infos(info, run.num_seeds)
                self._first_update_done()
                self.check_finite(infos)
                self._after_step('offline', i, run.offline_steps, infos, phase_start, bar)
        finally:
            bar.close()
        self.phase_times['offline_time'] = time.time() - phase_start

    def _next_shard(self, sampler, phase, step, online_state=None):
        """Moves the (single-seed) run and its `sampler` on to the next dataset shard. A shard that fails its checks
        stops the run with its one line, after a checkpoint at `step` of `phase` that a `--resume` continues from (on
        the shard before it)."""
        index, loads = self.shards.index, self.shards.loads
        try:
            shard = self.shards.next()
        except UserError as e:
            # The checkpoint must name the shard this step trained on.
            self.shards.index, self.shards.loads = index, loads
            self.save_checkpoint(phase, step, online=online_state() if online_state else None)
            self.finish(quiet=True)
            raise DataError(f'{e} (stopped at step {self.log_step}; checkpoint written, continue with --resume)') from e
        self.lanes[0].dataset = self._process(shard)
        sampler.set_source('data', self.lanes[0].dataset)

    def online_phase(self):
        """`online_steps` environment steps with open-loop chunks, adding every transition to the replay buffers.

        The seeds' environments step in lockstep: one batched policy call for the seeds whose action queue is
        empty, then one step of every environment. From `start_training` on, each step runs `utd_ratio` updates
        per seed fused in one `batch_update` on (utd_ratio, batch_size, ...) batches of each seed's chunk sampler
        (replay only, or data and replay, per the preset). The first `run.random_steps` steps take uniform random
        actions. A resumed run restores the buffers and generators and starts new episodes.
        """
        run = self.run
        start = self._resume_point('online')
        if start is None:
            return
        data_count, replay_count = source_counts(run.batch_size, run.preset.online_data_fraction)
        samplers, actors = [], []
        finished = [[] for _ in self.lanes]  # `monitor_stats` of each seed's episodes since its last `env` row.
        states = [dict(steps=[], qpos=[], qvel=[], button_states=[]) for _ in self.lanes]
        for j, lane in enumerate(self.lanes):
            lane.replay = make_replay_buffer(run, lane.dataset, seed=lane.seed)  # on the seed's `replay` stream
            samplers.append(
                ChunkSampler(
                    [('data', lane.dataset, data_count), ('replay', lane.replay, replay_count)],
                    run.horizon_length,
                    run.discount,
                )
            )
            actors.append(
                OnlineActor(
                    lane.env,
                    self.action_dim,
                    seed=lane.seed,
                    reward_fn=sparsify_rewards if run.sparse else None,
                    state_fn=get_env_state if run.save_all_online_states else None,
                    frame_dim=self.dataset['observations'].shape[-1] if run.frame_stack else None,
                )
            )
            if start > 0:
                saved = lane.resume_state['online']
                lane.replay.load_state(saved['buffer'])
                actors[j].rng = jax.numpy.asarray(saved['actor_rng'])
                actors[j].action_rng.bit_generator.state = saved['action_rng']
                finished[j] = list(saved['finished_episodes'])
                states[j] = {k: list(v) for k, v in saved['states'].items()}

        def online_state():
            return [
                dict(
                    buffer=lane.replay.state_dict(),
                    actor_rng=np.asarray(actors[j].rng),
                    action_rng=actors[j].action_rng.bit_generator.state,
                    finished_episodes=list(finished[j]),
                    states=states[j],
                )
                for j, lane in enumerate(self.lanes)
            ]

        # Shards also cycle online where batches draw offline data (`main_online.py`); `main.py`'s replay buffer keeps
        # the shard it started with, as in the reference.
        cycle_shards = self.shards is not None and data_count > 0 and run.dataset_replace_interval > 0
        phase_start = time.time() - self.phase_times.get('online_time', 0.0)
        bar = tqdm.trange(
            start + 1, run.online_steps + 1, initial=start, total=run.online_steps, desc='online', dynamic_ncols=True,
            disable=run.online_steps == 0,
        )  # fmt: skip
        try:
            for i in bar:
                if cycle_shards and i > 1 and every(i - 1, run.dataset_replace_interval):
                    # After every `dataset_replace_interval` steps, when the reference's `main_online.py` loads one;
                    # the training environment keeps its episode.
                    self._next_shard(samplers[0], 'online', i - 1, online_state)
                self.log_step += 1
                if i <= run.random_steps:
                    actions = [actor.random_action() for actor in actors]
                else:
                    actions = policy_actions(actors, self.agents)
                for j, lane in enumerate(self.lanes):
                    transition, info, done = actors[j].step(action=actions[j])
                    bad = non_finite_fields(transition)
                    if bad:
                        # Stopped before the buffer or a checkpoint holds it: the last checkpoint stays good.
                        keys = [f'environment {k}' for k in bad]
                        seed = lane.seed if run.num_seeds > 1 else None
                        raise NonFiniteError(self.log_step, keys, last_checkpoint=lane.checkpoints.last_path, seed=seed)
                    lane.replay.add_transition(transition)
                    if run.save_all_online_states:
                        states[j]['steps'].append(i)
                        for key, value in actors[j].last_state.items():
                            states[j][key].append(value)
                    if done:
                        finished[j].append(monitor_stats(info))
                    if finished[j] and every(i, run.log_interval):
                        lane.loggers.log('env', episode_row(finished[j]), self.log_step)
                        finished[j] = []
                infos = None
                if i >= run.start_training:
                    info = self.agents.batch_update([sampler.sample(run.utd_ratio) for sampler in samplers])
                    self._first_update_done()
                    if every(i, run.log_interval):
                        infos = seed_infos(info, run.num_seeds)
                        self.check_finite(infos)
                self._after_step('online', i, run.online_steps, infos, phase_start, bar, online_state=online_state)
        finally:
            bar.close()
        self.phase_times['online_time'] = time.time() - phase_start
        if run.save_all_online_states:
            for lane, lane_states in zip(self.lanes, states, strict=True):
                if lane_states['steps']:
                    data = {k: np.stack(v) for k, v in lane_states.items() if v}
                    data.update(self.phase_times)
                    atomic_write_bytes(os.path.join(lane.run_dir, 'data.pkl'), pickle.dumps(data))

    def startup_line(self):
        """Where start-up time went, e.g. 'start-up: imports 4.1 s, envs and data 1.2 s, agent 0.8 s, ...'."""
        parts = [f'{name} {seconds:.1f} s' for name, seconds in self.startup.items() if seconds is not None]
        return 'start-up: ' + ', '.join(parts)

    def phase_summaries(self, lane):
        """Per phase of `lane`'s run: dict(phase, steps, updates, seconds, updates_per_s, eval_step, success,
        return); the evaluation at the phase's last step is read back from `eval.csv` (so a resumed run has it)."""
        run = self.run
        path = os.path.join(lane.run_dir, 'eval.csv')
        evals = read_csv(path) if os.path.exists(path) else {}
        phases = []
        end = 0
        online_updates = max(0, run.online_steps - run.start_training + 1) * run.utd_ratio
        for phase, steps, updates in (
            ('offline', run.offline_steps, run.offline_steps),
            ('online', run.online_steps, online_updates),
        ):
            if steps <= 0:
                continue
            end += steps
            seconds = self.phase_times.get(f'{phase}_time')
            row = dict(phase=phase, steps=steps, updates=updates, seconds=seconds, eval_step=end)
            row['updates_per_s'] = updates / seconds if seconds else None
            hit = np.flatnonzero(evals.get('step', np.zeros(0)) == end)
            for key in ('success', 'return'):
                column = metric_column(evals, key)
                row[key] = float(column[hit[-1]]) if column is not None and len(hit) else None
            phases.append(row)
        return phases

    def summary_lines(self, lane):
        """The end-of-run summary of one seed: its directory, then per phase the final evaluation, wall time and
        update rate."""
        lines = [f'Summary of {lane.run_dir}']
        for p in self.phase_summaries(lane):
            evaluation = 'no evaluation at its last step'
            if p['success'] is not None or p['return'] is not None:
                success = '-' if p['success'] is None else f'{p["success"]:.2f}'
                ret = '-' if p['return'] is None else f'{p["return"]:.1f}'
                evaluation = f'eval at step {p["eval_step"]}: success {success}, return {ret}'
            timing = '' if p['seconds'] is None else f' in {p["seconds"]:.0f} s'
            rate = '' if p['updates_per_s'] is None else f' ({p["updates_per_s"]:.1f} updates/s)'
            lines.append(f'  {p["phase"]:<7} {p["steps"]} steps, {p["updates"]} updates{timing}{rate}; {evaluation}')
        return lines

    def finish(self, quiet=False):
        """Closes the logs, wandb and the signal handlers; says where the runs are and where start-up time went."""
        self.stop.close()
        for lane in self.lanes:
            lane.loggers.close()
            if lane.wandb_run is not None:
                lane.wandb_run.finish()
                lane.wandb_run = None
        if not quiet:
            print(self.startup_line(), flush=True)
            for lane in self.lanes:
                # The marker sweeps (and users) read to tell a finished run from an interrupted one.
                record = dict(step=self.log_step, phases=self.phase_summaries(lane), finished_at=time.time())
                atomic_write_bytes(os.path.join(lane.run_dir, FINISHED_FILE), json.dumps(record).encode())
                print('\n'.join(self.summary_lines(lane)), flush=True)
