"""Chunks gathered on the device (`training.device_replay`) are the host sampler's chunks, field for field, for the
same generator draws: on index-tagged data with episode ends, a replay ring that wrapped and a shared-prefix buffer."""

import jax
import numpy as np
import pytest
from helpers import tiny_acfql_config

from agents.acfql import ACFQLAgent
from training.data import LOSS_FIELDS, ChunkSampler
from training.device_replay import DeviceReplay, RowSampler, _unpack, gather
from training.seeds import SeedGroup
from utils.datasets import Dataset, PrefixReplayBuffer, ReplayBuffer

H, OBS, ACT = 3, 2, 2


def tagged(indices, ends=(), terminal_ends=()):
    """Transitions tagged by index: observation i is (i, i + 0.25), next observation i + 1 (-(i + 1) at an episode
    end: not the next row's), action (10 i, 10 i + 1), reward i + 1; `ends` and `terminal_ends` end episodes."""
    i = np.asarray(indices, dtype=np.float32)
    ends = np.isin(indices, ends) | np.isin(indices, terminal_ends)
    next_tag = np.where(ends, -(i + 1), i + 1)
    return dict(
        observations=np.stack([i, i + 0.25], axis=1),
        actions=np.stack([10 * i, 10 * i + 1], axis=1),
        rewards=i + 1,
        terminals=ends.astype(np.float32),
        masks=1.0 - np.isin(indices, terminal_ends).astype(np.float32),
        next_observations=np.stack([next_tag, next_tag + 0.25], axis=1),
    )


def dataset(n=40, compact=True):
    return Dataset.create(compact=compact, seed=1, **tagged(np.arange(n), ends=(9, 24), terminal_ends=(16,)))


def fill(buffer, start, count):
    """Adds `count` tagged transitions numbered from `start`; some end episodes."""
    indices = np.arange(start, start + count)
    fields = tagged(indices, ends=range(start + 4, start + count, 7), terminal_ends=(start + 2,))
    for j in range(count):
        buffer.add_transition({k: v[j] for k, v in fields.items()})


def host_and_device(sources, data, buffer, num_updates, discount=0.9):
    """The host sampler's batch and the device gather of the row sampler's packed step, for the same draws."""
    states = [source.rng.bit_generator.state for _, source, _ in sources]
    host = ChunkSampler(sources, H, discount).sample(num_updates)
    for (_, source, _), state in zip(sources, states, strict=True):
        source.rng.bit_generator.state = state
    rows = RowSampler(sources, H, discount, data, buffer)
    packed = rows.sample(num_updates)
    layout = rows.layout(num_updates)
    assert packed.shape == (layout.size(),)
    replay = DeviceReplay(data, [buffer], layout)
    replay.upload(stacked=False)
    row, transition, chunk_rows, scalars = jax.jit(_unpack, static_argnums=1)(packed, layout)
    device = jax.jit(gather)(replay.data, replay.storage, chunk_rows, scalars)
    newest_row, newest = buffer.newest()
    assert int(row) == newest_row
    for key, value in transition.items():
        np.testing.assert_array_equal(np.asarray(value), newest[key])
    return host, jax.device_get(device)


@pytest.mark.parametrize('compact', [True, False], ids=['compact', 'plain'])
def test_device_gather_equals_host_sampler_with_data_and_a_wrapped_ring(compact):
    data = dataset(compact=compact)
    example = {k: v[0] for k, v in tagged([0]).items()}
    buffer = ReplayBuffer.create(example, size=12, seed=2)
    fill(buffer, 100, 30)  # wrapped: the oldest of the 12 stored is transition 118, at physical row 6
    assert buffer.size == 12 and buffer.pointer == 6
    sources = [('data', data, 16), ('replay', buffer, 16)]  # `main_online.py`: half data, half replay
    host, device = host_and_device(sources, data, buffer, num_updates=3)
    assert set(device) == set(LOSS_FIELDS) == set(host)
    for key in LOSS_FIELDS:
        assert device[key].shape == host[key].shape and device[key].dtype == host[key].dtype, key
        np.testing.assert_array_equal(device[key], host[key], err_msg=key)
    # The draws cover episode ends, the terminal step and the ring's seam (no chunk joins newest and oldest).
    replay_tags = host['observations'][:, 16:, 0]
    assert replay_tags.min() >= 118 and (host['valid'] == 0).any() and (host['masks'] == 0).any()


def test_device_gather_equals_host_sampler_with_a_shared_prefix_that_wrapped():
    data = dataset()
    keys = ('observations', 'actions', 'rewards', 'terminals', 'masks', 'next_observations')
    buffer = PrefixReplayBuffer(data, capacity=50, keys=keys, online_capacity=20, seed=3)
    fill(buffer, 200, 15)  # 40 + 15 > 50: the 5 newest overwrote the 5 oldest prefix positions
    assert buffer.size == 50
    sources = [('replay', buffer, 24)]  # `main.py`: the buffer starts with the data
    host, device = host_and_device(sources, data, buffer, num_updates=4)
    for key in LOSS_FIELDS:
        np.testing.assert_array_equal(device[key], host[key], err_msg=key)
    starts = host['observations'][..., 0]
    assert (starts >= 200).any() and (starts < 40).any() and not (starts < 5).any()  # overwritten prefix gone


@pytest.mark.parametrize('seeds_per_vmap', [2, 1], ids=['vmapped', 'looped'])
@pytest.mark.slow
def test_seeds_on_device_replay_train_as_each_seed_alone(seeds_per_vmap):
    """Two seeds' packed steps in one call (vmapped, or one seed after the other inside it), the dataset shared and
    each seed's replay storage its own, give what each seed's steps give alone."""
    config = tiny_acfql_config(horizon_length=H, actor_hidden_dims=(8,), value_hidden_dims=(8,), batch_size=4,
                               actor_num_samples=2, flow_steps=2)  # fmt: skip
    example = {k: v[0] for k, v in tagged([0]).items()}

    def train(seeds, width):
        datasets = [dataset() for _ in seeds]  # the same data, a generator per seed
        for data, seed in zip(datasets, seeds, strict=True):
            data.rng = np.random.default_rng(seed)
        group = SeedGroup.create(ACFQLAgent, seeds, datasets[0]['observations'][:1], datasets[0]['actions'][:1],
                                 config, width)  # fmt: skip
        buffers, samplers = [], []
        for data, seed in zip(datasets, seeds, strict=True):
            buffers.append(ReplayBuffer.create(example, size=10, seed=seed))
            fill(buffers[-1], 100 * seed, 8)
            samplers.append(RowSampler([('data', data, 2), ('replay', buffers[-1], 2)], H, 0.99, data, buffers[-1]))
        group.replay = DeviceReplay(datasets[0], buffers, samplers[0].layout(2))
        group.fuse_steps = 2
        for step in range(4):  # two calls of two steps, U = 2; the rings wrap
            for buffer, seed in zip(buffers, seeds, strict=True):
                fill(buffer, 100 * seed + 8 + step, 1)
            group.queue_updates([sampler.sample(2) for sampler in samplers])
        group.run_held()
        assert group.updates == 2 and buffers[0].pointer == 2
        return group

    group = train((0, 1), seeds_per_vmap)
    params = [group.agent(i).network.params for i in range(2)]
    for i, seed in enumerate((0, 1)):
        alone = train((seed,), 1)
        jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-4, atol=2e-5), params[i],
                               alone.agent(0).network.params)  # fmt: skip
    assert not np.allclose(jax.tree_util.tree_leaves(params[0])[0], jax.tree_util.tree_leaves(params[1])[0])
