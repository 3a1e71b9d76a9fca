"""The end of a run: where start-up time went, per phase the final evaluation, wall time and update rate, and the
`finished.json` marker (`analysis.run_files`)."""

import os
import time

import jax
import numpy as np

from analysis import run_files


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


class StartupClock:
    """Seconds per start-up stage ('imports', 'envs and data', 'agent', with environment workers 'worker envs' (the
    wait for their environments after the agent was made), 'first update'), for the summary line."""

    def __init__(self):
        self.stages = {'imports': seconds_since_process_start()}
        self._created = self._last = time.perf_counter()

    def lap(self, stage):
        """Ends `stage`: the time since the previous lap."""
        now = time.perf_counter()
        self.stages[stage] = now - self._last
        self._last = now

    def first_update_done(self):
        """Records the time from the start of setup to the end of the first update (once)."""
        if 'first update' not in self.stages:
            self.stages['first update'] = time.perf_counter() - self._created

    def line(self):
        """E.g. 'start-up: imports 4.1 s, envs and data 1.2 s, agent 0.8 s, first update 3.0 s'."""
        parts = [f'{name} {seconds:.1f} s' for name, seconds in self.stages.items() if seconds is not None]
        return 'start-up: ' + ', '.join(parts)


class CompileCounter:
    """Counts, while open, the programs XLA built (compiled, or loaded from the persistent compilation cache) and the
    seconds they took."""

    def __init__(self, cache_dir):
        self.cache_dir = cache_dir
        self.built, self.seconds, self.loaded = 0, 0.0, 0
        self.open = True
        jax.monitoring.register_event_listener(self._event)
        jax.monitoring.register_event_duration_secs_listener(self._duration)

    def _event(self, event, **kwargs):
        if event == '/jax/compilation_cache/cache_hits':
            self.loaded += 1

    def _duration(self, event, seconds, **kwargs):
        if event == '/jax/core/compile/backend_compile_duration':  # a compile, or a load from the cache
            self.built += 1
            self.seconds += seconds

    def close(self):
        if self.open:
            jax.monitoring.unregister_event_listener(self._event)
            jax.monitoring.unregister_event_duration_listener(self._duration)
            self.open = False

    def line(self):
        """E.g. 'compiles: 7 programs in 9.2 s: 2 compiled, 5 loaded from the cache in /root/.cache/qc-jax/xla'."""
        if not self.cache_dir:
            return f'compiles: {self.built} programs compiled in {self.seconds:.1f} s (no compilation cache)'
        return (
            f'compiles: {self.built} programs in {self.seconds:.1f} s: {self.built - self.loaded} compiled, '
            f'{self.loaded} loaded from the cache in {self.cache_dir}'
        )


def phase_summaries(run, run_dir, phase_times):
    """Per phase of the run in `run_dir`: dict(phase, steps, updates, seconds, updates_per_s, eval_step, success,
    return); the evaluation at the phase's last step is read back from its `eval` log (so a resumed run has it)."""
    evals = run_files.read_log(run_dir, run_files.EVAL_LOG)
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
        seconds = phase_times.get(f'{phase}_time')
        row = dict(phase=phase, steps=steps, updates=updates, seconds=seconds, eval_step=end)
        row['updates_per_s'] = updates / seconds if seconds else None
        hit = np.flatnonzero(evals.get('step', np.zeros(0)) == end)
        for key in ('success', 'return'):
            column = run_files.metric_column(evals, key)
            row[key] = float(column[hit[-1]]) if column is not None and len(hit) else None
        phases.append(row)
    return phases


def summary_lines(run_dir, phases):
    """The end-of-run summary of one seed: its directory, then per phase the final evaluation, wall time and
    update rate."""
    lines = [f'Summary of {run_dir}']
    for p in phases:
        evaluation = 'no evaluation at its last step'
        if p['success'] is not None or p['return'] is not None:
            success = '-' if p['success'] is None else f'{p["success"]:.2f}'
            ret = '-' if p['return'] is None else f'{p["return"]:.1f}'
            evaluation = f'eval at step {p["eval_step"]}: success {success}, return {ret}'
        timing = '' if p['seconds'] is None else f' in {p["seconds"]:.0f} s'
        rate = '' if p['updates_per_s'] is None else f' ({p["updates_per_s"]:.1f} updates/s)'
        lines.append(f'  {p["phase"]:<7} {p["steps"]} steps, {p["updates"]} updates{timing}{rate}; {evaluation}')
    return lines


def finish_lane(lane, log_step, phase_times):
    """Marks the lane's run as finished (`finished.json`) and prints its summary."""
    phases = phase_summaries(lane.run, lane.run_dir, phase_times)
    run_files.write_finished(lane.run_dir, log_step, phases)
    print('\n'.join(summary_lines(lane.run_dir, phases)), flush=True)
