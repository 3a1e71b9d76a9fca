"""Shared driver pieces: fused offline blocks, block boundaries, dataset processing, the online actor."""

import gymnasium
import jax
import numpy as np
import pytest
from helpers import random_dataset, tagged_dataset, tiny_acfql_config

from agents.acfql import ACFQLAgent
from utils.training import OnlineActor, block_end, fused_updates, mean_metrics, process_dataset, stack_batches


def test_fused_blocks_equal_one_update_per_step():
    dataset_a = random_dataset(obs_dim=4, action_dim=2, seed=1)
    dataset_b = random_dataset(obs_dim=4, action_dim=2, seed=1)
    config = tiny_acfql_config(horizon_length=3, actor_type='best-of-n')
    agent = ACFQLAgent.create(0, dataset_a['observations'][:1], dataset_a['actions'][:1], config)

    per_step = agent
    for _ in range(6):
        per_step, info = per_step.update(dataset_a.sample_sequence(16, 3, 0.99))
    fused = agent
    for block in (4, 2):  # Blocks of different lengths, sampled in the same order from the same generator.
        batches = [dataset_b.sample_sequence(16, 3, 0.99) for _ in range(block)]
        fused, fused_info = fused_updates(fused, stack_batches(batches))

    leaves = zip(jax.tree_util.tree_leaves(per_step.network), jax.tree_util.tree_leaves(fused.network))
    for a, b in leaves:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(jax.random.key_data(per_step.rng), jax.random.key_data(fused.rng))
    # The block reports the info of its last update, as the per-step loop logs the info of that step.
    np.testing.assert_allclose(fused_info['critic/critic_loss'], info['critic/critic_loss'], rtol=1e-4)


@pytest.mark.parametrize(
    'step, max_steps, last, intervals, before, expected',
    [
        (0, 100, 1000, (5000,), (), 100),
        (0, 100, 30, (5000,), (), 30),  # never past the last step
        (90, 100, 1000, (5000, 95), (), 95),  # ends on a logging/eval step
        (95, 100, 1000, (95,), (), 190),
        (0, 100, 1000, (), (40,), 39),  # stops before a shard change...
        (39, 100, 1000, (), (40,), 79),  # ...which then starts the next block
        (7, 1, 1000, (3,), (4,), 8),
    ],
)
def test_block_end(step, max_steps, last, intervals, before, expected):
    assert block_end(step, max_steps, last, intervals, before) == expected


def test_process_dataset_proportion_sparse_and_compact():
    dataset = tagged_dataset((6, 4, 10))
    processed = process_dataset(dataset, dataset_proportion=0.5, sparse=True)
    assert processed.size == 10 and processed.compact
    np.testing.assert_array_equal(processed['observations'], dataset['observations'][:10])
    np.testing.assert_array_equal(processed['next_observations'], dataset['next_observations'][:10])
    np.testing.assert_array_equal(processed['rewards'], -1.0 * (dataset['rewards'][:10] != 0))


class CountingEnv(gymnasium.Env):
    """Observation = step index; ends (terminated) after 7 steps."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t == 7, False, {}


class ChunkAgent:
    """Returns a chunk of 3 actions whose entries count the calls."""

    def __init__(self):
        self.calls = 0

    def sample_actions(self, observations, rng):
        self.calls += 1
        return np.full(6, self.calls / 100.0, np.float32)


def test_online_actor_samples_a_chunk_only_when_the_queue_is_empty_and_clears_it_on_reset():
    actor = OnlineActor(CountingEnv(), action_dim=2, seed=0, reward_fn=lambda r: r - 1.0)
    agent = ChunkAgent()
    transitions = []
    for _ in range(10):
        transition, _, done = actor.step(agent)
        transitions.append((transition, done))
    # Steps 1-3 chunk 1, 4-6 chunk 2, step 7 chunk 3 then the episode ends and the queue is dropped.
    expected_calls = [1, 1, 1, 2, 2, 2, 3, 4, 4, 4]
    assert [round(t['actions'][0] * 100) for t, _ in transitions] == expected_calls
    done_steps = [i for i, (_, done) in enumerate(transitions) if done]
    assert done_steps == [6]
    t, _ = transitions[6]
    assert t['terminals'] == 1.0 and t['masks'] == 0.0 and t['rewards'] == 0.0
    assert transitions[7][0]['observations'][0] == 0.0  # the env was reset


def test_env_metrics_are_averaged_over_the_episodes_of_a_log_interval():
    rows = [{'episode.return': 1.0, 'episode.success': 0.0}, {'episode.return': 3.0, 'episode.success': 1.0}]
    assert mean_metrics(rows) == {'episode.return': 2.0, 'episode.success': 0.5, 'episodes': 2}
