"""FBRAC (`agents/fbrac.py`) and IFQL (`agents/ifql.py`) from the math: FBRAC's Q term backpropagated through the
flow, IFQL's expectile value and in-sample critic, both samplers' best-of-N, fused updates and the config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_dataset, sequential_updates_with_a_resume, tiny_config

from agents import agents, fbrac, ifql
from utils.config_rules import check_config
from utils.errors import UsageError

OBS_DIM, ACTION_DIM, H = 4, 2, 3
D = H * ACTION_DIM


@pytest.fixture(scope='module')
def dataset():
    return random_dataset(n=140, obs_dim=OBS_DIM, action_dim=ACTION_DIM, episode_length=7)


def make(dataset, module, **overrides):
    config = tiny_config(module.__name__.split('.')[-1], horizon_length=H, **overrides)
    return agents[config.agent_name].create(0, dataset['observations'][0], dataset['actions'][0], config)


def max_abs(tree):
    return max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(tree))


def test_fbrac_q_term_reaches_the_flow_through_its_steps(dataset):
    agent = make(dataset, fbrac, alpha=2.0)
    batch = dataset.sample_sequence(16, H, 0.99)
    rng = jax.random.PRNGKey(3)
    loss, info = agent.actor_loss(batch, agent.network.params, rng)
    noise = jax.random.normal(jax.random.split(jax.random.split(rng, 3)[0])[1], (16, D))
    chunks = agent.compute_flow_actions(batch['observations'], noise)
    q = agent.network.select('critic')(batch['observations'], chunks).mean(axis=0)
    np.testing.assert_allclose(info['q_loss'], -q.mean(), rtol=1e-5)
    np.testing.assert_allclose(loss, info['bc_flow_loss'] - q.mean() / 2.0, rtol=1e-5)

    def flow_grads(alpha):
        a = agent.replace(config=agent.config.copy({'alpha': alpha}))
        return jax.grad(lambda p: a.actor_loss(batch, p, rng)[0])(agent.network.params)

    weak, strong = flow_grads(1e6), flow_grads(0.5)
    gap = jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), weak['modules_actor_flow'],
                                 strong['modules_actor_flow'])  # fmt: skip
    assert max(jax.tree_util.tree_leaves(gap)) > 1e-4  # the Q term moves the flow (BPTT)
    assert max_abs(strong['modules_critic']) == 0


@pytest.mark.parametrize('module', [fbrac, ifql], ids=['fbrac', 'ifql'])
def test_sampling_keeps_the_best_flow_chunk(dataset, module):
    n = 4
    agent = make(dataset, module, **({'best_of_n': n} if module is fbrac else {}))
    obs = jnp.asarray(dataset['observations'][:3])
    rng = jax.random.PRNGKey(8)
    chosen = agent.sample_actions(obs, rng=rng)
    obs_rep = jnp.repeat(obs[:, None], n, axis=1)
    name = 'actor_flow'
    x = jax.random.normal(rng, (3, n, D))
    for i in range(3):
        x = x + agent.network.select(name)(obs_rep, x, jnp.full((3, n, 1), i / 3)) / 3
    x = jnp.clip(x, -1, 1)
    qs = np.asarray(agent.network.select('critic')(obs_rep, x))  # (num_qs, 3, n)
    score = qs.mean(0) if module is fbrac else qs.min(0)  # IFQL ranks by the ensemble's minimum
    np.testing.assert_allclose(chosen, np.asarray(x)[np.arange(3), score.argmax(1)], rtol=1e-5, atol=1e-6)
    assert agent.sample_actions(obs[0], rng=rng).shape == (D,)


def test_ifql_value_and_critic_by_hand(dataset):
    agent = make(dataset, ifql, kappa=0.8, rho=0.5)
    batch = dataset.sample_sequence(32, H, 0.99)
    _, info = agent.value_loss(batch, agent.network.params, None)
    a = batch['actions'].reshape(32, -1)
    qs = np.asarray(agent.network.select('target_critic')(batch['observations'], a))
    q = qs.mean(0) - 0.5 * qs.std(0)
    v = np.asarray(agent.network.select('value')(batch['observations']))
    diff = q - v
    np.testing.assert_allclose(info['value_loss'], np.mean(np.where(diff >= 0, 0.8, 0.2) * diff**2), rtol=1e-5)
    np.testing.assert_allclose(ifql.expectile_loss(jnp.asarray([2.0, -2.0]), 0.9), [3.6, 0.4], rtol=1e-6)
    loss, _ = agent.critic_loss(batch, agent.network.params, None)
    next_v = np.asarray(agent.network.select('value')(batch['next_observations'][:, -1]))
    target = batch['rewards'][:, -1] + 0.99**H * batch['masks'][:, -1] * next_v
    critic = np.asarray(agent.network.select('critic')(batch['observations'], a))
    np.testing.assert_allclose(loss, np.mean((critic - target) ** 2 * batch['valid'][:, -1]), rtol=1e-5)


@pytest.mark.parametrize('module', [fbrac, ifql], ids=['fbrac', 'ifql'])
def test_batch_update_equals_sequential_updates(dataset, module, tmp_path):
    agent = make(dataset, module)
    batches = [dataset.sample_sequence(16, H, 0.99) for _ in range(3)]
    sequential, _ = sequential_updates_with_a_resume(agent, batches, tmp_path)  # and a resume
    fused, _ = agent.batch_update(jax.tree_util.tree_map(lambda *x: np.stack(x), *batches))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                           fused.network.params, sequential.network.params)  # fmt: skip
    assert max_abs(jax.tree_util.tree_map(lambda a, b: a - b, fused.network.params, agent.network.params)) > 0


def test_bad_settings_are_refused():
    cases = [(fbrac, [('alpha', 0.0), ('best_of_n', 0)]),
             (ifql, [('kappa', 1.5), ('num_samples', 0)])]  # fmt: skip
    for module, bad in cases:
        config = dict(tiny_config(module.__name__.split('.')[-1]))
        for key, value in bad:
            with pytest.raises(UsageError, match=key):
                check_config({**config, key: value}, module.CONFIG_RULES, 'agents/x.py')
        check_config(config, module.CONFIG_RULES, 'agents/x.py')
