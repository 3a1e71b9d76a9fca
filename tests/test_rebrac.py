"""ReBRAC (`agents/rebrac.py`) from the math: the smoothed pessimistic target, the normalised actor loss with its
chunk-masked BC term, the targets moving on every `actor_freq`-th update only, noisy acting, fused updates and the
config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_dataset, sequential_updates_with_a_resume, tiny_config

from agents.rebrac import CONFIG_RULES, ReBRACAgent
from utils.config_rules import check_config
from utils.errors import UsageError

OBS_DIM, ACTION_DIM, H = 4, 2, 3
D = H * ACTION_DIM


@pytest.fixture(scope='module')
def dataset():
    return random_dataset(n=140, obs_dim=OBS_DIM, action_dim=ACTION_DIM, episode_length=7)


def make_agent(dataset, seed=0, **overrides):
    config = tiny_config('rebrac', horizon_length=H, **overrides)
    return ReBRACAgent.create(seed, dataset['observations'][0], dataset['actions'][0], config)


def trees_close(a, b):
    return all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x, y: np.allclose(x, y, rtol=1e-5, atol=1e-7),
                                                                a, b)))  # fmt: skip


def test_critic_target_by_hand(dataset):
    agent = make_agent(dataset, actor_noise=0.4, actor_noise_clip=0.3, rho=0.5)
    batch = dataset.sample_sequence(32, H, 0.99)
    rng = jax.random.PRNGKey(2)
    loss, _ = agent.critic_loss(batch, agent.network.params, rng)
    next_obs = batch['next_observations'][:, -1]
    noise = jnp.clip(0.4 * jax.random.normal(jax.random.split(rng)[1], (32, D)), -0.3, 0.3)
    next_actions = jnp.clip(agent.network.select('target_actor')(next_obs) + noise, -1, 1)
    next_qs = np.asarray(agent.network.select('target_critic')(next_obs, next_actions))  # (3, 32)
    target = batch['rewards'][:, -1] + 0.99**H * batch['masks'][:, -1] * (next_qs.mean(0) - 0.5 * next_qs.std(0))
    q = np.asarray(agent.network.select('critic')(batch['observations'], batch['actions'].reshape(32, -1)))
    np.testing.assert_allclose(loss, np.mean((q - target) ** 2 * batch['valid'][:, -1]), rtol=1e-5)


def test_actor_loss_by_hand(dataset):
    agent = make_agent(dataset, alpha_actor=0.7, rho=0.5)
    batch = dataset.sample_sequence(32, H, 0.99)
    valid = batch['valid'][:, -1]
    assert 0 < valid.sum() < 32
    loss, info = agent.actor_loss(batch, agent.network.params, jax.random.PRNGKey(0))
    a = agent.network.select('actor')(batch['observations'])
    qs = np.asarray(agent.network.select('critic')(batch['observations'], a))
    q = qs.mean(0) - 0.5 * qs.std(0)
    mse = np.sum((np.asarray(a) - batch['actions'].reshape(32, -1)) ** 2, axis=-1) * valid
    np.testing.assert_allclose(info['actor_loss'], -np.mean(q / np.abs(q).mean()), rtol=1e-5)
    np.testing.assert_allclose(loss, -np.mean(q / np.abs(q).mean()) + 0.7 * mse.mean(), rtol=1e-5)
    # The Q term's scale is held fixed: its gradient is that of -q / E|q| with E|q| a constant; none reaches the critic.
    grads = jax.grad(lambda p: agent.actor_loss(batch, p, jax.random.PRNGKey(0))[0])(agent.network.params)
    assert max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(grads['modules_critic'])) == 0


def test_targets_move_on_every_actor_freq_th_update_only(dataset, tmp_path):
    agent = make_agent(dataset, actor_freq=3, tau=0.1)
    batches = [dataset.sample_sequence(16, H, 0.99) for _ in range(3)]
    states = [agent]
    for batch in batches:
        states.append(states[-1].update(batch)[0])
    for name in ('critic', 'actor'):
        start = agent.network.params[f'modules_target_{name}']
        for k in (1, 2):  # the 1st and 2nd updates leave the targets; the actor and critic learn every time
            assert trees_close(states[k].network.params[f'modules_target_{name}'], start)
            now, before = (states[j].network.params[f'modules_{name}'] for j in (k, k - 1))
            assert not trees_close(now, before)
        pre = states[2].network.params  # the 3rd moves them by tau toward the params before that update
        expected = jax.tree_util.tree_map(lambda p, t: 0.1 * p + 0.9 * t, pre[f'modules_{name}'], start)
        assert trees_close(states[3].network.params[f'modules_target_{name}'], expected)
    # Fused: the same count decides; and so it does after a restore from a checkpoint (the count is in it).
    fused, _ = agent.batch_update(jax.tree_util.tree_map(lambda *x: np.stack(x), *batches))
    assert trees_close(fused.network.params, states[3].network.params)
    resumed, _ = sequential_updates_with_a_resume(agent, batches, tmp_path)
    assert trees_close(resumed.network.params, states[3].network.params)


def test_acting_adds_clipped_noise(dataset):
    agent = make_agent(dataset, actor_noise=5.0, actor_noise_clip=0.25)
    obs = jnp.asarray(dataset['observations'][:8])
    mode = agent.network.select('actor')(obs)
    actions = agent.sample_actions(obs, rng=jax.random.PRNGKey(1))
    assert actions.shape == (8, D) and float(jnp.abs(actions).max()) <= 1.0
    gap = np.abs(np.asarray(actions - mode))
    assert gap.max() <= 0.25 + 1e-6 and gap.mean() > 0.2  # clipped, and almost always at the clip with std 5
    assert agent.sample_actions(obs[0], rng=jax.random.PRNGKey(1)).shape == (D,)
    single = make_agent(dataset, action_chunking=False)
    assert single.sample_actions(obs, rng=jax.random.PRNGKey(1)).shape == (8, ACTION_DIM)


def test_bad_settings_are_refused():
    config = dict(tiny_config('rebrac'))
    for key, value in [('actor_freq', 0), ('alpha_actor', -0.1), ('actor_noise', -1.0)]:
        with pytest.raises(UsageError, match=key):
            check_config({**config, key: value}, CONFIG_RULES, 'agents/rebrac.py')
    check_config(config, CONFIG_RULES, 'agents/rebrac.py')  # the defaults pass
