"""Online chunks gathered on the device: the dataset and every seed's replay transitions live in device memory, and an
update receives the storage rows of its chunks instead of the chunks themselves.

A host sampler (`RowSampler`) draws each batch exactly as `training.data.ChunkSampler` draws it (the same generator
calls, the same sources in the same order), but returns, per update, the storage rows of every chunk step and the
per-step scalars it computes on the host (`rewards`, `masks`, `valid`, bit for bit `sample_sequence`'s), packed with
the step's new transition into one int32 vector (floats as their bits). The compiled step (`replay_steps`) writes
that transition into the seed's device storage, gathers observations, actions and next observations of the chunks,
and runs the updates; so one step moves a few kilobytes to the device instead of a batch, and the batches the agents
see are identical.

Storage rows: row r < n (the dataset's size) is dataset transition r; row n + j is row j of the replay buffer's own
storage (`ReplayBuffer`: its ring; `PrefixReplayBuffer`: its online rows, the prefix being the dataset itself).
Device memory: the dataset once per process, plus per seed (2 * obs_dim + action_dim) * 4 bytes for every row of its
replay storage (`--buffer_size` rows in `main_online.py`, `--online_steps` rows in `main.py`; rounded up to a power
of two, `padded_rows`).

State observations only: image observations, frame stacking and augmentation (memory, host-side crops) and dataset
shards (a changing dataset) keep the host sampler (`usable`).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from training.data import ChunkSampler

SCALARS = ('rewards', 'masks', 'valid')  # Per-step fields computed on the host, packed beside the rows.
GATHERED = ('observations', 'actions', 'next_observations')  # Fields gathered on the device from storage rows.


def usable(run, dataset, shards):
    """Whether a run samples its online chunks on the device (`--device_replay` and a dataset it applies to)."""
    states = dataset['observations'].ndim == 2
    return run.device_replay and states and run.frame_stack is None and run.p_aug is None and shards is None


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static sizes of one packed step: the new transition (its row, observation, action, next observation), then
    per update and chunk step the row and the scalars; int32 throughout (floats as their bits)."""

    obs_dim: int
    action_dim: int
    updates: int  # U
    batch_size: int  # B
    horizon: int  # H

    @property
    def transition_size(self):
        """Entries of the new transition: its row, observation, action and next observation."""
        return 1 + 2 * self.obs_dim + self.action_dim

    def size(self):
        """Entries of one packed step."""
        return self.transition_size + self.updates * self.batch_size * self.horizon * (1 + len(SCALARS))


def _as_int32_bits(values):
    """float32 values as the int32 of their bits (the packed vector is int32, so that the rows never pass as floats:
    small ints are subnormal floats, which a device may flush to zero)."""
    return np.asarray(values, dtype=np.float32).view(np.int32)


class RowSampler(ChunkSampler):
    """A `ChunkSampler` whose `sample` returns one packed int32 vector per call (`Layout`): the newest transition
    of its replay buffer and its chunks as storage rows, with the same generator draws as `ChunkSampler.sample`."""

    def __init__(self, sources, horizon_length, discount, dataset, replay):
        super().__init__(sources, horizon_length, discount)
        self.data_size = dataset.size  # Storage rows below it are the dataset's.
        self.replay = replay

    def layout(self, num_updates):
        """The `Layout` of `sample(num_updates)`."""
        obs_dim = self.replay.storage()['observations'].shape[-1]
        action_dim = self.replay.storage()['actions'].shape[-1]
        return Layout(obs_dim, action_dim, num_updates, self.batch_size, self.horizon_length)

    def sample(self, num_updates=1):
        """The packed step of `num_updates` updates: leaves of the unpacked batch are (num_updates, batch_size, ...)."""
        H = self.horizon_length
        rows, scalars = [], []
        for _, source, count in self.sources:
            logical = source.draw_chunks(num_updates * count, H)  # (U * count, H)
            phys = source._physical(logical)
            own, own_rows = source.storage_rows(phys)
            rows.append(np.where(own, self.data_size + own_rows, own_rows).reshape(num_updates, count, H))
            values = source.chunk_scalars(phys, self.discount)
            scalars.append(np.stack([values[k] for k in SCALARS], axis=-1).reshape(num_updates, count, H, -1))
        rows, scalars = np.concatenate(rows, axis=1), np.concatenate(scalars, axis=1)  # (U, B, H), (U, B, H, 3)
        chunks = np.concatenate([rows[..., None].astype(np.int32), _as_int32_bits(scalars)], axis=-1)  # (U, B, H, 4)
        row, transition = self.replay.newest()
        head = [np.array([row], dtype=np.int32), *(_as_int32_bits(np.ravel(transition[k])) for k in GATHERED)]
        return np.concatenate([*head, chunks.ravel()])


def _unpack(packed, layout):
    """The new transition and the (U, B, H) rows and scalars of a packed step (`RowSampler.sample`)."""
    sizes = np.cumsum([1, layout.obs_dim, layout.action_dim, layout.obs_dim])
    row, obs, action, next_obs, chunks = jnp.split(packed, sizes)

    def as_float32(bits):
        return jax.lax.bitcast_convert_type(bits, jnp.float32)

    transition = dict(observations=as_float32(obs), actions=as_float32(action), next_observations=as_float32(next_obs))
    chunks = chunks.reshape(layout.updates, layout.batch_size, layout.horizon, 1 + len(SCALARS))
    scalars = {k: as_float32(chunks[..., i + 1]) for i, k in enumerate(SCALARS)}
    return row[0], transition, chunks[..., 0], scalars


def gather(data, storage, rows, scalars):
    """The batch of the chunks at storage `rows` (U, B, H), as `sample_sequence` returns it for the losses."""
    n = data['actions'].shape[0]
    own = rows >= n  # (U, B, H)
    data_rows, own_rows = jnp.minimum(rows, n - 1), jnp.maximum(rows - n, 0)

    def pick(own_mask, from_data, from_storage):
        return jnp.where(own_mask.reshape(own_mask.shape + (1,) * (from_data.ndim - own_mask.ndim)), from_storage,
                         from_data)  # fmt: skip

    observations = data['observations']
    data_next = observations[data['next_index'][data_rows]] if 'next_index' in data else data['next_observations'][
        data_rows]  # fmt: skip
    return dict(
        observations=pick(own[..., 0], observations[data_rows[..., 0]], storage['observations'][own_rows[..., 0]]),
        actions=pick(own, data['actions'][data_rows], storage['actions'][own_rows]),  # (U, B, H, A)
        next_observations=pick(own, data_next, storage['next_observations'][own_rows]),  # (U, B, H, obs)
        **scalars,
    )


def store_and_gather(storage, data, packed_step, layout):
    """One packed online step (`RowSampler.sample`): its transition written into `storage`, then the batch of its U
    updates gathered from the data and the storage. Returns (storage, batch with (U, B, ...) leaves)."""
    row, transition, rows, scalars = _unpack(packed_step, layout)
    storage = {k: storage[k].at[row].set(transition[k]) for k in storage}
    return storage, gather(data, storage, rows, scalars)


def replay_steps(agent, storage, data, packed, layout):
    """Runs T online steps of one seed, `packed` (T, layout.size()): each writes its transition into `storage`, then
    runs its U updates on the chunks gathered from the data and the storage. Returns (agent, storage, last info)."""

    def step(carry, packed_step):
        agent, storage = carry
        storage, batch = store_and_gather(storage, data, packed_step, layout)
        agent, info = agent.batch_update(batch)  # its U updates
        return (agent, storage), info

    (agent, storage), infos = jax.lax.scan(step, (agent, storage), packed)
    return agent, storage, jax.tree_util.tree_map(lambda x: x[-1], infos)


def data_arrays(dataset):
    """The dataset fields the device gathers from: observations (with the episode-final ones of a compact dataset)
    and next-observation indices, or next observations, and actions."""
    if dataset.compact:
        return dict(observations=dataset._obs_store, next_index=dataset._next_index[: dataset.size],
                    actions=dataset['actions'])  # fmt: skip
    return {k: dataset[k] for k in GATHERED}


class DeviceReplay:
    """The device copies a `training.seeds.SeedGroup` updates from: the dataset (shared by the seeds) and every
    seed's replay storage, uploaded from the host buffers on the first step and then kept in step by each packed
    step's transition."""

    def __init__(self, dataset, buffers, layout):
        self.dataset = dataset
        self.buffers = buffers  # One host replay buffer per seed (its `storage()` mirrors the device storage).
        self.layout = layout  # Of every packed step.
        self.data = None
        self.storage = None  # Every seed's storage, (S, rows, ...) leaves for several seeds.

    @classmethod
    def for_lanes(cls, lanes, num_updates):
        """The device replay of the lanes' online phase when their samplers are `RowSampler`s, else None."""
        if not isinstance(lanes[0].sampler, RowSampler):
            return None
        return cls(lanes[0].dataset, [lane.replay for lane in lanes], lanes[0].sampler.layout(num_updates))

    def upload(self, stacked):
        """Copies the dataset and the buffers' storage to the device (their state of now: the step being queued).
        The device storage has `padded_rows` rows, the rows past the buffers' never read."""
        host = {}
        for k in GATHERED:
            rows = [buffer.storage()[k] for buffer in self.buffers]
            # A new array (the device storage is updated in place), padded to its bucket of rows.
            padded = np.zeros((len(rows), padded_rows(len(rows[0])), *rows[0].shape[1:]), dtype=np.float32)
            for seed_rows, out in zip(rows, padded, strict=True):
                out[: len(seed_rows)] = seed_rows
            host[k] = padded if stacked else padded[0]
        self.data, self.storage = to_device((data_arrays(self.dataset), host))


def padded_rows(rows):
    """Device rows of a replay storage of `rows` rows: the next power of two, at least 1024, so that runs of nearby
    lengths (the rows of `main.py`'s storage are its online steps) run one compiled program, at most 2x the rows."""
    return max(1024, 1 << (int(rows) - 1).bit_length())


def to_device(tree):
    """The one host-to-device transfer of the online steps' inputs (explicit, so a transfer guard lets it pass)."""
    return jax.device_put(tree)
