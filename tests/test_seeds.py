"""A SeedStack of S seeds computes what S single-seed agents compute (up to float rounding of the vmapped program)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_dataset, tiny_acfql_config

from agents.acfql import ACFQLAgent
from agents.acrlpd import ACRLPDAgent
from agents.acrlpd import get_config as acrlpd_config
from training.seeds import SeedStack

SEEDS = (0, 1, 2)
H = 3
# vmapped matmuls may be batched differently from single ones, so results agree to float32 rounding, not bit for bit.
TOL = dict(rtol=1e-4, atol=1e-5)


def tiny_acrlpd_config():
    config = acrlpd_config()
    config.horizon_length = H
    config.actor_hidden_dims = (32, 32)
    config.value_hidden_dims = (32, 32)
    config.num_qs = 3
    config.batch_size = 16
    return config


CASES = {
    'acfql-best-of-n': (ACFQLAgent, lambda: tiny_acfql_config(H, actor_type='best-of-n')),
    'acfql-distill-ddpg': (ACFQLAgent, lambda: tiny_acfql_config(H, actor_type='distill-ddpg')),
    'acrlpd': (ACRLPDAgent, tiny_acrlpd_config),
}


def stack(trees):
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *trees)


def assert_trees_close(a, b):
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), **TOL), a, b)


@pytest.mark.parametrize('case', sorted(CASES))
def test_seed_stack_matches_single_seed_agents(case):
    agent_class, make_config = CASES[case]
    config = make_config()
    dataset = random_dataset(obs_dim=5, action_dim=2)
    example = dataset.example()
    singles = [agent_class.create(s, example['observations'], example['actions'], config) for s in SEEDS]
    seeds = SeedStack.create(agent_class, SEEDS, example['observations'], example['actions'], config)
    assert seeds.num_seeds == len(SEEDS)
    for i, single in enumerate(singles):
        # Creation is exact: the same initializers run on the same keys.
        jax.tree_util.tree_map(np.testing.assert_array_equal, seeds.seed(i).network.params, single.network.params)

    # Each seed gets its own batches, as each seed's own sampler would draw them.
    batches = [[dataset.sample_sequence(16, H, config.discount) for _ in range(2)] for _ in SEEDS]
    seeds, info = seeds.update(stack([b[0] for b in batches]))
    singles_info = []
    for i in range(len(SEEDS)):
        singles[i], single_info = singles[i].update(batches[i][0])
        singles_info.append(single_info)
    assert_trees_close(info, stack(singles_info))

    # A fused block of U=1 per seed, then sampling with one key per seed.
    block = stack([stack([b[1]]) for b in batches])  # leaves (S, U, B, ...)
    seeds, info = seeds.batch_update(block)
    for i in range(len(SEEDS)):
        singles[i], single_info = singles[i].batch_update(stack([batches[i][1]]))
        assert_trees_close(jax.tree_util.tree_map(lambda x, i=i: x[i], info), single_info)
        assert_trees_close(seeds.seed(i).network.params, singles[i].network.params)

    obs = np.stack([dataset['observations'][:4]] * len(SEEDS))  # (S, 4, obs_dim)
    rngs = jnp.stack([jax.random.PRNGKey(10 + s) for s in SEEDS])
    actions = seeds.sample_actions(obs, rngs)  # (S, 4, H * A)
    assert actions.shape == (len(SEEDS), 4, H * 2)
    for i in range(len(SEEDS)):
        np.testing.assert_allclose(actions[i], singles[i].sample_actions(obs[i], rng=rngs[i]), **TOL)
