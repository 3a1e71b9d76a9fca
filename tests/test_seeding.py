"""Random streams of a run: independent children of one SeedSequence, and the samplers that use them."""

import jax
import numpy as np
import pytest
from helpers import parse_run, tagged_episodes

import main_online
from training.actor import OnlineActor
from training.data import TRANSITION_KEYS, make_replay_buffer
from training.seeds import chunk_key
from utils import seeding
from utils.datasets import Dataset

N = 1000  # Transitions in the dataset and in the replay buffer: equal sizes make shared streams draw equal starts.


def chunk_starts(source, draws=20000):
    """The start index (tagged into the observations) of `draws` sampled chunks."""
    return source.sample_sequence(draws, 1, 0.99)['observations'][:, 0].astype(np.int64)


def test_streams_are_spawned_children_of_the_run_seed():
    children = np.random.SeedSequence(7).spawn(len(seeding.STREAMS))
    for child, name in zip(children, seeding.STREAMS, strict=True):
        np.testing.assert_array_equal(child.generate_state(4), seeding.stream(7, name).generate_state(4))
    # Reproducible per seed and name; different across names, seeds and sub-streams.
    draws = {
        (seed, name, *index): seeding.generator(seed, name, *index).integers(2**62)
        for seed in (0, 1)
        for name in seeding.STREAMS
        for index in ((), (1,))
    }
    assert len(set(draws.values())) == len(draws)
    assert seeding.generator(0, 'replay').integers(2**62) == draws[(0, 'replay')]
    with pytest.raises(ValueError, match='unknown random stream'):
        seeding.stream(0, 'buffer')


def test_dataset_and_replay_buffer_sample_independent_positions():
    fields = tagged_episodes([N])
    dataset = Dataset.create(**fields)
    dataset.seed(seeding.stream(0, 'dataset'))  # as `envs.make_run_envs` seeds the training data
    run = parse_run(main_online.PRESET, ['--buffer_size=2000'])
    replay = make_replay_buffer(run, dataset, seed=0)  # as the trainer builds the buffer of seed 0
    for t in range(N):
        replay.add_transition({k: fields[k][t] for k in TRANSITION_KEYS})
    r = np.corrcoef(chunk_starts(dataset), chunk_starts(replay))[0, 1]
    assert abs(r) < 0.05, r  # 20000 draws: |r| of independent streams stays near 0.01

    # What the run did before: both generators on the integer seed draw the same positions (the check can fail).
    same_seed = Dataset.create(seed=0, **fields), Dataset.create(seed=0, **fields)
    assert np.corrcoef(*(chunk_starts(d) for d in same_seed))[0, 1] > 0.99


def test_online_actor_streams_differ_from_the_agent_key():
    class Env:
        def reset(self, **kwargs):
            return np.zeros(3, np.float32), {}

    actor = OnlineActor(Env(), action_dim=2, seed=0)
    other = OnlineActor(Env(), action_dim=2, seed=0)
    np.testing.assert_array_equal(actor.random_action(), other.random_action())  # reproducible per seed
    # The agent's `create(seed)` splits PRNGKey(seed) for its init; the actor's chunk keys come from another stream.
    _, init_key = jax.random.split(jax.random.PRNGKey(0))
    assert not np.array_equal(np.asarray(chunk_key(actor.key_seed, 0)), np.asarray(init_key))
