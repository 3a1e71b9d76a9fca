"""A `Lane`: everything one seed of a run owns on the host, exactly what a single-seed run of that seed would own.

The agents of all seeds live together in one `training.seeds.SeedGroup` (one compiled program); each seed's data
streams, environments, action queue, replay buffer, logs and checkpoints live in its lane. `state_dict()` and
`load_state_dict()` hold what a checkpoint keeps of a lane (`training.checkpointing` adds the agent and the step).
"""

import contextlib
import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor

from analysis import run_files
from envs.env_state import get_env_state
from evaluation import monitor_stats
from training import device_replay
from training.actor import OnlineActor
from training.data import ChunkSampler, make_replay_buffer, process_run_dataset, source_counts, sparsify_rewards
from utils import seeding
from utils.checkpoints import CheckpointManager

ONLINE_STATE_KEYS = ('steps', 'qpos', 'qvel', 'button_states')  # What `--save_all_online_states` keeps per step.


@dataclasses.dataclass
class Lane:
    """One seed of a run: its settings, run directory, environments, data, checkpoints and logs, built complete by
    `training.setup.build_lanes`; `start_online` adds the online phase's replay buffer and actor."""

    run: object  # The single-seed `RunConfig` (`run.for_seed`).
    exp_name: str
    run_dir: str
    env: object  # The training environment.
    eval_envs: list  # Evaluation copies, stepped in lockstep.
    dataset: object  # The offline data; shares the arrays of every seed's dataset, has its own generator.
    shards: object  # The dataset shard cycler of a sharded OGBench run (one seed only), else None.
    checkpoints: object  # Its `utils.checkpoints.CheckpointManager` (nothing on disk before the first save or load).
    eval_rng: object  # Draws each evaluation's episode seeds; advances from one evaluation to the next.
    sampler: object  # The `ChunkSampler` of the current phase (the offline data's, until `start_online`).
    wandb_id: str = None  # The wandb run of this seed (a resumed run continues the checkpoint's).
    loggers: object = None  # Its `log_utils.Loggers` (CSV files, wandb), once `open_logs` opened them.
    replay: object = None  # The online phase's replay buffer.
    actor: object = None  # The online phase's `OnlineActor` (action queue, random-action stream).
    episodes: list = dataclasses.field(default_factory=list)  # `monitor_stats` of episodes since the last `env` row.
    states: dict = None  # Simulator states of every online step (`--save_all_online_states`).

    @classmethod
    def build(cls, run, exp_name, run_dir, env, eval_envs, dataset, shards=None):
        """The lane of `run` (one seed's `RunConfig`), with its generators, checkpoint manager and offline sampler."""
        checkpoints = CheckpointManager(os.path.join(run_dir, run_files.CHECKPOINT_DIR), keep=run.keep_checkpoints)
        sampler = ChunkSampler([('data', dataset, run.batch_size)], run.horizon_length, run.discount)
        eval_rng = seeding.generator(run.seed, 'evaluation')
        return cls(run, exp_name, run_dir, env, eval_envs, dataset, shards, checkpoints, eval_rng, sampler)

    @property
    def seed(self):
        return self.run.seed

    def start_online(self):
        """The replay buffer, the online actor and the sampler of the online phase (once; a resumed online phase
        has them from `load_state_dict`)."""
        if self.replay is not None:
            return
        run = self.run
        self.replay = make_replay_buffer(run, self.dataset, seed=self.seed)  # on the seed's `replay` stream
        data_count, replay_count = source_counts(run.batch_size, run.preset.online_data_fraction)
        sources = [('data', self.dataset, data_count), ('replay', self.replay, replay_count)]
        if device_replay.usable(run, self.dataset, self.shards):  # Chunks gathered inside the update.
            sampler_args = (sources, run.horizon_length, run.discount, self.dataset, self.replay)
            self.sampler = device_replay.RowSampler(*sampler_args)
        else:
            self.sampler = ChunkSampler(sources, run.horizon_length, run.discount)
        self.actor = OnlineActor(
            self.env,
            self.dataset['actions'].shape[-1],
            seed=self.seed,
            reward_fn=sparsify_rewards if run.sparse else None,
            state_fn=get_env_state if run.save_all_online_states else None,
            frame_dim=self.dataset['observations'].shape[-1] if run.frame_stack else None,
        )
        if run.save_all_online_states:
            self.states = {k: [] for k in ONLINE_STATE_KEYS}

    def next_shard(self):
        """Moves on to the next dataset shard (the sampler's data source too). A shard that fails its checks raises
        its `UserError` and leaves the lane on the shard before it."""
        index, loads = self.shards.index, self.shards.loads
        try:
            shard = self.shards.next()
        except Exception:
            self.shards.index, self.shards.loads = index, loads
            raise
        self.dataset = process_run_dataset(self.run, shard)
        self.sampler.set_source('data', self.dataset)

    def record(self, step, info, done):
        """Bookkeeping of online step `step` after its transition entered the buffer: the simulator state it reached
        and, at an episode end, the episode's statistics."""
        if self.states is not None:
            self.states['steps'].append(step)
            for key, value in self.actor.last_state.items():
                self.states[key].append(value)
        if done:
            self.episodes.append(monitor_stats(info))

    def state_dict(self):
        """What a checkpoint keeps of this lane (host values only)."""
        online = None
        if self.replay is not None:
            online = dict(
                buffer=self.replay.state_dict(),
                actor_chunks=self.actor.chunks,
                action_rng=self.actor.action_rng.bit_generator.state,
                finished_episodes=list(self.episodes),
                states=self.states if self.states is not None else {k: [] for k in ONLINE_STATE_KEYS},
            )
        return dict(
            dataset_rng=self.dataset.rng.bit_generator.state,
            shard_index=None if self.shards is None else self.shards.index,
            shard_loads=None if self.shards is None else self.shards.loads,
            eval_rng=self.eval_rng.bit_generator.state,
            wandb_id=self.wandb_id,
            online=online,
        )

    def load_state_dict(self, state):
        """Restores `state_dict()` output; an online part starts the online phase (buffer, actor) first."""
        if self.shards is not None and state.get('shard_index') is not None:
            self.dataset = process_run_dataset(self.run, self.shards.seek(state['shard_index']))
            # The next shard samples with the stream it had before (checkpoints of earlier versions lack it).
            self.shards.loads = state.get('shard_loads', self.shards.loads)
        self.dataset.rng.bit_generator.state = state['dataset_rng']
        if state.get('eval_rng') is not None:  # absent from checkpoints of earlier versions
            self.eval_rng.bit_generator.state = state['eval_rng']
        self.wandb_id = state.get('wandb_id')
        online = state.get('online')
        if online is not None:
            self.start_online()
            self.replay.load_state(online['buffer'])
            # Checkpoints of earlier versions hold a JAX key chain instead; their actor counts chunks from 0 again.
            self.actor.chunks = int(online.get('actor_chunks', 0))
            self.actor.action_rng.bit_generator.state = online['action_rng']
            self.episodes = list(online['finished_episodes'])
            if self.states is not None:
                self.states = {k: list(online['states'].get(k, [])) for k in ONLINE_STATE_KEYS}


def renders(run, observation_ndim):
    """Whether the environments of `run` render (pixel observations or videos): OpenGL contexts belong to the thread
    that made them, so such environments stay on the main thread."""
    return observation_ndim > 1 or run.frame_stack is not None or run.video_episodes > 0


@contextlib.contextmanager
def thread_pool(run, observation_ndim, workers):
    """At most `workers` threads (one per seed) for work on the seeds' environments; None for one seed or thread, or
    environments that render. MuJoCo releases the GIL only while it simulates, so threads pay where simulation
    dominates (building environments, heavy physics)."""
    workers = min(workers, run.num_seeds)
    if workers <= 1 or renders(run, observation_ndim):
        yield None
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix='seed-env') as pool:
        yield pool


def map_lanes(pool, fn, *args):
    """`[fn(*a) for a in zip(*args)]`, on the pool's threads when there is one (results in order)."""
    return list(pool.map(fn, *args)) if pool is not None else [fn(*a) for a in zip(*args, strict=True)]
