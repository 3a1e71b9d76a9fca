"""BAM (`agents/bam.py`) and FAWAC (`agents/fawac.py`) from the math: BAM's memoryless SDE and its KL penalty by
hand, its Q term backpropagated through the SDE, FAWAC's advantage weights and value, sampling, fused updates and
the config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_dataset, sequential_updates_with_a_resume, tiny_config

from agents import agents, bam, fawac
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


def perturbed(agent, *modules, scale=0.3, seed=1):
    params = dict(agent.network.params)
    for i, name in enumerate(modules):
        leaves, treedef = jax.tree_util.tree_flatten(params[f'modules_{name}'])
        keys = jax.random.split(jax.random.PRNGKey(seed + i), len(leaves))
        params[f'modules_{name}'] = jax.tree_util.tree_unflatten(
            treedef, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])  # fmt: skip
    return agent.replace(network=agent.network.replace(params=params))


def max_abs(tree):
    return max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize('residual', [False, True])
def test_bam_loss_through_the_memoryless_sde_by_hand(dataset, residual):
    agent = perturbed(make(dataset, bam, residual=residual, rho=0.5), 'actor_fast')
    batch = dataset.sample_sequence(16, H, 0.99)
    rng = jax.random.PRNGKey(4)
    _, info = agent.actor_loss(batch, agent.network.params, rng)
    sde_key = jax.random.split(rng, 4)[3]
    obs = jnp.asarray(batch['observations'])
    fast, base = agent.network.select('actor_fast'), agent.network.select('target_actor_slow')
    h, x, penalty = 1 / 3, jax.random.normal(sde_key, (16, D)), 0.0
    for i, key in enumerate(jax.random.split(sde_key, 3)):
        t = jnp.full((16, 1), i / 3)
        sigma = jnp.sqrt(2 * (1 - t + h) / (t + h))
        if i < 2:
            v_fast, v_base = fast(obs, x, t), base(obs, x, t)
            v = v_fast + v_base if residual else v_fast
            penalty = penalty + jnp.sum((v - v_base) ** 2, axis=-1) * 2 / sigma[:, 0] ** 2
            x = x + h * (2 * v - x / (t + h)) + jnp.sqrt(h) * sigma * jax.random.normal(key, x.shape)
        else:
            x = x + h * base(obs, x, t)
    qs = np.asarray(agent.network.select('critic')(obs, x))
    q = (qs.mean(0) - 0.5 * qs.std(0)).mean()
    np.testing.assert_allclose(info['bc_loss'], penalty.mean(), rtol=1e-5)
    np.testing.assert_allclose(info['bam_loss'], -10.0 * q + penalty.mean(), rtol=1e-5, atol=1e-6)
    # The Q term reaches the fine-tuned flow (through every SDE step), never the critic or the BC flow's target.
    grads = jax.grad(lambda p: agent.actor_loss(batch, p, rng)[0])(agent.network.params)
    assert max_abs(grads['modules_actor_fast']) > 0
    assert max_abs(grads['modules_critic']) == 0 and max_abs(grads['modules_target_actor_slow']) == 0


def test_bam_acts_with_the_fine_tuned_flow_or_the_bc_flow_at_zero_temperature(dataset):
    agent = perturbed(make(dataset, bam, best_of_n=3), 'actor_fast')
    obs = jnp.asarray(dataset['observations'][:4])
    rng = jax.random.PRNGKey(2)
    noises = jax.random.normal(rng, (4, 3, D))
    obs_rep = jnp.repeat(obs[:, None], 3, axis=1)

    def flow_of(name):
        x = noises
        for i in range(3):
            x = x + agent.network.select(name)(obs_rep, x, jnp.full((4, 3, 1), i / 3)) / 3
        x = jnp.clip(x, -1, 1)
        q = np.asarray(agent.network.select('critic')(obs_rep, x).mean(axis=0))
        return np.asarray(x)[np.arange(4), q.argmax(1)]

    np.testing.assert_allclose(agent.sample_actions(obs, rng=rng), flow_of('actor_fast'), rtol=1e-5, atol=1e-6)
    bc = agent.replace(config=agent.config.copy({'inv_temp': 0.0}))
    np.testing.assert_allclose(bc.sample_actions(obs, rng=rng), flow_of('actor_slow'), rtol=1e-5, atol=1e-6)


def test_fawac_weights_and_value_by_hand(dataset):
    agent = perturbed(make(dataset, fawac, inv_temp=3.0), 'critic', scale=1.0)
    batch = dataset.sample_sequence(32, H, 0.99)
    valid = batch['valid'][:, -1]
    rng = jax.random.PRNGKey(7)
    loss, info = agent.actor_loss(batch, agent.network.params, rng)
    _, noise_key, time_key = jax.random.split(rng, 3)
    a = batch['actions'].reshape(32, -1)
    x_0 = jax.random.normal(noise_key, a.shape)
    t = jax.random.uniform(time_key, (32, 1))
    obs = batch['observations']
    err = np.mean((np.asarray(agent.network.select('actor')(obs, (1 - t) * x_0 + t * a, t)) - (a - x_0)) ** 2, -1)
    adv = np.asarray(agent.network.select('critic')(obs, a)).mean(0) - np.asarray(agent.network.select('value')(obs))
    weight = np.minimum(np.exp(3.0 * adv), 100.0)
    assert weight.max() == 100.0  # the cap applies on this batch
    np.testing.assert_allclose(loss, np.mean(err * weight * valid), rtol=1e-5)
    _, critic_info = agent.critic_loss(batch, agent.network.params, rng)
    target = np.asarray(agent.network.select('target_critic')(obs, a))
    v = np.asarray(agent.network.select('value')(obs))
    np.testing.assert_allclose(critic_info['value_loss'], np.mean((target - v) ** 2 * valid), rtol=1e-5)
    grads = jax.grad(lambda p: agent.actor_loss(batch, p, rng)[0])(agent.network.params)
    assert max_abs(grads['modules_critic']) == 0 and max_abs(grads['modules_value']) == 0  # weights are targets


@pytest.mark.parametrize('module', [bam, fawac], ids=['bam', 'fawac'])
def test_batch_update_equals_sequential_updates(dataset, module, tmp_path):
    agent = make(dataset, module)
    batches = [dataset.sample_sequence(16, H, 0.99) for _ in range(3)]
    sequential, _ = sequential_updates_with_a_resume(agent, batches, tmp_path)  # and a resume
    fused, _ = agent.batch_update(jax.tree_util.tree_map(lambda *x: np.stack(x), *batches))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                           fused.network.params, sequential.network.params)  # fmt: skip
    assert max_abs(jax.tree_util.tree_map(lambda a, b: a - b, fused.network.params, agent.network.params)) > 0
    obs = jnp.asarray(dataset['observations'][:2])
    assert agent.sample_actions(obs, rng=jax.random.PRNGKey(0)).shape == (2, D)
    assert agent.sample_actions(obs[0], rng=jax.random.PRNGKey(0)).shape == (D,)


def test_bad_settings_are_refused():
    cases = [(bam, [('inv_temp', -1.0), ('best_of_n', 0)]),
             (fawac, [('inv_temp', -1.0), ('flow_steps', 0)])]  # fmt: skip
    for module, bad in cases:
        config = dict(tiny_config(module.__name__.split('.')[-1]))
        for key, value in bad:
            with pytest.raises(UsageError, match=key):
                check_config({**config, key: value}, module.CONFIG_RULES, 'agents/x.py')
        check_config(config, module.CONFIG_RULES, 'agents/x.py')
