"""Run setup: everything a run needs is built and checked here, before the first update and before anything is
written (run directories, data, environments, agents, disk space), then the logs are opened.
"""

import dataclasses
import functools
import os
import tempfile

import jax
import numpy as np

from analysis import run_files
from envs.common import RENDERING_HINT, DataError, describe_error
from envs.env_utils import make_run_envs, seed_env_list
from envs.gl_backend import rendering_disabled_reason
from envs.workers import WorkerPool, aborted_on_error
from log_utils import Loggers, get_exp_name, setup_wandb
from training import run_dirs
from training.data import process_run_dataset, replay_capacity
from training.lanes import Lane, map_lanes, thread_pool
from training.seeds import SeedGroup
from utils import compilation_cache, seeding
from utils.checkpoints import check_disk_space
from utils.errors import UsageError
from utils.guards import check_dataset_matches_env

DEFAULT_COMPILATION_CACHE = '~/.cache/qc-jax/xla'
# The cache folder's bound, kept when a run starts (`utils.compilation_cache.trim`: the oldest entries go first).
COMPILATION_CACHE_BYTES = 16 << 30
BUILD_THREADS = 8  # Threads that build the other seeds' environments.


def use_compilation_cache(path):
    """Turns on JAX's persistent compilation cache in `path` (None: $JAX_COMPILATION_CACHE_DIR, else
    `DEFAULT_COMPILATION_CACHE`; 'none': off), its entries written whole and the folder bounded by
    `COMPILATION_CACHE_BYTES` (`utils.compilation_cache`) unless $JAX_COMPILATION_CACHE_MAX_SIZE has JAX bound it;
    returns the directory used, or None."""
    if path == 'none':
        return None
    path = os.path.expanduser(path or os.environ.get('JAX_COMPILATION_CACHE_DIR') or DEFAULT_COMPILATION_CACHE)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        message = f'cannot create the compilation cache {path} ({e.strerror}); choose another --compilation_cache_dir'
        raise UsageError(message) from e
    if jax.config.jax_compilation_cache_dir != path:
        jax.config.update('jax_compilation_cache_dir', path)
    if jax.config.jax_compilation_cache_max_size == -1:  # not bounded by JAX ($JAX_COMPILATION_CACHE_MAX_SIZE)
        compilation_cache.write_entries_atomically()
        compilation_cache.trim(path, COMPILATION_CACHE_BYTES)
    return path


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


def check_chunk_fits(dataset, run):
    """Refuses a dataset shorter than one action chunk (`horizon_length` transitions)."""
    if dataset.size < run.horizon_length:
        source = dataset.source or f'the {run.env_name} dataset'
        raise DataError(
            f'{source}: {dataset.size} transitions, fewer than one action chunk (--horizon_length={run.horizon_length})'
        )


def env_worker_count(run):
    """The environment worker processes of `run`: `--env_workers` (-1: none for one seed, else one per seed and at
    most one per CPU core this process may use), at most one per set of environments to hold (the first seed's
    training environment where there is an online phase, and each other seed's environments)."""
    sets = run.num_seeds - 1 + (run.online_steps > 0)
    if run.env_workers < 0:
        return 0 if run.num_seeds == 1 else min(sets, len(os.sched_getaffinity(0)))
    return min(run.env_workers, sets)


def build_lanes(run):
    """(run, lanes, workers): one `Lane` per seed, with its environments and its view of the checked, processed
    offline data, and the `envs.workers.WorkerPool` holding the training environments and the other seeds'
    evaluation copies with `--env_workers` (else None; its workers may still be building: `workers.wait_ready()`
    before the first use). The returned run has videos turned off where nothing renders (said in one warning
    line)."""
    group_dir = os.path.join(run.save_dir, run.run_group or '')
    check_writable(group_dir)  # Fails early on an unwritable save_dir; nothing is created before the checks.
    base, names = seed_exp_names(run)
    run = dataclasses.replace(run, exp_name=base)  # The name a `--resume` continues.
    # Before anything loads: a directory in use, checkpoints without --resume, a resume with other settings.
    run_dirs.check(run, [os.path.join(group_dir, name) for name in names])
    num_eval_envs = max(1, min(run.eval_envs, run.eval_episodes + run.video_episodes))

    def builder(seed, copies):
        return functools.partial(seed_env_list, run.env_name, seed, num_eval_envs=copies, dataset_dir=run.dataset_dir,
                                 frame_stack=run.frame_stack)  # fmt: skip

    seed_builders = [builder(s, num_eval_envs) for s in run.seeds[1:]]
    # Worker processes start first and build their environments while this process loads the data and creates the
    # agents (`Trainer` waits for them after that): the first seed's training environment (where there is an online
    # phase), and all environments of the other seeds.
    first = [builder(run.seed, 0)] if run.online_steps > 0 else []
    num_workers = env_worker_count(run)
    builders = [*first, *seed_builders]
    counts = [1 + b.keywords['num_eval_envs'] for b in builders]  # `seed_env_list`: the training env, then copies
    workers = WorkerPool(builders, num_workers, counts) if num_workers else None
    with aborted_on_error(workers):  # A run refused here leaves no worker process behind.
        envs = make_run_envs(
            run.env_name, dataset_dir=run.dataset_dir, ogbench_dataset_dir=run.ogbench_dataset_dir, seed=run.seed,
            frame_stack=run.frame_stack, num_eval_envs=num_eval_envs, with_val=False,
        )  # fmt: skip
        if run.video_episodes > 0:
            reason = rendering_problem(envs.eval_envs[0])
            if reason:
                # Checked before any update, so a run never trains to its end and then dies at a video.
                print(f'warning: videos are off ({reason}); training goes on as with --video_episodes=0', flush=True)
                run = dataclasses.replace(run, video_episodes=0)
        check_dataset_matches_env(envs.train_dataset, envs.env, frame_stack=run.frame_stack)
        check_chunk_fits(envs.train_dataset, run)
        dataset = process_run_dataset(run, envs.train_dataset)

        train_env = envs.env  # Used for the checks above; with workers, a worker's copy steps.
        if workers is not None:
            other_envs = workers.env_lists()
            if first:
                [train_env], *other_envs = other_envs
        else:
            # Built side by side on threads (each build touches only its own environments): 12.1 s -> 4.8 s for 8 seeds
            # of cube on an H200 node (benchmarks/RESULTS.md).
            with thread_pool(run, dataset['observations'].ndim - 1, workers=BUILD_THREADS) as pool:
                other_envs = map_lanes(pool, lambda build: build(), seed_builders)
        lanes = [Lane.build(run.for_seed(run.seed), names[0], os.path.join(group_dir, names[0]), train_env,
                            envs.eval_envs, dataset, shards=envs.shards)]  # fmt: skip
        for s, name, (env, *eval_envs) in zip(run.seeds[1:], names[1:], other_envs, strict=True):
            lane_dataset = dataset.copy()  # Same arrays, own generator seeded like `--seed=s` alone.
            lane_dataset.seed(seeding.stream(s, 'dataset'))
            lanes.append(Lane.build(run.for_seed(s), name, os.path.join(group_dir, name), env, eval_envs, lane_dataset))
    return run, lanes, workers


def create_agents(agent_classes, config, seeds, dataset, seeds_per_vmap=0):
    """The `SeedGroup` of `seeds` of the agent named by `config.agent_name`, from one example of `dataset`;
    `seeds_per_vmap` seeds are vmapped together (see `SeedGroup.create`)."""
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
            agent_classes[name], seeds, example['observations'], example['actions'], config,
            seeds_per_vmap=seeds_per_vmap,
        )  # fmt: skip
    except ValueError as e:
        raise UsageError(str(e)) from e


def check_disk(run, agents, lanes):
    """Refuses to start when the disk cannot hold `keep + 1` checkpoints of every seed (agent, plus the online
    part of a replay buffer when there is an online phase)."""
    per_seed = sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(agents.agents)) // agents.num_seeds
    dataset = lanes[0].dataset
    if run.online_steps > 0:
        # A checkpointed buffer holds the online transitions only (the offline data is the run's dataset).
        per_seed += dataset.transition_nbytes() * min(replay_capacity(run, dataset), run.online_steps)
    check_disk_space(lanes[0].run_dir, (run.keep_checkpoints + 1) * per_seed * agents.num_seeds, 'checkpoints')


def open_logs(lane, log_step, several, resumed):
    """Opens a lane's logs at `log_step`, the step its run starts from (from a checkpoint when `resumed`): the run
    directory keeps only what an uninterrupted run had written by then (`run_files.rewind`: a start from scratch
    keeps no rows), the start is recorded (`run_dirs.record_start`), then wandb (the same wandb run when resumed)
    and the CSV loggers."""
    run_files.rewind(lane.run_dir, log_step)
    run_dirs.record_start(lane.run_dir, lane.run, log_step, resumed)
    wandb_run = setup_wandb(
        project='qc', group=lane.run.run_group, name=lane.exp_name, config=lane.run.flag_record, dir=lane.run_dir,
        run_id=lane.wandb_id, several=several,
    )  # fmt: skip
    lane.wandb_id = None if wandb_run is None else wandb_run.id
    lane.loggers = Loggers(lane.run_dir, wandb_run=wandb_run)
