"""One run seed, independent random streams: every generator of a run is a spawned child of `SeedSequence(seed)`.

A run draws from several generators: the offline data sampler, the replay buffer sampler, the warm-up random actions,
the evaluation starts and the online actor's JAX key (from `int_seed`). Seeding them all with the same integer makes
them the same stream (two samplers over equally sized data then draw nearly the same positions); spawned children of
one `np.random.SeedSequence` are statistically independent of each other and of the root, and each is still fixed by
the run seed alone. `stream(seed, name)` is the child `SeedSequence(seed).spawn(...)` would give at the index of
`name` in `STREAMS`; extra indices select sub-streams (the k-th dataset shard).

The agent's own JAX key stays `PRNGKey(seed)` (its `create` is the public API, as in the reference) and environments
are seeded with integers as before; neither shares a stream with these children."""

import numpy as np

STREAMS = ('dataset', 'val_dataset', 'replay', 'random_actions', 'evaluation', 'actor')


def stream(seed, name, *index):
    """The `SeedSequence` of stream `name` (one of `STREAMS`) of run seed `seed`; `index` picks a sub-stream."""
    if name not in STREAMS:
        raise ValueError(f'unknown random stream {name!r}; known: {", ".join(STREAMS)}')
    return np.random.SeedSequence(int(seed), spawn_key=(STREAMS.index(name), *index))


def generator(seed, name, *index):
    """A NumPy generator on `stream(seed, name, *index)`."""
    return np.random.default_rng(stream(seed, name, *index))


def int_seed(seed, name):
    """A 32-bit integer seed drawn from stream `name` of run seed `seed`, for APIs that take an integer (a JAX key)."""
    return int(stream(seed, name).generate_state(1, np.uint32)[0])
