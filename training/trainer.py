"""One training run, built from a `RunConfig`:

    run = from_flags(FLAGS, PRESET)   # training.config: flags -> a validated RunConfig
    Trainer(run, agents).train()      # offline phase, online phase, final summary

A run trains one seed or several (`--seeds`). Several seeds are one program: the agents are a vmapped
`training.seeds.SeedGroup`, updated and sampled together, while each seed keeps on the host what a run of that seed
alone would have (a `training.lanes.Lane`), in its own run directory.

Where things are: run setup and start-up checks in `training.setup`, the loops in `training.loops`, the plumbing
around their steps in `training.hooks`, checkpoints in `training.checkpointing`, the files of a run directory in
`analysis.run_files`, the end-of-run summary in `training.summary`.
"""

from envs.workers import aborted_on_error
from training import checkpointing, loops, run_dirs, setup
from training.hooks import Hooks
from training.summary import CompileCounter, StartupClock


class Trainer:
    """One run of a `RunConfig`; `agent_classes` maps `agent_name` to agent classes. Everything a run needs is built
    and checked here, before the first update; `train()` runs the loops."""

    def __init__(self, run, agent_classes):
        self.startup = StartupClock()
        self.locks = []  # What `run_dirs.claim` holds once the run directories are made.
        self.compiles = CompileCounter(setup.use_compilation_cache(run.compilation_cache_dir))
        self.run, self.lanes, self.workers = setup.build_lanes(run)
        with aborted_on_error(self.workers):  # A run refused here leaves no worker process behind.
            self.startup.lap('envs and data')
            self.agents = setup.create_agents(
                agent_classes, self.run.agent, self.run.seeds, self.lanes[0].dataset, self.run.seeds_per_vmap
            )
            self.startup.lap('agent')
            if self.workers is not None:  # They built the other environments meanwhile; a failed build stops here.
                self.workers.wait_ready()
                self.startup.lap('worker envs')
            # The run directories are made only once everything above was accepted, and this process holds them
            # from then on (another one that starts on them meanwhile is refused).
            setup.check_disk(self.run, self.agents, self.lanes)
            self.locks = run_dirs.claim(self.run, [lane.run_dir for lane in self.lanes])
            try:
                self.hooks = Hooks(self.run, self.agents, self.lanes, self._open(), self.startup, self.compiles)
            except BaseException:
                run_dirs.release(self.locks)
                raise

    def _open(self):
        """The run's `Progress` (from its checkpoint with --resume), with every seed's logs opened there."""
        progress = checkpointing.resume(self.agents, self.lanes) if self.run.resume else checkpointing.Progress()
        if progress.resumed is not None:
            run_dirs.check_lengths(self.run, [lane.run_dir for lane in self.lanes], progress.log_step)
        for lane in self.lanes:
            setup.open_logs(lane, progress.log_step, self.run.num_seeds > 1, resumed=progress.resumed is not None)
        return progress

    @property
    def stop(self):
        """The run's `utils.guards.StopRequest` (signals and `--max_runtime`)."""
        return self.hooks.stop_request

    @property
    def log_step(self):
        """The run's step counter (offline steps, then offline_steps + online steps)."""
        return self.hooks.progress.log_step

    def train(self):
        """The offline phase, then the online phase (when `online_steps > 0`), then the summary."""
        try:
            loops.train(self.run, self.agents, self.lanes, self.hooks)
        finally:
            self.close()

    def close(self):
        """Ends the environment worker processes (`--env_workers`), if any, and lets go of the run directories."""
        if self.workers is not None:
            self.workers.close()
        run_dirs.release(self.locks)

    def finish(self, quiet=False):
        """Closes the logs (see `Hooks.finish`)."""
        self.hooks.finish(quiet=quiet)
