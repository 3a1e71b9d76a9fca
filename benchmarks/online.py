"""The online phase as `main.py` runs it (`training.loops.online_loop` under a real `Trainer`), per-step and fused
update schedules side by side, with a breakdown of where each online step's time goes.

Each row is one run of `steps` online steps of S seeds on a small generated cube-single dataset (no logging, no
evaluation, no checkpoints). The loop's parts are timed in place: the environment steps of all seeds, the policy
calls (which include waiting for the device to finish the updates before them), the batch sampling and the update
dispatch (`SeedGroup.run_held`, timed apart from the policy call or other read of the agents that runs it); the
rest of the step is `other`. After the run, the parts are measured alone: one policy call, and the
updates of one chunk's steps (blocked), so that the bound set by the critical path stands next to the measured rate:

    fused:     env + update + policy / H             (the updates of a chunk run between its last step and the query)
    per step:  env + max(0, update - env) (H-1)/H + update / H + policy / H      (each update hides behind a step)

`device_busy_est` is the share of the wall time the device spent on updates and policy calls, from the alone timings.
"""

import atexit
import functools
import os
import shutil
import tempfile
import time

import numpy as np

from benchmarks.common import ENV_NAME, make_config

STEP_PARTS = ('env', 'policy', 'sample', 'dispatch')


@functools.lru_cache(maxsize=1)
def dataset_dir():
    """A small generated cube-single play dataset (made once per process, removed when it exits)."""
    from envs.generate_ogbench import generate_dataset

    path = tempfile.mkdtemp(prefix='qc-bench-data-')
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    generate_dataset(
        'cube-single-play-v0', os.path.join(path, 'cube-single-play-v0.npz'), num_episodes=2, num_val_episodes=1,
        episode_length=101, show_progress=False,
    )  # fmt: skip
    return path


class PartTimer:
    """Adds up the seconds of wrapped calls per part, from step `start` of the loop on."""

    def __init__(self, start):
        self.start = start
        self.step = 0
        self.seconds = dict.fromkeys(STEP_PARTS, 0.0)
        self.calls = dict.fromkeys(STEP_PARTS, 0)
        self.first_time = None
        self._inner = []  # Per wrapped call under way, the seconds of the wrapped calls made inside it.

    def wrap(self, part, fn):
        """`fn`, its seconds added to `part`; the seconds of wrapped calls inside it count for their own part only
        (a policy call first runs the agents' queued updates: dispatch, not policy)."""

        def timed(*args, **kwargs):
            self._inner.append(0.0)
            t = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - t
                inner = self._inner.pop()
                if self._inner:
                    self._inner[-1] += seconds
            if self.step > self.start:
                self.seconds[part] += seconds - inner
                self.calls[part] += 1
            return out

        return timed

    def begin(self, at_step, agents):
        def timed(step):
            self.step = step
            if step == self.start + 1:
                self.first_time = time.perf_counter()
                self.updates_at_start = agents.updates
            return at_step(step)

        return timed


def make_run(agent_name, size, num_seeds, fused, steps, save_dir, preset, env_workers=-1, device_replay=True):
    from training.config import RunConfig, validate

    config = make_config(agent_name, size)
    config.discount = 0.99
    return validate(
        RunConfig(
            preset=preset, agent=config, env_name=ENV_NAME, dataset_dir=dataset_dir(), save_dir=save_dir,
            seeds=tuple(range(num_seeds)), offline_steps=0, online_steps=steps, start_training=config.horizon_length,
            log_interval=10**9, eval_interval=0, eval_episodes=0, eval_envs=1, buffer_size=steps + 10_000,
            fuse_online_updates=fused, env_workers=env_workers, device_replay=device_replay,
            exp_name=f'{agent_name}_{size}_s{num_seeds}_{"fused" if fused else "step"}_{int(device_replay)}',
        )
    )  # fmt: skip


def alone_ms(trainer, horizon, reps=3):
    """(update ms per step, policy ms per call): the updates of one chunk's steps and one policy call, blocked."""
    import jax

    lanes, agents = trainer.lanes, trainer.agents
    update, policy = [], []
    fuse_steps, agents.fuse_steps = agents.fuse_steps, horizon  # one call for the chunk's steps
    for _ in range(reps + 1):
        # With the device replay each packed step writes the newest transition again: the same storage.
        pending = [[lane.sampler.sample(trainer.run.utd_ratio) for lane in lanes] for _ in range(horizon)]
        t = time.perf_counter()
        for batches in pending:
            agents.queue_updates(batches)
        jax.block_until_ready(agents.agents)
        update.append((time.perf_counter() - t) / horizon)
        actors = [lane.actor for lane in lanes]
        observations = np.stack([actor.observation for actor in actors])
        key_seeds = np.array([actor.key_seed for actor in actors], dtype=np.uint32)
        t = time.perf_counter()
        agents.sample_chunks(observations, key_seeds, np.zeros(len(actors), dtype=np.int32))  # one policy call
        policy.append(time.perf_counter() - t)
    agents.fuse_steps = fuse_steps
    return 1e3 * min(update[1:]), 1e3 * min(policy[1:])


def run(agent_name='QC', size='small', seeds=1, fused=True, steps=500, warmup_chunks=4, env_workers=-1,
        device_replay=True, log=print):
    """One online run; returns its steps/s, the per-step breakdown (ms), the alone timings and the bound.
    `env_workers` is the run's `--env_workers` (-1: the default, one worker process per seed after the first);
    `device_replay` its `--device_replay` (chunks gathered on the device, or sampled on the host)."""
    import jax

    import main
    import main_online
    from agents import agents as agent_classes
    from training import Trainer
    from training.actor import SeedActors
    from training.setup import env_worker_count

    os.environ.setdefault('WANDB_MODE', 'disabled')
    module = 'acfql' if agent_name in ('QC', 'QC-FQL', 'FQL') else 'acrlpd'
    preset = main.PRESET if module == 'acfql' else main_online.PRESET
    with tempfile.TemporaryDirectory(prefix='qc-bench-online-') as save_dir:
        horizon = make_config(agent_name, size).horizon_length
        warm = horizon * warmup_chunks + horizon  # compiles happen in the first chunks
        run_config = make_run(agent_name, size, seeds, fused, steps + warm, save_dir, preset, env_workers,
                              device_replay)
        trainer = Trainer(run_config, agent_classes)
        timer = PartTimer(start=warm)
        agents = trainer.agents
        agents.sample_chunks = timer.wrap('policy', agents.sample_chunks)
        agents.run_held = timer.wrap('dispatch', agents.run_held)  # where queued online updates are dispatched
        # The environment steps of all seeds (in this process and in the worker processes).
        env_step = SeedActors.env_step
        SeedActors.env_step = timer.wrap('env', env_step)
        trainer.hooks.at_step = timer.begin(trainer.hooks.at_step, agents)
        original_start = type(trainer.lanes[0]).start_online

        def start_online(lane):
            original_start(lane)
            lane.sampler.sample = timer.wrap('sample', lane.sampler.sample)

        for lane in trainer.lanes:
            lane.start_online = functools.partial(start_online, lane)
        try:
            trainer.train()
        finally:
            SeedActors.env_step = env_step
        jax.block_until_ready(agents.agents)
        wall = time.perf_counter() - timer.first_time
        parts, calls = dict(timer.seconds), dict(timer.calls)
        update_calls = agents.updates - timer.updates_at_start  # before `alone_ms` adds its own
        update_ms, policy_ms = alone_ms(trainer, horizon)
    out = dict(agent=agent_name, size=size, seeds=seeds, schedule='fused' if fused else 'per step', steps=steps,
               sampling='device' if agents.replay is not None else 'host', horizon=horizon,
               env_workers_flag=env_workers, env_workers=env_worker_count(run_config), backend=jax.default_backend())
    out['steps_per_s'] = steps / wall
    out['seed_steps_per_s'] = seeds * steps / wall
    out['step_ms'] = 1e3 * wall / steps
    for part in STEP_PARTS:
        out[f'{part}_ms'] = 1e3 * parts[part] / steps
    out['other_ms'] = out['step_ms'] - sum(out[f'{part}_ms'] for part in STEP_PARTS)
    out['policy_calls'] = calls['policy']
    out['update_calls'] = update_calls
    out['update_alone_ms'], out['policy_alone_ms'] = update_ms, policy_ms
    env_ms = out['env_ms']
    if fused:
        bound = env_ms + update_ms + policy_ms / horizon
    else:
        bound = env_ms + max(0.0, update_ms - env_ms) * (horizon - 1) / horizon + (update_ms + policy_ms) / horizon
    out['bound_ms'] = bound
    out['efficiency'] = bound / out['step_ms']
    out['device_busy_est'] = min(1.0, (update_ms + policy_ms / horizon) / out['step_ms'])
    out['startup'] = {k: v for k, v in trainer.startup.stages.items() if v is not None}
    parts_text = ', '.join(f'{p} {out[f"{p}_ms"]:.2f}' for p in (*STEP_PARTS, 'other'))
    log(
        f'  online {agent_name} {size} S={seeds} {out["schedule"]} {out["sampling"]} sampling, env workers '
        f'{out["env_workers"]}: '
        f'{out["steps_per_s"]:.1f} steps/s ({out["step_ms"]:.2f} ms/step: {parts_text}'
        f'); alone: update {update_ms:.2f} ms/step, policy {policy_ms:.2f} ms; bound {bound:.2f} ms '
        f'(efficiency {out["efficiency"]:.2f})'
    )
    return out


def startup(agent_name='QC', size='paper', seeds=1, env_workers=-1, log=print):
    """Start-up of a run of S seeds (stages of `Trainer`'s start-up line, in seconds) with a 10-step online phase."""
    row = run(agent_name, size, seeds=seeds, fused=True, steps=10, warmup_chunks=0, env_workers=env_workers,
              log=lambda *_: None)  # fmt: skip
    stages = {f'{k} s': v for k, v in row['startup'].items()}
    out = dict(agent=agent_name, size=size, seeds=seeds, env_workers_flag=env_workers, env_workers=row['env_workers'],
               **stages)  # fmt: skip
    text = ', '.join(f'{k} {v:.1f} s' for k, v in row['startup'].items())
    log(f'  start-up {agent_name} {size} S={seeds} env workers {row["env_workers"]}: {text}')
    return out
