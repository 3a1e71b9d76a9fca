"""The training loops: offline updates on dataset chunks, then online steps with open-loop action chunks.

Each loop says what the reference's `main.py` / `main_online.py` loop says, in the same order, over a list of lanes
(one per seed, `training.lanes.Lane`) whose agents train together in one `training.seeds.SeedGroup`. Plumbing
(progress bar, NaN guards, logs, evaluation, checkpoints, stop requests) is one call to `training.hooks.Hooks`.
These are the functions to edit to change what a run does; `training.trainer.Trainer` builds what they take.
"""

from training.actor import policy_actions
from training.data import join_steps
from training.schedule import block_end, every

# Upper bound on the host memory of one block of pre-sampled offline batches (image observations are large).
FUSED_BLOCK_BYTES = 256 * 2**20


def fused_block_size(run, dataset):
    """Offline updates per compiled call: `--fused_steps`, fewer when a block's pre-sampled batches (every seed's
    chunk starts and H next observations) would exceed `FUSED_BLOCK_BYTES`."""
    chunk_bytes = (run.horizon_length + 1) * dataset.transition_nbytes() * run.num_seeds
    return max(1, min(run.fused_steps, FUSED_BLOCK_BYTES // (chunk_bytes * run.batch_size)))


def offline_loop(run, agents, lanes, hooks):
    """`offline_steps` updates on batches of dataset chunks, cycling dataset shards when given.

    Updates run in blocks of up to `fused_steps` per compiled call (`batch_update`), on batches sampled in the same
    order as one update per step; a block ends on every step that logs, saves or evaluates, so those happen exactly
    where the flags put them. `--fused_steps=1` is the reference's one call per update.
    """
    max_block = fused_block_size(run, lanes[0].dataset)
    shard_interval = run.dataset_replace_interval if lanes[0].shards is not None else 0  # One seed only with shards.
    for lane in lanes:
        lane.start_offline()
    with hooks.phase_of('offline', run.offline_steps) as step:
        while step < run.offline_steps:
            # A new dataset shard before every `dataset_replace_interval`-th step (the reference's `i % interval`).
            if every(step + 1, shard_interval):
                hooks.next_shard(lanes[0], step)
            end = block_end(
                step, max_block, run.offline_steps, (run.log_interval, run.save_interval, run.eval_interval),
                before=(shard_interval,),
            )  # fmt: skip
            batches = [lane.sampler.sample_block(end - step) for lane in lanes]  # S x (U, B, ...), U = end - step
            if max_block == 1:
                info = agents.update([{k: v[0] for k, v in batch.items()} for batch in batches])
            else:
                info = agents.batch_update(batches)
            step = end
            hooks.step_done(step, info)


def online_loop(run, agents, lanes, hooks):
    """`online_steps` environment steps with open-loop chunks; every transition enters the seed's replay buffer.

    The seeds' environments step in lockstep: one batched policy call for the seeds whose action queue is empty,
    then one step of every environment. From `start_training` on, each step samples `utd_ratio` batches per seed
    from each seed's sampler (replay only, or data and replay, per the driver's preset) right after its transitions
    entered the buffers. The first `run.random_steps` steps take uniform random actions. A resumed run restores the
    buffers and generators and starts new episodes.

    With `--fuse_online_updates` (the default) the updates of the steps between two reads of the agents (a policy
    query, a log row, an evaluation, a checkpoint, which a shard change may write) run as one `batch_update`: the
    same updates on the same batches, in the same order, as one call per step (`--fuse_online_updates=False`, the
    reference's schedule).
    """
    # Shards also cycle online where batches draw offline data (`main_online.py`); `main.py`'s replay buffer keeps
    # the shard it started with, as in the reference.
    data_in_batches = run.preset.online_data_fraction > 0
    shard_interval = run.dataset_replace_interval if lanes[0].shards is not None and data_in_batches else 0
    for lane in lanes:
        lane.start_online()
    pending = []  # Per step whose updates have not run yet: every seed's (utd_ratio, batch_size, ...) batch.
    with hooks.phase_of('online', run.online_steps) as start:
        for i in range(start + 1, run.online_steps + 1):
            # After every `dataset_replace_interval` steps (when the reference's `main_online.py` loads one); the
            # training environment keeps its episode.
            if i > 1 and every(i - 1, shard_interval):
                hooks.next_shard(lanes[0], i - 1)
            hooks.begin_step(i)

            # Act: uniform random actions while the buffer warms up, else the next action of the open-loop chunk
            # (one policy call for the seeds whose action queue is empty).
            if i <= run.random_steps:
                actions = [lane.actor.random_action() for lane in lanes]
            else:
                actions = policy_actions([lane.actor for lane in lanes], agents.sample_chunks)
            steps = step_lanes(lanes, actions)  # the seeds' environments side by side where workers hold them
            for lane, (transition, env_info, done) in zip(lanes, steps, strict=True):
                hooks.check_transition(lane, transition)
                lane.replay.add_transition(transition)
                lane.record(i, env_info, done)
                lane.log_episodes(i, hooks.progress.log_step)

            # Learn: `utd_ratio` updates per seed, each on its own batch of chunks, run once the agents are read next.
            if i >= run.start_training:
                pending.append([lane.sampler.sample(run.utd_ratio) for lane in lanes])
            info = None
            chunk_full = len(pending) == run.horizon_length
            if pending and (not run.fuse_online_updates or chunk_full or every(i, shard_interval)
                            or queries_policy(run, lanes, i + 1) or hooks.reads_agents(i)):  # fmt: skip
                info = run_updates(agents, pending, run.horizon_length)
                pending = []
            hooks.step_done(i, info)


def step_lanes(lanes, actions):
    """Every seed's environment step with its action; (transition, info, done) per seed. All steps are sent before
    any is received, so environments in worker processes (`--env_workers`) step side by side, and with this
    process's own."""
    for lane, action in zip(lanes, actions, strict=True):
        lane.actor.send(action)
    return [lane.actor.receive() for lane in lanes]


def run_updates(agents, pending, horizon):
    """Runs the pending steps' updates in order: one compiled call for a full chunk of `horizon` steps, else one
    call per step (at episode ends and log steps), so that the update compiles for two batch shapes only."""
    calls = [pending] if len(pending) == horizon else [[step] for step in pending]
    for steps in calls:
        info = agents.batch_update(join_steps(steps))
    return info


def queries_policy(run, lanes, step):
    """Whether online step `step` starts with a policy call (some seed's action queue is empty)."""
    return step > run.random_steps and any(lane.actor.queue.empty for lane in lanes)


def train(run, agents, lanes, hooks):
    """The offline phase, then the online phase (when `online_steps > 0`), then the summary."""
    offline_loop(run, agents, lanes, hooks)
    if run.online_steps > 0:
        online_loop(run, agents, lanes, hooks)
    hooks.finish()
