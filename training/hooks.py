"""What happens around the training loops' steps, so that the loops read as the algorithm: the phase's progress bar
and clock, NaN guards, log rows, evaluation, checkpoints, dataset shard changes, stop requests and dead environment
workers.

The loops call, at the end of a step (or of a block of fused offline steps), in the reference's order: `log`,
`evaluate`, `save`, then `stop` when `stop_requested()`; the checkpoint comes last, so everything a step logs is on
disk before a checkpoint says the step is done.
"""

import contextlib
import os
import pickle
import time

import numpy as np
import tqdm

from analysis import run_files
from envs.common import DataError
from envs.workers import EnvWorkerError
from evaluation import run_lockstep, runner_options, summarize
from training import checkpointing, summary
from training.actor import episode_row
from training.schedule import every
from utils.errors import UserError
from utils.flax_utils import save_agent
from utils.guards import NonFiniteError, StopRequest, check_finite, non_finite_fields
from utils.io_utils import atomic_write_bytes

EVAL_SEED_LIMIT = 2**31  # Episode seeds stay in int32 (32-bit JAX keeps only the low 32 bits of a larger seed).


class StopTraining(UserError):
    """A requested stop (SIGTERM/SIGINT or `--max_runtime`) after a checkpoint was written; the run exits 0."""

    exit_code = 0
    prefix = ''


class WorkerDied(UserError):
    """An environment worker process died (out of memory, a simulator abort, a kill); a checkpoint was written."""

    exit_code = 1


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
    options = runner_options(run.eval_episodes, run.video_frame_skip, record_trajectories=False)
    env_sets = [lane.eval_envs for lane in lanes]
    finished = run_lockstep(agents.sample_episode_chunks, env_sets, action_dim, seeds, episodes, options)
    successes = []
    for lane, done in zip(lanes, finished, strict=True):
        stats, _, renders = summarize([done[i] for i in range(episodes)], run.eval_episodes, False)
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
        self.stop_request = StopRequest(max_runtime=run.max_runtime or None)
        self.phase = None
        self.step = None  # The step under way (online) or the end of the last block (offline) of the phase.
        self.postfix = {}

    @contextlib.contextmanager
    def phase_of(self, phase, total):
        """Runs `phase` of `total` steps: yields its first step (`total` for a phase a resumed run already ended),
        with a progress bar and the phase's clock (checkpointed, so a resumed run keeps counting). An evaluation
        that a dead environment worker interrupted runs first. A dead worker stops the run with one line, after a
        checkpoint that a `--resume` continues from without a missing or repeated log row."""
        start = self.progress.start_of(phase)
        if start is None:
            yield total
            return
        self.phase, self.total, self.step = phase, total, start
        self.offset = self.run.offline_steps if phase == 'online' else 0  # Log steps count offline, then online.
        self.started = time.time() - self.progress.phase_times.get(f'{phase}_time', 0.0)
        self.updates_before = self.agents.updates  # The agent log starts with the phase's first update.
        self.bar = tqdm.tqdm(total=total, initial=start, desc=phase, dynamic_ncols=True, disable=total == 0)
        try:
            if self.progress.eval_due:
                self._finish_interrupted_step(start)
            yield start
        except EnvWorkerError as e:
            self._worker_died(e)
        finally:
            self.bar.close()
        self.progress.phase_times[f'{phase}_time'] = time.time() - self.started
        if phase == 'online':
            self._save_online_states()

    def at_step(self, step):
        """The current phase is at step `step` (online: the step under way; offline: the end of the block that just
        ran): the run's step counter and the progress bar move to it. Offline, every block's infos come to the
        host, so a NaN stops the run before it reaches a log row or a checkpoint."""
        self.step = step
        self.progress.log_step = self.offset + step
        self.bar.update(step - self.bar.n)
        if self.agents.updates:
            self.startup.first_update_done()
        if self.phase == 'offline':
            self._check_finite(self.agents.infos())

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

    def log(self, step):
        """The log rows of step `step`: every seed's `env` row (the online episodes that ended since its last row)
        and, once the phase has updated the agents, its agent row (the infos of its last update; a NaN stops the run
        first)."""
        log_step = self.progress.log_step
        for lane in self.lanes:
            if lane.episodes:
                lane.loggers.log(run_files.ENV_LOG, episode_row(lane.episodes), log_step)
                lane.episodes = []
        self.agents.run_held()  # the queued updates count as the phase's
        if self.agents.updates == self.updates_before:
            return
        infos = self.agents.infos()
        self._check_finite(infos)
        elapsed = time.time() - self.started
        for lane, info in zip(self.lanes, infos, strict=True):
            lane.loggers.log(run_files.agent_log(self.phase), dict(info, **{'time/total': elapsed}), log_step)
        for key, name in (('critic/critic_loss', 'critic'), ('actor/actor_loss', 'actor')):
            values = [info[key] for info in infos if key in info]  # QAM logs no actor/actor_loss
            if values:
                self.postfix[name] = float(np.mean(values))
        self.bar.set_postfix(self.postfix, refresh=False)

    def evaluate(self, step):
        """Evaluates every seed's agent at step `step` (`evaluate_lanes`). A dead environment worker leaves the
        evaluation to the resumed run: the evaluation generators go back to where they were, and the checkpoint at
        `step` says the evaluation is due."""
        states = [lane.eval_rng.bit_generator.state for lane in self.lanes]
        try:
            success = evaluate_lanes(self.run, self.agents, self.lanes, self.progress.log_step)
        except EnvWorkerError as e:
            for lane, state in zip(self.lanes, states, strict=True):
                lane.eval_rng.bit_generator.state = state
            self._worker_died(e, eval_due=True)
        self.postfix['eval_success'] = success
        self.bar.set_postfix(self.postfix, refresh=False)

    def save(self, step):
        """Every seed's parameters (`params_<step>.pkl`, for notebooks) and its full checkpoint at step `step`."""
        for i, lane in enumerate(self.lanes):
            save_agent(self.agents.agent(i), lane.run_dir, self.progress.log_step)
        self._checkpoint(step)

    def stop_requested(self):
        """Whether a signal (SIGTERM, SIGINT) or `--max_runtime` asks the run to stop."""
        return self.stop_request.should_stop()

    def stop(self, step):
        """Stops the run after step `step`: a checkpoint (unless `save` just wrote it), closed logs, exit 0."""
        if self.progress.checkpointed != (self.phase, step):
            self._checkpoint(step)
        self.finish(quiet=True)
        raise StopTraining(
            f'Stopped at step {self.progress.log_step} ({self.stop_request.reason}); checkpoint written. Continue '
            f'with: --exp_name={self.run.exp_name} --resume'
        )

    def _finish_interrupted_step(self, step):
        """The rest of step `step` of a run that a dead environment worker stopped during its evaluation, then a
        checkpoint that says it is done (a later kill must not resume into evaluating the step again)."""
        self.at_step(step)
        self.evaluate(step)
        if every(step, self.run.save_interval):
            self.save(step)
        else:
            self._checkpoint(step)

    def _worker_died(self, error, eval_due=False):
        """Stops the run on a dead environment worker: a checkpoint at the last step done (the step under way, when
        the worker died in its evaluation), closed logs, one line, exit 1."""
        step = self.step if eval_due else self.step - 1
        self.progress.log_step = self.offset + step
        self._checkpoint(step, eval_due=eval_due)
        self.finish(quiet=True)
        raise WorkerDied(
            f'{error} (at step {self.offset + self.step}); checkpoint written at step {self.progress.log_step}. '
            f'Continue with: --exp_name={self.run.exp_name} --resume'
        ) from error

    def _check_finite(self, infos=None, params=False):
        """Stops the run, naming the seed, when a seed's info (or parameters, with `params`) holds NaN/inf."""
        several = self.run.num_seeds > 1
        for i, lane in enumerate(self.lanes):
            check_finite(
                {} if infos is None else infos[i], self.progress.log_step,
                params=self.agents.agent(i).network.params if params else None,
                last_checkpoint=lane.checkpoints.last_path, seed=lane.seed if several else None,
            )  # fmt: skip

    def _checkpoint(self, step, eval_due=False):
        self._check_finite(params=True)  # Never write non-finite parameters: the last checkpoint stays good.
        self.progress.phase_times[f'{self.phase}_time'] = time.time() - self.started
        self.progress.eval_due = eval_due
        checkpointing.save_checkpoints(self.agents, self.lanes, self.progress, self.phase, step)
        self.progress.checkpointed = (self.phase, step)

    def _save_online_states(self):
        for lane in self.lanes:
            if lane.states and lane.states['steps']:
                data = {k: np.stack(v) for k, v in lane.states.items() if v}
                data.update(self.progress.phase_times)
                atomic_write_bytes(os.path.join(lane.run_dir, run_files.STATES_FILE), pickle.dumps(data))

    def finish(self, quiet=False):
        """Closes the logs, wandb and the signal handlers; unless `quiet`, marks every seed's run as finished and
        prints where start-up time went and the summary."""
        self.stop_request.close()
        self.compiles.close()
        for lane in self.lanes:
            lane.loggers.close()
            if lane.loggers.wandb_run is not None:
                lane.loggers.wandb_run.finish()
                lane.loggers.wandb_run = None
        if not quiet:
            print(self.startup.line(), flush=True)
            print(self.compiles.line(), flush=True)
            for lane in self.lanes:
                summary.finish_lane(lane, self.progress.log_step, self.progress.phase_times)
