"""CGQL (`agents/cgql.py`) from the math: the guided flow step by step for each mode, the time-conditioned critic's
squared-error and linex losses, what the actor loss trains, fused updates and the config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_dataset, sequential_updates_with_a_resume, tiny_config

from agents.cgql import CONFIG_RULES, CGQLAgent, paper_method
from utils.config_rules import check_config
from utils.errors import UsageError
from utils.flows import euler_flow

OBS_DIM, ACTION_DIM, H = 4, 2, 3
D = H * ACTION_DIM


@pytest.fixture(scope='module')
def dataset():
    return random_dataset(n=140, obs_dim=OBS_DIM, action_dim=ACTION_DIM, episode_length=7)


def make_agent(dataset, seed=0, **overrides):
    config = tiny_config('cgql', horizon_length=H, **overrides)
    return CGQLAgent.create(seed, dataset['observations'][0], dataset['actions'][0], config)


def max_abs(tree):
    return max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize('mode', ['simple', 'mse'])
def test_guided_flow_step_by_step(dataset, mode):
    agent = make_agent(dataset, mode=mode)
    obs = jnp.asarray(dataset['observations'][:5])
    noises = jax.random.normal(jax.random.PRNGKey(3), (5, D))
    flow, critic = agent.network.select('target_actor'), agent.network.select('critic')
    x = noises
    for i in range(3):
        t = jnp.full((5, 1), i / 3)
        vel = flow(obs, x, t)
        if i > 0:  # no guidance at t = 0, where it would divide by t
            score_t = jnp.ones_like(t) if mode == 'simple' else t
            score = jax.grad(lambda a, st=score_t: critic(obs, a, st).mean(axis=0).sum())(x)
            vel = vel + 0.1 * (10.0 * (1 - t) * score + x) / t
        x = x + vel / 3
    guided = agent.compute_flow_actions(obs, noises)
    np.testing.assert_allclose(guided, jnp.clip(x, -1, 1), rtol=1e-5, atol=1e-6)
    plain = agent.replace(config=agent.config.copy({'inv_temp': 0.0})).compute_flow_actions(obs, noises)
    np.testing.assert_allclose(plain, euler_flow(lambda a, t: flow(obs, a, t), noises, 3), rtol=1e-6)
    assert not np.allclose(plain, guided)
    assert agent.sample_actions(obs, rng=jax.random.PRNGKey(0)).shape == (5, D)
    assert agent.sample_actions(obs[0], rng=jax.random.PRNGKey(0)).shape == (D,)


@pytest.mark.parametrize('mode, isd_clip', [('mse', 5.0), ('linex', 5.0), ('linex', 1e-3)])
def test_time_conditioned_critic_loss_by_hand(dataset, mode, isd_clip):
    agent = make_agent(dataset, mode=mode, isd_clip=isd_clip)
    batch = dataset.sample_sequence(32, H, 0.99)
    valid = batch['valid'][:, -1]
    rng = jax.random.PRNGKey(5)
    loss, info = agent.critic_loss(batch, agent.network.params, rng)
    _, _, time_key, noise_key = jax.random.split(rng, 4)
    a = batch['actions'].reshape(32, -1)
    t = jax.random.uniform(time_key, (32, 1))
    noisy = (1 - t) * jax.random.normal(noise_key, a.shape) + t * a
    clean = np.asarray(agent.network.select('target_critic')(batch['observations'], a, jnp.ones((32, 1))))
    q_t = np.asarray(agent.network.select('critic')(batch['observations'], noisy, t))  # (3, 32)
    if mode == 'mse':
        expected = np.mean((q_t - clean) ** 2 * valid)
    else:
        delta = 10.0 * (clean - q_t)
        expected = np.mean(np.where(delta > isd_clip, delta, np.exp(np.minimum(delta, isd_clip)) + 10.0 * q_t) * valid)
        if isd_clip < 1:
            assert 0 < np.mean(delta > isd_clip) < 1  # both branches on this batch
    np.testing.assert_allclose(info['noisy_critic_loss'], expected, rtol=1e-5)
    np.testing.assert_allclose(loss, info['critic_loss'] + 0.1 * expected, rtol=1e-5)
    simple = agent.replace(config=agent.config.copy({'mode': 'simple'}))
    simple_loss, simple_info = simple.critic_loss(batch, agent.network.params, rng)
    assert 'noisy_critic_loss' not in simple_info and float(simple_loss) == float(simple_info['critic_loss'])


def test_the_actor_loss_trains_the_flow_only(dataset):
    agent = make_agent(dataset)
    batch = dataset.sample_sequence(16, H, 0.99)
    grads = jax.grad(lambda p: agent.actor_loss(batch, p, jax.random.PRNGKey(1))[0])(agent.network.params)
    assert max_abs(grads['modules_critic']) == 0 and max_abs(grads['modules_target_actor']) == 0
    assert max_abs(grads['modules_actor']) > 0


def test_batch_update_equals_sequential_updates(dataset, tmp_path):
    agent = make_agent(dataset, mode='linex')
    batches = [dataset.sample_sequence(16, H, 0.99) for _ in range(3)]
    sequential, info = sequential_updates_with_a_resume(agent, batches, tmp_path)  # and a resume
    fused, fused_info = agent.batch_update(jax.tree_util.tree_map(lambda *x: np.stack(x), *batches))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                           fused.network.params, sequential.network.params)  # fmt: skip
    np.testing.assert_allclose(fused_info['critic/noisy_critic_loss'], info['critic/noisy_critic_loss'], rtol=1e-4)


def test_names_and_bad_settings(dataset):
    assert [paper_method({'mode': m}) for m in ('simple', 'mse', 'linex')] == ['CGQL', 'CGQL-M', 'CGQL-L']
    assert paper_method({'mode': 'simple'}, 'qc') is None
    config = dict(tiny_config('cgql'))
    for key, value in [('mode', 'huber'), ('guidance_coef', -1.0), ('isd_clip', 0.0)]:
        with pytest.raises(UsageError, match=key):
            check_config({**config, key: value}, CONFIG_RULES, 'agents/cgql.py')
    check_config(config, CONFIG_RULES, 'agents/cgql.py')
    with pytest.raises(ValueError, match='num_qs >= 2'):
        make_agent(dataset, num_qs=1)
