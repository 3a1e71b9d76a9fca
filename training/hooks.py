"""What happens around the training loops' steps, so that the loops read as the algorithm: the phase's progress bar
and clock, NaN guards, logging, evaluation, checkpoints, dataset shard changes and stop requests.

`Hooks.step_done` runs at the end of every step (or block of fused offline steps), in this order: log, evaluate,
save; the checkpoint comes last, so everything a step logs is on disk before a checkpoint says the step is done.
"""

import contextlib
import os
import pickle
import time

import numpy as np
import tqdm

from analysis import run_files
from envs.common import DataError
from evaluation import evaluate, run_lockstep, runner_options, summarize
from training import checkpointing, summary
from training.schedule import every, is_eval_step
from utils.errors import UserError
from utils.flax_utils import save_agent
from utils.guards import NonFiniteError, StopRequest, check_finite, non_finite_fields
from utils.io_utils import atomic_write_bytes

EVAL_SEED_LIMIT = 2**31  # Episode seeds stay in int32 (32-bit JAX keeps only the low 32 bits of a larger seed).


class StopTraining(UserError):
    """A requested stop (SIGTERM/SIGINT or `--max_runtime`) after a checkpoint was written; the run exits 0."""

    exit_code = 0
    prefix = ''


def evaluate_lanes(run, agents, lanes, log_step):
    """Evaluates every seed's current agent on fresh episode starts, logs `eval`; returns the mean success.

    Each evaluation draws one base seed from the seed's evaluation generator (checkpointed, so a resumed run draws
    what the uninterrupted one draws); episode i then resets with `base + i` and samples with keys of its own, so
    the episodes do not depend on the number of environment copies. Several seeds' episodes run in lockstep, with
    one policy call for all seeds' copies whose queue is empty.
    """
    episodes = run.eval_episodes + run.video_episodes
    seeds = [int(lane.eval_rng.integers(0, EVAL_SEED_LIMIT - episodes)) for lane in lanes]
    action_dim = lanes[0].dataset['actions'].shape[-1]
    if len(lanes) == 1:
        lane = lanes[0]
        envs = lane.eval_envs if len(lane.eval_envs) > 1 else None
        results = [evaluate(
            agents.agent(0), lane.eval_envs[0], action_dim, num_eval_episodes=run.eval_episodes,
            num_video_episodes=run.video_episodes, video_frame_skip=run.video_frame_skip, seed=seeds[0],
            record_trajectories=False, envs=envs,
        )]  # fmt: skip
    else:
        options = runner_options(run.eval_episodes, run.video_frame_skip, record_trajectories=False)
        env_sets = [lane.eval_envs for lane in lanes]
        finished = run_lockstep(agents.sample_episode_chunks, env_sets, action_dim, seeds, episodes, options)
        results = [summarize([f[i] for i in range(episodes)], run.eval_episodes, False) for f in finished]
    successes = []
    for lane, (stats, _, renders) in zip(lanes, results, strict=True):
        lane.loggers.log(run_files.EVAL_LOG, stats, log_step)
        if renders:
            lane.loggers.log_video(run_files.EVAL_LOG, renders, log_step)
        successes.append(stats.get('success', float('nan')))
    return float(np.mean(successes))


class Hooks:
    """The plumbing the loops call: one object per run, over its agents (`SeedGroup`) and lanes."""

    def __init__(self, run, agents, lanes, progress, startup, compiles):
        self.run, self.agents, self.lanes = run, agents, lanes
        self.progress = progress  # `checkpointing.Progress`: the step counter and phase times.
        self.startup = startup  # `summary.StartupClock`.
        self.compiles = compiles  # `summary.CompileCounter`.
        self.stop = StopRequest(max_runtime=run.max_runtime or None)
        self._stop_asked = (None, False)  # (step, answer) of the last `reads_agents`.
        self.phase = None
        self.postfix = {}

    @contextlib.contextmanager
    def phase_of(self, phase, total):
        """Runs `phase` of `total` steps: yields its first step (`total` for a phase a resumed run already ended),
        with a progress bar and the phase's clock (checkpointed, so a resumed run keeps counting)."""
        start = self.progress.start_of(phase)
        if start is None:
            yield total
            return
        self.phase, self.total = phase, total
        self.offset = self.run.offline_steps if phase == 'online' else 0  # Log steps count offline, then online.
        self.started = time.time() - self.progress.phase_times.get(f'{phase}_time', 0.0)
        self.bar = tqdm.tqdm(total=total, initial=start, desc=phase, dynamic_ncols=True, disable=total == 0)
        try:
            yield start
        finally:
            self.bar.close()
        self.progress.phase_times[f'{phase}_time'] = time.time() - self.started
        if phase == 'online':
            self._save_online_states()

    def begin_step(self, step):
        """Start of step `step` of the current phase: the run's step counter moves to it."""
        self.progress.log_step = self.offset + step

    def check_transition(self, lane, transition):
        """Stops the run when the environment returned NaN/inf, before the buffer or a checkpoint holds it (the
        last checkpoint stays good)."""
        bad = non_finite_fields(transition)
        if bad:
            seed = lane.seed if self.run.num_seeds > 1 else None
            keys = [f'environment {k}' for k in bad]
            raise NonFiniteError(self.progress.log_step, keys, last_checkpoint=lane.checkpoints.last_path, seed=seed)

    def next_shard(self, lane, step):
        """Moves `lane` on to the next dataset shard after `step`. A shard that fails its checks stops the run with
        its one line, after a checkpoint at `step` that a `--resume` continues from (on the shard before it)."""
        try:
            lane.next_shard()
        except UserError as e:
            self._checkpoint(step)
            self.finish(quiet=True)
            log_step = self.progress.log_step
            raise DataError(f'{e} (stopped at step {log_step}; checkpoint written, continue with --resume)') from e

    def reads_agents(self, step):
        """Whether the end of step `step` of the current phase reads the agents: a log row, an evaluation, a
        checkpoint or a stop (asked once per step; `step_done` keeps the answer)."""
        run = self.run
        self._stop_asked = (step, self.stop.should_stop())
        writes = every(step, run.log_interval) or every(step, run.save_interval)
        return writes or is_eval_step(step, self.total, run.eval_interval) or self._stop_asked[1]

    def step_done(self, step, info):
        """End of step `step` of the current phase (of a block ending there): `info` is the (S,)-leading info of the
        step's updates (None without one). Offline, every block's info comes to the host (a NaN stops the run
        before it reaches a log row or a checkpoint); online, only on logging steps."""
        run = self.run
        self.begin_step(step)
        self.bar.update(step - self.bar.n)
        infos = None
        if info is not None:
            self.startup.first_update_done()
            if self.phase == 'offline' or every(step, run.log_interval):
                infos = self.agents.host_infos(info)
                self._check_finite(infos)
        if infos is not None and every(step, run.log_interval):
            self._log(infos)
        if is_eval_step(step, self.total, run.eval_interval):
            self.postfix['eval_success'] = evaluate_lanes(run, self.agents, self.lanes, self.progress.log_step)
            self.bar.set_postfix(self.postfix, refresh=False)
        asked_step, stopping = self._stop_asked
        if asked_step != step:
            stopping = self.stop.should_stop()
        if every(step, run.save_interval):
            for i, lane in enumerate(self.lanes):
                save_agent(self.agents.agent(i), lane.run_dir, self.progress.log_step)
        if every(step, run.save_interval) or stopping:
            self._checkpoint(step)
        if stopping:
            self.finish(quiet=True)
            raise StopTraining(
                f'Stopped at step {self.progress.log_step} ({self.stop.reason}); checkpoint written. Continue with: '
                f'--exp_name={self.run.exp_name} --resume'
            )

    def _log(self, infos):
        elapsed = time.time() - self.started
        for lane, info in zip(self.lanes, infos, strict=True):
            row = dict(info, **{'time/total': elapsed})
            lane.loggers.log(run_files.agent_log(self.phase), row, self.progress.log_step)
        for key, name in (('critic/critic_loss', 'critic'), ('actor/actor_loss', 'actor')):
            self.postfix[name] = float(np.mean([info.get(key, np.nan) for info in infos]))
        self.bar.set_postfix(self.postfix, refresh=False)

    def _check_finite(self, infos=None, params=False):
        """Stops the run, naming the seed, when a seed's info (or parameters, with `params`) holds NaN/inf."""
        several = self.run.num_seeds > 1
        for i, lane in enumerate(self.lanes):
            check_finite(
                {} if infos is None else infos[i], self.progress.log_step,
                params=self.agents.agent(i).network.params if params else None,
                last_checkpoint=lane.checkpoints.last_path, seed=lane.seed if several else None,
            )  # fmt: skip

    def _checkpoint(self, step):
        self._check_finite(params=True)  # Never write non-finite parameters: the last checkpoint stays good.
        self.progress.phase_times[f'{self.phase}_time'] = time.time() - self.started
        checkpointing.save_checkpoints(self.agents, self.lanes, self.progress, self.phase, step)

    def _save_online_states(self):
        for lane in self.lanes:
            if lane.states and lane.states['steps']:
                data = {k: np.stack(v) for k, v in lane.states.items() if v}
                data.update(self.progress.phase_times)
                atomic_write_bytes(os.path.join(lane.run_dir, run_files.STATES_FILE), pickle.dumps(data))

    def finish(self, quiet=False):
        """Closes the logs, wandb and the signal handlers; unless `quiet`, marks every seed's run as finished and
        prints where start-up time went and the summary."""
        self.stop.close()
        self.compiles.close()
        for lane in self.lanes:
            lane.loggers.close()
            if lane.wandb_run is not None:
                lane.wandb_run.finish()
                lane.wandb_run = None
        if not quiet:
            print(self.startup.line(), flush=True)
            print(self.compiles.line(), flush=True)
            for lane in self.lanes:
                summary.finish_lane(lane, self.progress.log_step, self.progress.phase_times)
