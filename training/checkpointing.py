"""Full training checkpoints: the one definition of their format, writing them for every seed, and resuming.

A checkpoint of one seed at the end of step `phase_step` of `phase` is a dict:

    format        CHECKPOINT_FORMAT (absent in checkpoints written before it was introduced: the same layout)
    phase         'offline' or 'online'; phase_step: steps of that phase done
    log_step      the run's step counter (offline steps, then offline_steps + online steps)
    phase_times   seconds spent per phase so far ('offline_time', 'online_time')
    eval_due      True when a dead environment worker interrupted the step's evaluation (the resumed run evaluates
                  first); absent in checkpoints written before it was introduced
    agent         the agent's state dict (host arrays)
    ...           the lane's `state_dict()`: dataset_rng, shard_index, shard_loads, eval_rng, wandb_id, online

Every seed writes its own file in `<run_dir>/checkpoints` (`utils.checkpoints.CheckpointManager`); old ones are pruned
only once every seed's new one is on disk, and a resume loads the newest step that every seed has.
"""

import dataclasses

from analysis.run_files import PHASES
from utils.checkpoints import CheckpointError
from utils.errors import UsageError

CHECKPOINT_FORMAT = 1
REQUIRED_KEYS = ('phase', 'phase_step', 'log_step', 'phase_times', 'agent', 'dataset_rng')


@dataclasses.dataclass
class Progress:
    """Where a run stands: its step counter, the time spent per phase, and where a resumed run picks up."""

    log_step: int = 0
    phase_times: dict = dataclasses.field(default_factory=dict)
    resumed: tuple = None  # (phase, steps of it done) of the checkpoint a run resumed from.
    eval_due: bool = False  # The resumed step's evaluation (and checkpoint) still has to run.
    checkpointed: tuple = None  # (phase, step) of the last checkpoint this process wrote.

    def start_of(self, phase):
        """Steps of `phase` already done: 0 for a fresh phase, None for one a resumed run has already finished."""
        if self.resumed is None:
            return 0
        phase_done, step = self.resumed
        if phase_done == phase:
            return step
        return None if PHASES.index(phase_done) > PHASES.index(phase) else 0


def checkpoint_state(progress, phase, step, agent_state, lane):
    """The checkpoint of one seed (see the module docstring)."""
    state = dict(
        format=CHECKPOINT_FORMAT,
        phase=phase,
        phase_step=step,
        log_step=progress.log_step,
        phase_times=dict(progress.phase_times),
        eval_due=progress.eval_due,
        agent=agent_state,
    )
    state.update(lane.state_dict())
    return state


def save_checkpoints(agents, lanes, progress, phase, step):
    """Writes every seed's checkpoint at the end of `step` of `phase`, then prunes the old ones."""
    for lane, agent_state in zip(lanes, agents.state_dicts(), strict=True):
        state = checkpoint_state(progress, phase, step, agent_state, lane)
        lane.checkpoints.save(state, progress.log_step, prune=False)
    for lane in lanes:
        lane.checkpoints.prune()


def check_format(state, path):
    """Refuses, with one line, a checkpoint this code cannot continue."""
    version = state.get('format', CHECKPOINT_FORMAT)
    if version > CHECKPOINT_FORMAT:
        raise CheckpointError(
            f'{path} has checkpoint format {version}, newer than this code reads ({CHECKPOINT_FORMAT}); update the '
            'code, or start a new run with another --exp_name'
        )
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise CheckpointError(
            f'{path} lacks {", ".join(missing)} (not a training checkpoint of this project); start a new run with '
            'another --exp_name'
        )


def load_checkpoints(lanes):
    """Every seed's checkpoint at the newest step all seeds have (a kill between two seeds' files leaves some seeds
    one checkpoint ahead), or None when no seed has one."""
    loaded = [lane.checkpoints.load_latest() for lane in lanes]
    missing = [lane for lane, state in zip(lanes, loaded, strict=True) if state is None]
    if len(missing) == len(lanes):
        return None
    if missing:
        raise UsageError(
            f'seed {missing[0].seed} has no checkpoint in {missing[0].checkpoints.directory} while other seeds '
            'do; resume with the same --seeds as the interrupted run'
        )
    step = min(s for _, s in loaded)
    states = []
    for lane, (state, lane_step) in zip(lanes, loaded, strict=True):
        if lane_step > step:
            state, _ = lane.checkpoints.load_latest(max_step=step)
        check_format(state, lane.checkpoints.path(step))
        states.append(state)
    return states


def resume(agents, lanes):
    """Restores the agents and lanes from the newest common checkpoint; returns the run's `Progress` (a fresh one,
    with a line saying so, when there is no checkpoint)."""
    states = load_checkpoints(lanes)
    if states is None:
        print(f'No checkpoint in {lanes[0].checkpoints.directory}; starting from scratch.', flush=True)
        return Progress()
    agents.load_state_dicts([s['agent'] for s in states])
    for lane, state in zip(lanes, states, strict=True):
        lane.load_state_dict(state)
    first = states[0]
    progress = Progress(
        first['log_step'],
        dict(first['phase_times']),
        (first['phase'], first['phase_step']),
        eval_due=bool(first.get('eval_due', False)),
    )
    print(f'Resuming {lanes[0].exp_name} at step {progress.log_step} ({first["phase"]} phase).', flush=True)
    return progress
