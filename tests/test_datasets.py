"""Samplers on index-tagged data: contiguity, exact returns/masks/valid at episode ends, images, buffer wrap-around."""

import numpy as np
import pytest
from helpers import sample_transitions, tagged_dataset, tagged_episodes

from training.data import TRANSITION_KEYS
from utils.datasets import SEQUENCE_FIELDS, Dataset, PrefixReplayBuffer, ReplayBuffer

LENGTHS = (7, 5, 9, 4)  # Episode boundaries at t = 6, 11, 20, 24.
GAMMA = 0.9


def expected_chunk(fields, start, horizon, discount):
    """Hand-rolled chunk statistics from raw per-step fields, one step at a time."""
    rewards, masks, terminals, valid = [], [], [], []
    ret, mask, term = 0.0, 1.0, 0.0
    for i in range(horizon):
        t = start + i
        valid.append(1.0 if i == 0 else 1.0 - term)
        ret += discount**i * fields['rewards'][t]
        mask = min(mask, fields['masks'][t])
        term = max(term, fields['terminals'][t])
        rewards.append(ret)
        masks.append(mask)
        terminals.append(term)
    return np.array(rewards), np.array(masks), np.array(terminals), np.array(valid)


@pytest.mark.parametrize('horizon', [1, 3, 5])
def test_sample_sequence_matches_hand_rolled_chunks(horizon):
    fields = tagged_episodes(LENGTHS, success_episodes=(1,))
    dataset = Dataset.create(seed=1, **fields)
    batch = dataset.sample_sequence(512, horizon, GAMMA)
    starts = batch['observations'][:, 0].astype(int)

    # Starts are uniform over every index that leaves room for a full chunk, and nothing else.
    assert set(starts) == set(range(dataset.size - horizon + 1))
    assert batch['actions'].shape == (512, horizon, 2)
    assert batch['next_observations'].shape == (512, horizon, 3)
    assert set(batch) == set(SEQUENCE_FIELDS)
    assert batch['full_observations'].shape == (512, horizon, 3)
    for key in ('rewards', 'masks', 'terminals', 'valid'):
        assert batch[key].shape == (512, horizon) and batch[key].dtype == np.float32

    steps = starts[:, None] + np.arange(horizon)
    np.testing.assert_array_equal(batch['observations'][:, 0], steps[:, 0])
    np.testing.assert_array_equal(batch['full_observations'][..., 0], steps)
    np.testing.assert_array_equal(batch['next_observations'][..., 0], steps + 0.5)
    np.testing.assert_allclose(batch['actions'][..., 0], steps / 1000.0, rtol=1e-6)
    for b in range(0, 512, 7):
        rewards, masks, terminals, valid = expected_chunk(fields, starts[b], horizon, GAMMA)
        np.testing.assert_allclose(batch['rewards'][b], rewards, rtol=1e-6)
        np.testing.assert_array_equal(batch['masks'][b], masks)
        np.testing.assert_array_equal(batch['terminals'][b], terminals)
        np.testing.assert_array_equal(batch['valid'][b], valid)


def test_valid_and_masks_at_an_episode_end():
    # A chunk starting two steps before the successful end of episode 1 (t = 11) runs into episode 2.
    fields = tagged_episodes(LENGTHS, success_episodes=(1,))
    dataset = Dataset.create(seed=0, **fields)
    batch = None
    for _ in range(200):
        batch = dataset.sample_sequence(64, 4, 1.0)
        rows = np.nonzero(batch['observations'][:, 0] == 10)[0]
        if len(rows):
            break
    row = rows[0]
    np.testing.assert_array_equal(batch['valid'][row], [1, 1, 0, 0])
    np.testing.assert_array_equal(batch['masks'][row], [1, 0, 0, 0])
    np.testing.assert_allclose(batch['rewards'][row], np.cumsum([11, 12, 13, 14]))


def test_sampling_is_reproducible_for_a_seed_and_independent_of_global_numpy():
    a = tagged_dataset(LENGTHS, seed=3).sample_sequence(32, 3, GAMMA)
    np.random.seed(123)
    b = tagged_dataset(LENGTHS, seed=3).sample_sequence(32, 3, GAMMA)
    c = tagged_dataset(LENGTHS, seed=4).sample_sequence(32, 3, GAMMA)
    np.testing.assert_array_equal(a['observations'], b['observations'])
    assert not np.array_equal(a['observations'], c['observations'])


def test_image_sequences_use_height_width_horizon_channel_layout():
    dataset = tagged_dataset(LENGTHS, image_shape=(8, 6, 3))
    batch = dataset.sample_sequence(16, 3, GAMMA)
    starts = batch['observations'][:, 0, 0, 0].astype(int)
    assert batch['observations'].shape == (16, 8, 6, 3) and batch['observations'].dtype == np.uint8
    assert batch['next_observations'].shape == (16, 8, 6, 3, 3)
    for i in range(3):
        np.testing.assert_array_equal(batch['next_observations'][:, 2, 2, i, 0], starts + i + 1)


def test_frame_stack_clamps_at_episode_starts():
    dataset = tagged_dataset(LENGTHS, frame_stack=3, obs_dim=1)
    batch = sample_transitions(dataset, 256)
    starts = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]])
    t = batch['observations'][:, -1].astype(int)
    episode_start = starts[np.searchsorted(starts, t, side='right') - 1]
    expected = np.stack([np.maximum(t - 2, episode_start), np.maximum(t - 1, episode_start), t], axis=1)
    np.testing.assert_array_equal(batch['observations'], expected)
    expected_next = np.concatenate([expected[:, 1:], t[:, None] + 0.5], axis=1)
    np.testing.assert_array_equal(batch['next_observations'], expected_next)

    seq = dataset.sample_sequence(64, 2, GAMMA)
    assert seq['observations'].shape == (64, 3) and seq['next_observations'].shape == (64, 2, 3)
    # The next observation of step 0 is the stack one step later; of step 1, one more step later.
    t = seq['observations'][:, -1]
    np.testing.assert_array_equal(seq['next_observations'][:, 0, :2], seq['observations'][:, 1:])
    np.testing.assert_array_equal(seq['next_observations'][:, 0, -1], t + 0.5)
    ok = seq['valid'][:, 1] == 1
    np.testing.assert_array_equal(seq['next_observations'][ok, 1, -1], t[ok] + 1.5)

    example = dataset.example()
    np.testing.assert_array_equal(example['observations'], [0, 0, 0])
    np.testing.assert_array_equal(example['next_observations'], [0, 0, 0.5])
    assert example['actions'].shape == (2,)


def test_augmentation_keeps_shapes_and_crops_consistently():
    dataset = tagged_dataset(LENGTHS, image_shape=(12, 12, 3), p_aug=1.0)
    # Give every pixel a distinct value so that a shifted crop is visible.
    ramp = np.arange(144, dtype=np.uint8).reshape(12, 12, 1)
    obs = np.broadcast_to(ramp, (dataset.size, 12, 12, 3)).copy()
    dataset = Dataset.create(p_aug=1.0, seed=0, **{**dataset, 'observations': obs, 'next_observations': obs})
    batch = dataset.sample_sequence(32, 2, GAMMA)
    assert batch['observations'].shape == (32, 12, 12, 3) and batch['observations'].dtype == np.uint8
    assert batch['next_observations'].shape == (32, 12, 12, 2, 3)
    # One crop per sample, shared by the observation and every next observation of its chunk.
    np.testing.assert_array_equal(batch['next_observations'][..., 0, :], batch['observations'])
    np.testing.assert_array_equal(batch['next_observations'][..., 1, :], batch['observations'])
    assert not np.all(batch['observations'] == ramp)
    single = sample_transitions(dataset, 32)
    assert single['observations'].shape == (32, 12, 12, 3)


def test_dataset_is_frozen_and_copy_replaces_fields():
    dataset = tagged_dataset(LENGTHS)
    with pytest.raises(ValueError):
        dataset['rewards'][0] = 5.0
    shifted = dataset.copy(add_or_replace=dict(rewards=dataset['rewards'] - 1.0))
    np.testing.assert_array_equal(shifted['rewards'], dataset['rewards'] - 1.0)
    np.testing.assert_array_equal(shifted['observations'], dataset['observations'])
    assert shifted.size == dataset.size
    np.testing.assert_allclose(dataset.get_subset(np.array([3, 4]))['actions'][:, 0], [0.003, 0.004], rtol=1e-6)


def test_example_is_the_first_transition_shaped_like_one_sampled_row():
    dataset = tagged_dataset(LENGTHS)
    state = dataset.rng.bit_generator.state
    example = dataset.example()
    assert dataset.rng.bit_generator.state == state  # No random draw.
    row = sample_transitions(dataset, 1)
    assert example.keys() == row.keys()
    for key, value in example.items():
        assert value.shape == row[key].shape[1:] and value.dtype == row[key].dtype, key
        np.testing.assert_array_equal(value, dataset[key][0], err_msg=key)

    # Frame-stacked images, with augmentation on: stacked like `sample`, never cropped, and no draw.
    dataset = tagged_dataset(LENGTHS, image_shape=(8, 6, 3), frame_stack=3, p_aug=1.0)
    state = dataset.rng.bit_generator.state
    example = dataset.example()
    assert dataset.rng.bit_generator.state == state
    row = sample_transitions(dataset, 1)
    assert example.keys() == row.keys()
    for key, value in example.items():
        assert value.shape == row[key].shape[1:] and value.dtype == row[key].dtype, key
    assert example['observations'].shape == (8, 6, 9)
    # Step 0 starts its episode, so its stack repeats frame 0; the next stack ends with next_observations[0] = 1.
    np.testing.assert_array_equal(example['observations'], np.zeros((8, 6, 9)))
    np.testing.assert_array_equal(example['next_observations'], np.repeat([0, 0, 1], 3) * np.ones((8, 6, 1)))
    seq = dataset.sample_sequence(8, 2, GAMMA)
    assert seq['observations'].shape == (8, 8, 6, 9) and seq['next_observations'].shape == (8, 8, 6, 2, 9)


def transition(t, terminal=False, mask=1.0):
    return dict(
        observations=np.full(3, t, np.float32),
        actions=np.full(2, t / 1000.0, np.float32),
        rewards=np.float32(t + 1),
        terminals=np.float32(terminal),
        masks=np.float32(mask),
        next_observations=np.full(3, t + 0.5, np.float32),
    )


def test_replay_buffer_before_and_after_wrap_around():
    buffer = ReplayBuffer.create(transition(0), size=10, seed=0)
    for t in range(7):
        buffer.add_transition(transition(t))
    assert buffer.size == 7 and buffer.pointer == 7
    batch = buffer.sample_sequence(256, 3, GAMMA)
    starts = batch['observations'][:, 0].astype(int)
    assert set(starts) == set(range(5))

    for t in range(7, 15):
        buffer.add_transition(transition(t))
    # Full: size equals the capacity and the oldest stored step is 5, at the write pointer.
    assert buffer.size == 10 and buffer.pointer == 5
    batch = buffer.sample_sequence(2000, 3, GAMMA)
    starts = batch['observations'][:, 0].astype(int)
    assert set(starts) == set(range(5, 13))
    steps = batch['next_observations'][..., 0] - 0.5
    np.testing.assert_array_equal(steps[:, 0], starts)
    np.testing.assert_allclose(batch['actions'][..., 0], steps / 1000.0, rtol=1e-6)
    # Chunks are contiguous in time, also across the end of the storage array (step 9 -> 10 wraps from the last
    # slot to slot 0), and never join the newest step (14) to the oldest (5).
    np.testing.assert_array_equal(np.diff(steps, axis=1), 1.0)
    assert np.any((steps[:, 0] <= 9) & (steps[:, -1] >= 10))
    for b in range(0, 2000, 37):
        expected = [sum(GAMMA**j * (starts[b] + j + 1) for j in range(i + 1)) for i in range(3)]
        np.testing.assert_allclose(batch['rewards'][b], expected, rtol=1e-6)
    single = sample_transitions(buffer, 500)
    assert set(single['observations'][:, 0].astype(int)) == set(range(5, 15))
    # The example transition is the oldest stored one, at the write pointer.
    assert buffer.example()['observations'][0] == 5.0

    buffer.clear()
    assert buffer.size == 0 and buffer.pointer == 0


def test_masks_and_valid_are_exact_at_episode_ends_across_the_wrap_around():
    # Steps 0..14 in a buffer of 10: it holds 5..14, step 9 in the last slot and step 10 in slot 0. Episodes end at
    # step 8 (a success: mask 0), at step 10 (a time limit: mask 1, right after the wrap) and at step 14.
    ends, successes = (8, 10, 14), (8,)
    buffer = ReplayBuffer.create(transition(0), size=10, seed=0)
    for t in range(15):
        buffer.add_transition(transition(t, terminal=t in ends, mask=0.0 if t in successes else 1.0))
    steps = np.arange(15)
    fields = dict(
        rewards=steps + 1.0,
        masks=np.where(np.isin(steps, successes), 0.0, 1.0),
        terminals=np.isin(steps, ends).astype(float),
    )
    batch = buffer.sample_sequence(1000, 4, GAMMA)
    starts = batch['observations'][:, 0].astype(int)
    assert set(starts) == set(range(5, 12))
    np.testing.assert_array_equal(batch['next_observations'][..., 0], starts[:, None] + np.arange(4) + 0.5)
    np.testing.assert_allclose(batch['actions'][..., 0], (starts[:, None] + np.arange(4)) / 1000.0, rtol=1e-6)
    for start in range(5, 12):
        rows = starts == start
        rewards, masks, _, valid = expected_chunk(fields, start, 4, GAMMA)
        np.testing.assert_allclose(batch['rewards'][rows], np.broadcast_to(rewards, (rows.sum(), 4)), rtol=1e-6)
        np.testing.assert_array_equal(batch['masks'][rows], np.broadcast_to(masks, (rows.sum(), 4)))
        np.testing.assert_array_equal(batch['valid'][rows], np.broadcast_to(valid, (rows.sum(), 4)))
    # Spot values: the chunk 7..10 stops at the success (8); the chunk 9..12 crosses the wrap and the time limit.
    row = np.nonzero(starts == 7)[0][0]
    np.testing.assert_array_equal(batch['valid'][row], [1, 1, 0, 0])
    np.testing.assert_array_equal(batch['masks'][row], [1, 0, 0, 0])
    row = np.nonzero(starts == 9)[0][0]
    np.testing.assert_array_equal(batch['valid'][row], [1, 1, 0, 0])
    np.testing.assert_array_equal(batch['masks'][row], [1, 1, 1, 1])


def test_frame_stack_in_a_full_buffer_never_reaches_past_the_oldest_step():
    buffer = ReplayBuffer.create(transition(0), size=6, frame_stack=3, seed=0)
    for t in range(9):
        buffer.add_transition(transition(t))
    batch = sample_transitions(buffer, 200)
    t = batch['observations'][:, -1].astype(int)
    oldest = 3
    expected = np.stack([np.maximum(t - 2, oldest), np.maximum(t - 1, oldest), t], axis=1)
    np.testing.assert_array_equal(batch['observations'][:, [0, 3, 6]], expected)


def test_replay_buffer_from_initial_dataset_continues_the_offline_data():
    dataset = Dataset.create(**tagged_episodes((4, 3)))  # 7 transitions (and 6 fields: sizes must not mix up).
    buffer = ReplayBuffer.create_from_initial_dataset(dataset, size=10, seed=0)
    assert buffer.size == 7 and buffer.pointer == 7 and buffer.max_size == 10
    np.testing.assert_array_equal(buffer['observations'][:7], dataset['observations'])
    buffer.add_transition(transition(7))
    buffer.add_transition(transition(8, terminal=True))
    assert buffer.size == 9
    np.testing.assert_array_equal(buffer['observations'][:9, 0], np.arange(9))
    batch = buffer.sample_sequence(300, 2, GAMMA)
    assert set(batch['observations'][:, 0].astype(int)) == set(range(8))
    # The offline data is untouched and still read-only.
    assert not dataset['observations'].flags.writeable
    with pytest.raises(ValueError):
        ReplayBuffer.create_from_initial_dataset(dataset, size=6)


@pytest.mark.parametrize('kind', ['state', 'image', 'frame_stack'])
def test_compact_layout_samples_exactly_like_duplicated_next_observations(kind):
    options = dict(frame_stack=3) if kind == 'frame_stack' else {}
    fields = tagged_episodes(LENGTHS, image_shape=(6, 6, 2) if kind == 'image' else None)
    if kind != 'image':
        # Within an episode the next observation is the following row's; at episode ends it is not stored there.
        fields['next_observations'] = np.concatenate([fields['observations'][1:], fields['observations'][-1:] + 100])
        ends = np.cumsum(LENGTHS) - 1
        fields['next_observations'][ends] = fields['observations'][ends] + 0.5
    full = Dataset.create(seed=5, **fields, **options)
    compact = Dataset.create(seed=5, compact=True, **fields, **options)
    assert compact.compact and not full.compact
    for _ in range(3):
        a, b = full.sample_sequence(64, 4, GAMMA), compact.sample_sequence(64, 4, GAMMA)
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        a, b = sample_transitions(full, 32), sample_transitions(compact, 32)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    np.testing.assert_array_equal(compact['next_observations'], full['next_observations'])
    assert set(compact) == set(full)
    if kind == 'state':
        # Only the episode-final next observations are stored a second time, plus an index per transition.
        row_bytes = fields['observations'][0].nbytes
        expected = full.nbytes() - fields['next_observations'].nbytes + len(LENGTHS) * row_bytes + 4 * full.size
        assert compact.nbytes() == expected
    half = compact.take_first(10)
    assert half.size == 10 and half.compact
    np.testing.assert_array_equal(half['next_observations'], full['next_observations'][:10])


@pytest.mark.parametrize('frame_stack', [None, 3])
@pytest.mark.parametrize('compact', [False, True])
def test_prefix_buffer_samples_what_a_copying_buffer_samples(frame_stack, compact):
    """A buffer reading its initial data in place equals one that copied it, through the ring's wrap-around."""
    dataset = Dataset.create(seed=0, compact=compact, frame_stack=frame_stack, **tagged_episodes([7, 9, 5]))
    copying = ReplayBuffer.create_from_initial_dataset(dataset, size=30, frame_stack=frame_stack, seed=3)
    sharing = PrefixReplayBuffer(dataset, 30, TRANSITION_KEYS, online_capacity=25, frame_stack=frame_stack, seed=3)
    for step in range(25):  # 21 + 25 transitions in a ring of 30: the online ones overwrite the oldest.
        t = 100 + step
        transition = dict(
            observations=np.full(3, t, np.float32), actions=np.full(2, t, np.float32), rewards=np.float32(t),
            terminals=np.float32(step % 6 == 5), masks=np.float32(step % 12 != 11),
            next_observations=np.full(3, t + 0.5, np.float32),
        )  # fmt: skip
        copying.add_transition(transition)
        sharing.add_transition(transition)
        assert (sharing.size, sharing.pointer) == (copying.size, copying.pointer)
        a, b = copying.sample_sequence(8, 3, 0.9), sharing.sample_sequence(8, 3, 0.9)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f'{k} after {step + 1} online steps')
    assert np.shares_memory(sharing.prefix['actions'], dataset['actions'])
    assert sharing.nbytes() == 25 * sharing.transition_nbytes()
    # A checkpointed buffer holds only the online rows and restores the same samples.
    state = sharing.state_dict()
    assert len(state['online']['actions']) == 25
    restored = PrefixReplayBuffer(dataset, 30, TRANSITION_KEYS, online_capacity=25, frame_stack=frame_stack, seed=9)
    restored.load_state(state)
    a, b = sharing.sample_sequence(8, 3, 0.9), restored.sample_sequence(8, 3, 0.9)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_random_crop_shifts_by_up_to_the_reference_padding():
    from utils.datasets import AUG_PADDING, random_crop

    assert AUG_PADDING == 3  # The reference pads 3 pixels before cropping.
    # Pixel (r, c) holds r * 100 + c, so a crop's offset is read from its top-left pixel (interior images only).
    h = w = 20
    image = (np.arange(h)[:, None] * 100 + np.arange(w)[None, :]).astype(np.int32)[None, :, :, None]
    images = np.repeat(image, 2000, axis=0)
    (cropped,) = random_crop([images], np.random.default_rng(0))
    centre = cropped[:, 10, 10, 0]
    dy, dx = centre // 100 - 10, centre % 100 - 10
    assert set(dy.tolist()) == set(dx.tolist()) == set(range(-3, 4))  # Every shift in [-3, 3] occurs, no other.
