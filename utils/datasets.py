"""Transition datasets and the replay buffer, with chunked (sequence) sampling for action-chunked agents.

Indices come in two kinds. A *physical* index addresses the storage arrays. A *logical* index counts stored
transitions from the oldest one, in time order. For a `Dataset` both are the same; a full `ReplayBuffer` is a ring,
and its oldest transition sits at the write pointer. Sampling works on logical indices so that a chunk never joins
the newest transition to the oldest.
"""

from collections.abc import Mapping

import numpy as np

AUG_PADDING = 3  # Pixels of edge padding before a random crop back to the original size (the reference's 3).
COMPARE_ROWS = 65536  # Rows compared at a time when building the compact layout.


def get_size(data):
    """Number of transitions: the largest leading dimension among the arrays of `data` (nested mappings too)."""
    return max(get_size(v) if isinstance(v, Mapping) else len(v) for v in data.values())


def random_crop(images, rng, padding=AUG_PADDING):
    """Randomly crops every image of a batch by up to `padding` pixels (edge padding keeps the size).

    `images` is a list of arrays that share the leading batch axis and have (h, w) as axes 1 and 2; each sample
    gets one crop offset, applied to all arrays so that observations and next observations stay aligned.
    """
    batch_size, height, width = images[0].shape[:3]
    dy = rng.integers(0, 2 * padding + 1, size=batch_size)
    dx = rng.integers(0, 2 * padding + 1, size=batch_size)
    rows = (dy[:, None] + np.arange(height))[:, :, None]  # (B, h, 1)
    cols = (dx[:, None] + np.arange(width))[:, None, :]  # (B, 1, w)
    batch = np.arange(batch_size)[:, None, None]
    out = []
    for img in images:
        pad = [(0, 0), (padding, padding), (padding, padding)] + [(0, 0)] * (img.ndim - 3)
        out.append(np.pad(img, pad, mode='edge')[batch, rows, cols])
    return out


def compact_next_observations(observations, next_observations):
    """Splits next observations into an index into `observations` plus the few that are not stored there.

    Returns (store, next_index): `store` is `observations` followed by every next observation that is not the
    following row's observation (episode ends), and `next_observations == store[next_index]` exactly.
    """
    n = len(observations)
    follows = np.zeros(n, dtype=bool)
    # Compared in slices so that no full-size temporary is built beside the data.
    for start in range(0, n - 1, COMPARE_ROWS):
        stop = min(start + COMPARE_ROWS, n - 1)
        same = next_observations[start:stop] == observations[start + 1 : stop + 1]
        follows[start:stop] = same.reshape(stop - start, -1).all(axis=1)
    ends = np.flatnonzero(~follows)
    index_dtype = np.int32 if n + len(ends) < 2**31 else np.int64
    next_index = np.arange(1, n + 1, dtype=index_dtype)
    next_index[ends] = n + np.arange(len(ends))
    store = np.concatenate([observations, next_observations[ends]], axis=0)
    return store, next_index


# The batch fields of `Dataset.sample_sequence`, in the reference's integration guide.
SEQUENCE_FIELDS = (
    'observations', 'full_observations', 'actions', 'next_observations', 'rewards', 'masks', 'terminals', 'valid',
)


class Dataset(Mapping):
    """An immutable mapping from field names to NumPy arrays of equal length, with its own random generator.

    Fields used by the samplers: `observations`, `actions`, `rewards`, `masks` (0 where the episode terminated
    by success/failure, so no bootstrapping), `terminals` (1 at the last step of every episode, time limits
    included) and `next_observations`.

    A compact dataset (`create(compact=True)`) stores every observation once: `next_observations` becomes an
    index into the observations plus the few episode-final observations. Sampling returns exactly the same
    arrays; reading `dataset['next_observations']` builds the full array on demand.
    """

    def __init__(self, fields, frame_stack=None, p_aug=None, seed=None, obs_store=None, next_index=None):
        self.source = None  # The file the data came from, for messages (set by the loaders).
        self._dict = dict(fields)
        self._obs_store = obs_store
        self._next_index = next_index
        self.size = get_size(self._dict)
        self.frame_stack = frame_stack
        self.p_aug = p_aug
        self.rng = np.random.default_rng(seed)

    @classmethod
    def create(cls, freeze=True, frame_stack=None, p_aug=None, seed=None, compact=False, **fields):
        """Builds a dataset from arrays given as keyword arguments.

        Args:
            freeze: Make the arrays read-only so that no caller changes the data by accident.
            frame_stack: Number of consecutive observations to concatenate on the last axis (None: no stacking).
            p_aug: Probability that a sampled batch of images is randomly cropped (None: never).
            seed: Seed of the dataset's own random generator.
            compact: Store each observation once (next observations by index); same samples, less memory.
            **fields: The arrays; `observations` is required.
        """
        if 'observations' not in fields:
            raise ValueError('A dataset needs an `observations` field.')
        fields = {k: np.asarray(v) for k, v in fields.items()}
        obs_store = next_index = None
        if compact and 'next_observations' in fields:
            obs_store, next_index = compact_next_observations(fields['observations'], fields.pop('next_observations'))
            fields['observations'] = obs_store[: len(next_index)]
        if freeze:
            for arr in [*fields.values(), obs_store, next_index]:
                if arr is not None:
                    arr.setflags(write=False)
        return cls(fields, frame_stack=frame_stack, p_aug=p_aug, seed=seed, obs_store=obs_store, next_index=next_index)

    @property
    def compact(self):
        """True when next observations are stored by index."""
        return self._next_index is not None

    def _keys(self):
        return [*self._dict, 'next_observations'] if self.compact else list(self._dict)

    def __getitem__(self, key):
        if key == 'next_observations' and self.compact:
            return self._obs_store[self._next_index[: self.size]]
        return self._dict[key]

    def __iter__(self):
        return iter(self._keys())

    def __len__(self):
        return len(self._keys())

    def nbytes(self):
        """Bytes held by the dataset's arrays (shared storage counted once)."""
        arrays = [v for k, v in self._dict.items() if not (self.compact and k == 'observations')]
        if self.compact:
            arrays += [self._obs_store, self._next_index]
        return int(sum(a.nbytes for a in arrays))

    def transition_nbytes(self):
        """Bytes of one transition with all its fields, next observation included (nothing is materialized)."""
        fields = sum(v[0].nbytes for v in self._dict.values())
        return fields + (self._dict['observations'][0].nbytes if self.compact else 0)

    def bytes_per_transition(self):
        """`nbytes()` per stored transition."""
        return self.nbytes() / max(self.size, 1)

    def _next_observations(self, phys):
        if self.compact:
            return self._obs_store[self._next_index[phys]]
        return self._dict['next_observations'][phys]

    def copy(self, add_or_replace=None):
        """A new dataset with some fields added or replaced, the same options and a generator in the same state."""
        updates = dict(add_or_replace or {})
        fields = dict(self._dict)
        obs_store, next_index = self._obs_store, self._next_index
        if self.compact and ('observations' in updates or 'next_observations' in updates):
            # New observations break the shared storage: fall back to two plain arrays.
            fields['next_observations'] = self['next_observations']
            obs_store = next_index = None
        fields.update(updates)
        new = Dataset(
            fields, frame_stack=self.frame_stack, p_aug=self.p_aug, obs_store=obs_store, next_index=next_index
        )
        new.rng.bit_generator.state = self.rng.bit_generator.state
        new.source = self.source
        return new

    def take_first(self, size):
        """The first `size` transitions as a new dataset (same options, generator state and layout)."""
        fields = {k: v[:size] for k, v in self._dict.items()}
        next_index = None if self._next_index is None else self._next_index[:size]
        new = Dataset(
            fields, frame_stack=self.frame_stack, p_aug=self.p_aug, obs_store=self._obs_store, next_index=next_index
        )
        new.rng.bit_generator.state = self.rng.bit_generator.state
        return new

    def seed(self, seed):
        """Reseeds the dataset's random generator."""
        self.rng = np.random.default_rng(seed)

    # Index bookkeeping (overridden by the replay buffer).

    def _physical(self, logical):
        return logical

    def get_subset(self, idxs):
        """Fields at the given physical indices."""
        subset = {k: v[idxs] for k, v in self._dict.items()}
        if self.compact:
            subset['next_observations'] = self._next_observations(idxs)
        return subset

    def _frame_indices(self, logical):
        """Logical indices of the `frame_stack` frames ending at `logical`, oldest first, clamped at episode starts."""
        terminals = self._dict['terminals']
        frames = [logical]
        cur = logical
        blocked = np.zeros(np.shape(logical), dtype=bool)
        for _ in range(self.frame_stack - 1):
            # `cur` starts an episode when it is the oldest stored step or the step before it was terminal.
            prev = np.maximum(cur - 1, 0)
            blocked |= (cur == 0) | (terminals[self._physical(prev)] > 0)
            cur = np.where(blocked, cur, prev)
            frames.append(cur)
        return frames[::-1]

    def _stacked_observations(self, logical):
        """Observations and next observations at `logical` (any shape), frame-stacked if enabled."""
        obs = self._dict['observations']
        if self.frame_stack is None:
            phys = self._physical(logical)
            return obs[phys], self._next_observations(phys)
        frames = [self._physical(f) for f in self._frame_indices(logical)]
        return np.concatenate([obs[f] for f in frames], axis=-1), self._stacked_next(frames)

    def _stacked_next(self, frames):
        """Frame-stacked next observations from the physical indices of the frames, oldest first."""
        obs = self._dict['observations']
        return np.concatenate([obs[f] for f in frames[1:]] + [self._next_observations(frames[-1])], axis=-1)

    def _augment(self, batch, keys):
        if self.p_aug is not None and self.rng.random() < self.p_aug:
            cropped = random_crop([batch[k] for k in keys], self.rng)
            batch.update(zip(keys, cropped))

    def example(self):
        """The oldest stored transition without a batch axis, shaped like one transition of a batch (frame-stacked when
        `frame_stack` is set; no augmentation, no random draw), e.g. for `Agent.create(seed, ex['observations'],
        ex['actions'], config)`."""
        logical = np.zeros(1, dtype=np.int64)
        batch = self.get_subset(self._physical(logical))
        if self.frame_stack is not None:
            batch['observations'], batch['next_observations'] = self._stacked_observations(logical)
        return {k: v[0] for k, v in batch.items()}

    def storage_rows(self, phys):
        """(own, rows) for physical indices `phys`: `own` marks the entries stored in this object's own rows
        (`storage()`), the others are rows of the dataset it starts from; a dataset's rows are all its own data
        rows, so `own` is False everywhere (the layout of `training.device_replay`)."""
        return np.zeros(np.shape(phys), dtype=bool), phys

    def draw_chunks(self, batch_size, sequence_length):
        """Logical indices (B, H) of `batch_size` chunks of `sequence_length` consecutive transitions, their starts
        uniform over the valid starts (one draw of the generator, as `sample_sequence` makes it)."""
        if self.size < sequence_length:
            raise ValueError(f'Cannot sample chunks of {sequence_length} steps from {self.size} transitions.')
        starts = self.rng.integers(0, self.size - sequence_length + 1, size=batch_size)
        return starts[:, None] + np.arange(sequence_length)  # (B, H)

    def chunk_scalars(self, phys, discount):
        """The per-step fields of the chunks at physical indices `phys` (B, H): `rewards`, `masks`, `terminals` and
        `valid` of `sample_sequence`, as float32 (rewards summed in float64 first)."""
        sequence_length = phys.shape[1]
        step_rewards = self._dict['rewards'][phys].astype(np.float64)  # (B, H)
        rewards = np.cumsum(step_rewards * discount ** np.arange(sequence_length), axis=1)
        masks = np.minimum.accumulate(self._dict['masks'][phys].astype(np.float32), axis=1)
        ended = np.maximum.accumulate(self._dict['terminals'][phys].astype(np.float32), axis=1)  # (B, H)
        valid = np.concatenate([np.ones((len(phys), 1), np.float32), 1.0 - ended[:, :-1]], axis=1)
        return dict(rewards=rewards.astype(np.float32), masks=masks, terminals=ended, valid=valid)

    def sample_sequence(self, batch_size, sequence_length, discount, fields=None):
        """Samples chunks of `sequence_length` consecutive transitions (start uniform over valid starts).

        Returns a dict (H = sequence_length) with the batch fields of the reference's integration guide:
            observations (B, ...): observation at the chunk start (frame-stacked when `frame_stack` is set).
            full_observations (B, H, obs) for states, (B, h, w, H, c) for images: observation at every step.
            actions (B, H, A): action at every step.
            next_observations (B, H, obs) for states, (B, h, w, H, c) for images: observation after every step
                (frame-stacked like `observations`: obs and c grow by the factor `frame_stack`).
            rewards (B, H): discounted partial returns, rewards[:, i] = sum_{j<=i} discount^j r_j.
            masks (B, H): running minimum of the per-step masks (0 once the episode terminated).
            terminals (B, H): running maximum of the per-step episode ends (1 from the step the episode ended on).
            valid (B, H): 1 at step 0 and 1 - terminals[:, i - 1] after, so steps past an episode end are invalid.
        `fields` (a collection of these names) returns only those; the trainer asks for what its losses read.
        """
        fields = SEQUENCE_FIELDS if fields is None else tuple(fields)
        logical = self.draw_chunks(batch_size, sequence_length)  # (B, H)
        phys = self._physical(logical)
        scalars = self.chunk_scalars(phys, discount)  # rewards, masks, terminals, valid: (B, H)

        obs = self._dict['observations']
        want_full = 'full_observations' in fields
        full = None
        if self.frame_stack is None:
            observations = obs[phys[:, 0]]
            if want_full:
                full = obs[phys]  # (B, H, ...)
            next_observations = self._next_observations(phys)  # (B, H, ...)
        else:
            # The chunk start's stack, every step's next stack, and every step's stack when asked for.
            frames = [self._physical(f) for f in self._frame_indices(logical)]  # frame_stack x (B, H)
            observations = np.concatenate([obs[f[:, 0]] for f in frames], axis=-1)
            if want_full:
                full = np.concatenate([obs[f] for f in frames], axis=-1)  # (B, H, ...)
            next_observations = self._stacked_next(frames)  # (B, H, ...)
        batch = dict(
            observations=observations,
            actions=self._dict['actions'][phys],  # (B, H, A)
            next_observations=next_observations,
            **scalars,
        )
        if full is not None:
            batch['full_observations'] = full
        batch = {k: batch[k] for k in fields}
        if next_observations.ndim >= 5:
            # Images: (B, H, h, w, c) -> (B, h, w, H, c), the layout the encoders expect per step.
            stepped = [k for k in ('next_observations', 'full_observations') if k in batch]
            for key in stepped:
                batch[key] = np.moveaxis(batch[key], 1, -2)
            self._augment(batch, [k for k in ('observations', *stepped) if k in batch])
        return batch


class ReplayBuffer(Dataset):
    """A fixed-capacity ring buffer of transitions; once full, each new transition overwrites the oldest."""

    def __init__(self, fields, frame_stack=None, p_aug=None, seed=None):
        super().__init__(fields, frame_stack=frame_stack, p_aug=p_aug, seed=seed)
        self.max_size = self.size
        self.size = 0
        self.pointer = 0

    @classmethod
    def create(cls, transition, size, frame_stack=None, p_aug=None, seed=None):
        """An empty buffer of capacity `size` whose fields have the shapes and dtypes of `transition`."""
        fields = {k: np.zeros((size, *np.shape(v)), dtype=np.asarray(v).dtype) for k, v in transition.items()}
        return cls(fields, frame_stack=frame_stack, p_aug=p_aug, seed=seed)

    @classmethod
    def create_from_initial_dataset(cls, init_dataset, size, frame_stack=None, p_aug=None, seed=None):
        """A buffer of capacity `size` holding a copy of `init_dataset`; new transitions are written after it."""
        n = get_size(init_dataset)
        if n > size:
            raise ValueError(f'The initial dataset ({n} transitions) does not fit a buffer of capacity {size}.')
        fields = {}
        for k, v in init_dataset.items():
            fields[k] = np.zeros((size, *v.shape[1:]), dtype=v.dtype)
            fields[k][:n] = v
        buffer = cls(fields, frame_stack=frame_stack, p_aug=p_aug, seed=seed)
        buffer.size = n
        buffer.pointer = n % size
        return buffer

    def _physical(self, logical):
        if self.size < self.max_size:
            return logical
        return (logical + self.pointer) % self.max_size

    def storage_rows(self, phys):
        """Every physical index is a row of the buffer's own storage (see `Dataset.storage_rows`)."""
        return np.ones(np.shape(phys), dtype=bool), phys

    def storage(self):
        """The arrays of the buffer's own rows, by field (a ring of `max_size` rows)."""
        return self._dict

    def newest(self):
        """(storage row, transition) of the transition added last."""
        row = (self.pointer - 1) % self.max_size
        return row, {k: v[row] for k, v in self._dict.items()}

    def add_transition(self, transition):
        """Writes one transition at the pointer, overwriting the oldest one when full."""
        for k, v in transition.items():
            self._dict[k][self.pointer] = v
        self.pointer = (self.pointer + 1) % self.max_size
        self.size = min(self.size + 1, self.max_size)

    def clear(self):
        """Forgets every stored transition (the storage is kept)."""
        self.size = self.pointer = 0

    def state_dict(self):
        """The stored transitions, write pointer and sampling generator state, for a checkpoint."""
        return dict(
            fields={k: v[: self.size] for k, v in self._dict.items()},
            size=self.size,
            pointer=self.pointer,
            rng=self.rng.bit_generator.state,
        )

    def load_state(self, state):
        """Restores `state_dict()` output into a buffer of the same capacity and fields."""
        size = state['size']
        if size > self.max_size or set(state['fields']) != set(self._dict):
            raise ValueError(f'checkpointed buffer ({size} transitions) does not fit this buffer ({self.max_size})')
        for k, v in state['fields'].items():
            self._dict[k][:size] = v
        self.size, self.pointer = size, state['pointer']
        self.rng.bit_generator.state = state['rng']


class _PrefixLayout:
    """Where each physical position of a `PrefixReplayBuffer` lives: the shared prefix, or an online row.

    Online transition k (0-based, in arrival order) sits at physical position (prefix_size + k) % capacity, as in
    a `ReplayBuffer` that started as a copy of the prefix, and is stored in online row k % online_capacity.
    """

    def __init__(self, prefix_size, capacity, online_capacity):
        self.prefix_size = prefix_size
        self.capacity = capacity
        self.online_capacity = online_capacity
        self.count = 0  # Online transitions added so far.

    def locate(self, phys):
        """(online rows, written): `written` is True where an online transition overwrote the position."""
        k0 = (phys - self.prefix_size) % self.capacity  # First online transition written at `phys`.
        written = k0 < self.count
        latest = k0 + self.capacity * (np.maximum(self.count - 1 - k0, 0) // self.capacity)
        return latest % self.online_capacity, written


class _PrefixColumn:
    """One field of a `PrefixReplayBuffer`, indexed by physical positions like a storage array."""

    def __init__(self, layout, read_prefix, online):
        self.layout = layout
        self.read_prefix = read_prefix  # Physical indices (< prefix_size) -> the prefix's values.
        self.online = online

    def __len__(self):
        return self.layout.capacity

    def __getitem__(self, phys):
        if isinstance(phys, slice):
            phys = np.arange(self.layout.capacity)[phys]
        phys = np.asarray(phys)
        rows, written = self.layout.locate(phys)
        if written.all():
            return self.online[rows]
        out = np.empty(phys.shape + self.online.shape[1:], dtype=self.online.dtype)
        out[written] = self.online[rows[written]]
        out[~written] = self.read_prefix(phys[~written])
        return out


class PrefixReplayBuffer(ReplayBuffer):
    """A replay buffer that starts with a dataset it shares instead of copying (several seeds, one dataset).

    It samples exactly what `ReplayBuffer.create_from_initial_dataset(prefix, capacity)` samples with the same
    generator: the prefix fills the first positions, new transitions are written after it and, once the ring is
    full, overwrite the oldest positions. Only the online transitions are stored here (`online_capacity` rows,
    enough for every step the run takes); the prefix is read in place, so S seeds hold one copy of the dataset.
    """

    def __init__(self, prefix, capacity, keys, online_capacity=None, frame_stack=None, p_aug=None, seed=None):
        n = prefix.size
        if n > capacity:
            raise ValueError(f'The initial dataset ({n} transitions) does not fit a buffer of capacity {capacity}.')
        online_capacity = capacity if online_capacity is None else max(1, min(online_capacity, capacity))
        self.prefix = prefix
        self.layout = _PrefixLayout(n, capacity, online_capacity)
        self.online = {}
        columns = {}
        for k in keys:
            example = np.asarray(prefix[k][0]) if k != 'next_observations' else prefix._next_observations(0)
            # np.zeros memory is only committed as rows are written.
            self.online[k] = np.zeros((online_capacity, *example.shape), dtype=example.dtype)
            read = prefix._next_observations if k == 'next_observations' else prefix._dict[k].__getitem__
            columns[k] = _PrefixColumn(self.layout, read, self.online[k])
        Dataset.__init__(self, columns, frame_stack=frame_stack, p_aug=p_aug, seed=seed)
        self.max_size = capacity
        self.size = n
        self.pointer = n % capacity

    def storage_rows(self, phys):
        """Online transitions are rows of `storage()`; the positions still holding the prefix are its rows."""
        rows, written = self.layout.locate(phys)
        return written, np.where(written, rows, phys)

    def storage(self):
        """The online rows by field (`online_capacity` rows, in arrival order modulo their number)."""
        return self.online

    def newest(self):
        """(online row, transition) of the transition added last."""
        row = (self.layout.count - 1) % self.layout.online_capacity
        return row, {k: v[row] for k, v in self.online.items()}

    def transition_nbytes(self):
        """Bytes of one stored online transition."""
        return sum(v[0].nbytes for v in self.online.values())

    def nbytes(self):
        """Bytes of the online rows written so far (the shared prefix is the dataset's)."""
        rows = min(self.layout.count, self.layout.online_capacity)
        return rows * self.transition_nbytes()

    def add_transition(self, transition):
        """Writes one transition after the previous one, overwriting the oldest once the ring is full."""
        row = self.layout.count % self.layout.online_capacity
        for k, v in transition.items():
            self.online[k][row] = v
        self.layout.count += 1
        self.pointer = (self.pointer + 1) % self.max_size
        self.size = min(self.size + 1, self.max_size)

    def clear(self):
        raise NotImplementedError('a PrefixReplayBuffer always holds its prefix')

    def state_dict(self):
        """The online transitions, counters and sampling generator state (the prefix is the run's dataset)."""
        rows = min(self.layout.count, self.layout.online_capacity)
        return dict(
            online={k: v[:rows] for k, v in self.online.items()},
            count=self.layout.count,
            size=self.size,
            pointer=self.pointer,
            rng=self.rng.bit_generator.state,
        )

    def load_state(self, state):
        """Restores `state_dict()` output into a buffer built on the same prefix with the same capacities."""
        rows = len(next(iter(state['online'].values()), ()))
        if rows > self.layout.online_capacity or set(state['online']) != set(self.online):
            raise ValueError(f'checkpointed buffer ({rows} online rows) does not fit this buffer')
        for k, v in state['online'].items():
            self.online[k][:rows] = v
        self.layout.count, self.size, self.pointer = state['count'], state['size'], state['pointer']
        self.rng.bit_generator.state = state['rng']
