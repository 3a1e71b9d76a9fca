"""The data side of a run: the processed offline dataset, the replay buffer, and the one chunk sampler both phases use.

A `ChunkSampler` owns its sources (the offline dataset, the replay buffer) and how many chunks of every batch come
from each, and returns `(U, B, ...)` batches for `U` updates at the run's horizon and discount:

    offline phase              data only            `main.py` and any run with offline steps
    online, `main.py`          replay only          the buffer starts with the offline data (shared, not copied)
    online, `main_online.py`   half data, half replay (RLPD's symmetric sampling); the buffer starts empty
"""

import numpy as np

from utils import seeding
from utils.datasets import Dataset, PrefixReplayBuffer, ReplayBuffer

TRANSITION_KEYS = ('observations', 'actions', 'rewards', 'terminals', 'masks', 'next_observations')
# The fields of a chunk batch the agents' losses read: `sample_sequence` leaves out `full_observations` and
# `terminals`, which would add an (B, H, obs) array to every batch (docs/DEVIATIONS.md).
LOSS_FIELDS = ('observations', 'actions', 'next_observations', 'rewards', 'masks', 'valid')


def sparsify_rewards(rewards):
    """Sparse rewards of the paper's scene/puzzle runs: -1 on every step that is not a success step, else 0."""
    return (np.asarray(rewards) != 0.0) * -1.0


def process_dataset(dataset, dataset_proportion=1.0, sparse=False, compact=True, frame_stack=None, p_aug=None):
    """Keeps the first `dataset_proportion` of the transitions, optionally sparsifies the rewards, sets frame
    stacking and augmentation, and (by default) stores each observation once; the sampled batches are the same
    either way."""
    frame_stack = dataset.frame_stack if frame_stack is None else frame_stack
    p_aug = dataset.p_aug if p_aug is None else p_aug
    if (compact and not dataset.compact) or (frame_stack, p_aug) != (dataset.frame_stack, dataset.p_aug):
        rebuilt = Dataset.create(
            frame_stack=frame_stack, p_aug=p_aug, compact=compact or dataset.compact, **dict(dataset)
        )
        rebuilt.rng.bit_generator.state = dataset.rng.bit_generator.state
        dataset = rebuilt
    if dataset_proportion < 1.0:
        dataset = dataset.take_first(int(dataset.size * dataset_proportion))
    if sparse:
        dataset = dataset.copy(add_or_replace=dict(rewards=sparsify_rewards(dataset['rewards']).astype(np.float32)))
    return dataset


def process_run_dataset(run, dataset):
    """`process_dataset` with the settings of `run` (proportion, sparse rewards, frame stacking, augmentation)."""
    return process_dataset(dataset, run.dataset_proportion, run.sparse, frame_stack=run.frame_stack, p_aug=run.p_aug)


def replay_capacity(run, dataset):
    """Transitions the replay buffer of `run` holds: `--buffer_size`, enlarged to fit the data it starts with."""
    if run.preset.replay_starts_with_data:
        return max(run.buffer_size, dataset.size + 1)
    return run.buffer_size


def make_replay_buffer(run, dataset, seed):
    """The replay buffer of the online phase of run seed `seed`, sampling on that seed's `replay` stream
    (independent of the dataset's): it starts with `dataset` (read in place, not copied, so several seeds share it)
    or empty, with the dataset's fields."""
    capacity = replay_capacity(run, dataset)
    seed = seeding.stream(seed, 'replay')
    if run.preset.replay_starts_with_data:
        keys = [k for k in TRANSITION_KEYS if k in dataset]
        return PrefixReplayBuffer(
            dataset, capacity, keys, online_capacity=run.online_steps, frame_stack=dataset.frame_stack,
            p_aug=dataset.p_aug, seed=seed,
        )  # fmt: skip
    first = dataset.get_subset(np.zeros(1, dtype=np.int64))  # Unstacked frames, nothing materialized.
    example = {k: first[k][0] for k in TRANSITION_KEYS}
    return ReplayBuffer.create(example, size=capacity, frame_stack=dataset.frame_stack, p_aug=dataset.p_aug, seed=seed)


def stack_utd(batch, utd_ratio, batch_size):
    """Reshapes a batch of utd_ratio * batch_size chunks into (utd_ratio, batch_size, ...) leaves."""
    return {k: v.reshape((utd_ratio, batch_size, *v.shape[1:])) for k, v in batch.items()}


class ChunkSampler:
    """Draws batches of H-step chunks from weighted sources; each call returns leaves shaped (U, B, ...).

    `sources` is a list of `(name, source, count)`: every batch holds `count` chunks from `source` (a `Dataset` or
    `ReplayBuffer`), concatenated along the batch axis in list order. For `U` updates, each source is asked once for
    `U * count` chunks, which are then split into the U batches (the reference's UTD sampling).
    """

    def __init__(self, sources, horizon_length, discount):
        self.sources = [(name, source, int(count)) for name, source, count in sources if count > 0]
        if not self.sources:
            raise ValueError('a ChunkSampler needs at least one source with a positive count')
        self.horizon_length = horizon_length
        self.discount = discount

    @property
    def batch_size(self):
        """Chunks per update batch, over all sources."""
        return sum(count for _, _, count in self.sources)

    def set_source(self, name, source):
        """Replaces the source called `name` (a new dataset shard) and keeps its count."""
        self.sources = [(n, source if n == name else s, c) for n, s, c in self.sources]

    def sample(self, num_updates=1):
        """A batch for `num_updates` updates: leaves (num_updates, batch_size, ...)."""
        parts = [
            stack_utd(
                source.sample_sequence(num_updates * count, self.horizon_length, self.discount, fields=LOSS_FIELDS),
                num_updates,
                count,
            )
            for _, source, count in self.sources
        ]
        if len(parts) == 1:
            return parts[0]
        return {k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]}

    def sample_block(self, num_updates):
        """A batch for `num_updates` updates drawn one update at a time, as a loop of single updates draws them."""
        if num_updates == 1:
            return self.sample(1)
        blocks = [self.sample(1) for _ in range(num_updates)]
        return {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}


def join_steps(steps):
    """One batch per seed for the updates of several steps: `steps[t][i]` is seed i's (U, B, ...) batch of step t;
    returns seed i's batches joined in step order, (T * U, B, ...)."""
    if len(steps) == 1:
        return steps[0]
    return [{k: np.concatenate([step[i][k] for step in steps]) for k in steps[0][i]} for i in range(len(steps[0]))]


def source_counts(batch_size, data_fraction):
    """(data, replay) chunks per batch for a share `data_fraction` of data (`main_online.py`: B // 2 and the rest)."""
    data = int(batch_size * data_fraction)
    return data, batch_size - data
