"""The training loops: offline updates on dataset chunks, then online steps with open-loop action chunks.

Each loop says what the reference's `main.py` / `main_online.py` loop says, in the same order, over a list of lanes
(one per seed, `training.lanes.Lane`) whose agents train together in one `training.seeds.SeedGroup`: act, learn,
then log, evaluate and save on their intervals. The plumbing of those (progress bar, NaN guards, log files,
checkpoint files, stop requests, dead environment workers) lives in the calls to `training.hooks.Hooks`.
These are the functions to edit to change what a run does; `training.trainer.Trainer` builds what they take.
"""

from training.actor import SeedActors
from training.device_replay import DeviceReplay
from training.schedule import block_end, every, is_eval_step

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
                agents.update([{k: v[0] for k, v in batch.items()} for batch in batches])
            else:
                agents.batch_update(batches)
            step = end
            hooks.at_step(step)

            if every(step, run.log_interval):
                hooks.log(step)
            if is_eval_step(step, run.offline_steps, run.eval_interval):
                hooks.evaluate(step)
            if every(step, run.save_interval):
                hooks.save(step)
            if hooks.stop_requested():
                hooks.stop(step)


def online_loop(run, agents, lanes, hooks):
    """`online_steps` environment steps with open-loop chunks; every transition enters the seed's replay buffer.

    The seeds' environments step in lockstep (`SeedActors`): one batched policy call for the seeds whose action
    queue is empty, then one step of every environment. From `start_training` on, each step samples `utd_ratio`
    batches per seed from each seed's sampler (replay only, or data and replay, per the driver's preset) right
    after its transitions entered the buffers. The first `run.random_steps` steps take uniform random actions. A
    resumed run restores the buffers and generators and starts new episodes.

    The agents run a step's updates at once (`--fuse_online_updates=False`, the reference's schedule) or hold them
    and run a chunk's steps as one compiled call (the default): the same updates on the same batches in the same
    order, since anything that reads the agents (the next policy call, a log row, an evaluation, a checkpoint) runs
    what they hold first.
    """
    # Shards also cycle online where batches draw offline data (`main_online.py`); `main.py`'s replay buffer keeps
    # the shard it started with, as in the reference.
    data_in_batches = run.preset.online_data_fraction > 0
    shard_interval = run.dataset_replace_interval if lanes[0].shards is not None and data_in_batches else 0
    for lane in lanes:
        lane.start_online()
    actors = SeedActors([lane.actor for lane in lanes], agents)
    agents.fuse_steps = run.horizon_length if run.fuse_online_updates else 1
    agents.replay = DeviceReplay.for_lanes(lanes, run.utd_ratio)  # None where batches are sampled on the host
    with hooks.phase_of('online', run.online_steps) as start:
        for i in range(start + 1, run.online_steps + 1):
            # After every `dataset_replace_interval` steps (when the reference's `main_online.py` loads one); the
            # training environment keeps its episode.
            if i > 1 and every(i - 1, shard_interval):
                hooks.next_shard(lanes[0], i - 1)
            hooks.at_step(i)

            # Act: uniform random actions while the buffer warms up, else the next action of the open-loop chunk.
            steps = actors.step(random=i <= run.random_steps)
            for lane, (transition, env_info, done) in zip(lanes, steps, strict=True):
                hooks.check_transition(lane, transition)
                lane.replay.add_transition(transition)
                lane.record(i, env_info, done)

            # Learn: `utd_ratio` updates per seed, each on its own batch of chunks.
            if i >= run.start_training:
                agents.queue_updates([lane.sampler.sample(run.utd_ratio) for lane in lanes])

            if every(i, run.log_interval):
                hooks.log(i)
            if is_eval_step(i, run.online_steps, run.eval_interval):
                hooks.evaluate(i)
            if every(i, run.save_interval):
                hooks.save(i)
            if hooks.stop_requested():
                hooks.stop(i)


def train(run, agents, lanes, hooks):
    """The offline phase, then the online phase (when `online_steps > 0`), then the summary."""
    offline_loop(run, agents, lanes, hooks)
    if run.online_steps > 0:
        online_loop(run, agents, lanes, hooks)
    hooks.finish()
