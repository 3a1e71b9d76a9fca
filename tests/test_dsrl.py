"""DSRL (`agents/dsrl.py`) from the math: the noise critic's distillation, the noise policy's loss on it, which
parameters each term moves, sampling through the target flow with best-of-N, fused updates and the config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_dataset, sequential_updates_with_a_resume, tiny_config

from agents.dsrl import CONFIG_RULES, DSRLAgent
from utils.config_rules import check_config
from utils.errors import UsageError
from utils.flows import chunk_td_loss

OBS_DIM, ACTION_DIM, H = 4, 2, 3
D = H * ACTION_DIM


@pytest.fixture(scope='module')
def dataset():
    return random_dataset(n=140, obs_dim=OBS_DIM, action_dim=ACTION_DIM, episode_length=7)


def make_agent(dataset, seed=0, **overrides):
    config = tiny_config('dsrl', horizon_length=H, **overrides)
    return DSRLAgent.create(seed, dataset['observations'][0], dataset['actions'][0], config)


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


def test_noise_critic_regresses_onto_the_critic_at_the_target_flow_chunks(dataset):
    agent = perturbed(make_agent(dataset), 'target_actor_bc_flow', 'critic')
    batch = dataset.sample_sequence(16, H, 0.99)
    rng = jax.random.PRNGKey(6)
    loss, info = agent.critic_loss(batch, agent.network.params, rng)
    rest, sample_key, _ = jax.random.split(rng, 3)
    noise = jax.random.normal(jax.random.split(rest)[1], (16, D))
    flow = agent.network.select('target_actor_bc_flow')
    x = noise
    for i in range(3):
        x = x + flow(batch['observations'], x, jnp.full((16, 1), i / 3)) / 3
    target = agent.network.select('critic')(batch['observations'], jnp.clip(x, -1, 1))
    qs = agent.network.select('z_critic')(batch['observations'], noise)
    np.testing.assert_allclose(info['distill_loss'], np.mean((np.asarray(qs) - np.asarray(target)) ** 2), rtol=1e-5)
    td, _ = chunk_td_loss(agent, batch, agent.network.params, sample_key)
    np.testing.assert_allclose(loss, td + info['distill_loss'], rtol=1e-5)
    # The distillation trains the noise critic only; the critic learns from the TD loss alone.
    grads = jax.grad(lambda p: agent.critic_loss(batch, p, rng)[0])(agent.network.params)
    td_grads = jax.grad(lambda p: chunk_td_loss(agent, batch, p, sample_key)[0])(agent.network.params)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                           grads['modules_critic'], td_grads['modules_critic'])  # fmt: skip
    assert max_abs(grads['modules_z_critic']) > 0


def test_noise_policy_maximises_the_noise_critic_and_trains_nothing_else(dataset):
    agent = perturbed(make_agent(dataset, noise_scale=0.5), 'z_critic')
    batch = dataset.sample_sequence(16, H, 0.99)
    rng = jax.random.PRNGKey(2)
    _, info = agent.actor_loss(batch, agent.network.params, rng)
    dist = agent.network.select('actor')(batch['observations'])
    z, log_probs = dist.sample_and_log_prob_event_first(jax.random.split(rng, 3)[0])
    q = agent.network.select('z_critic')(batch['observations'], 0.5 * z).mean(axis=0)
    np.testing.assert_allclose(info['q'], q.mean(), rtol=1e-5)
    np.testing.assert_allclose(info['actor_loss'], (log_probs - q).mean(), rtol=1e-5)  # alpha = 1 at first
    grads = jax.grad(lambda p: agent.actor_loss(batch, p, rng)[0])(agent.network.params)
    for name in ('critic', 'z_critic', 'target_actor_bc_flow'):
        assert max_abs(grads[f'modules_{name}']) == 0, name
    assert max_abs(grads['modules_actor']) > 0 and max_abs(grads['modules_actor_bc_flow']) > 0


def test_sampling_runs_the_target_flow_from_the_noise_policy_and_keeps_the_best(dataset):
    agent = perturbed(make_agent(dataset, best_of_n=4, noise_scale=1.3), 'actor', 'target_actor_bc_flow')
    obs = jnp.asarray(dataset['observations'][:3])
    rng = jax.random.PRNGKey(4)
    chosen = agent.sample_actions(obs, rng=rng)
    obs_rep = jnp.repeat(obs[:, None], 4, axis=1)
    z, _ = agent.network.select('actor')(obs_rep).sample_and_log_prob_event_first(rng)
    candidates = agent.compute_flow_actions(obs_rep, 1.3 * z)  # (3, 4, D)
    q = np.asarray(agent.network.select('critic')(obs_rep, candidates).mean(axis=0))
    np.testing.assert_allclose(chosen, np.asarray(candidates)[np.arange(3), q.argmax(1)], rtol=1e-5, atol=1e-6)
    assert agent.sample_actions(obs[0], rng=rng).shape == (D,)
    learning = agent.replace(config=agent.config.copy({'use_target_latent': False}))
    assert not np.allclose(learning.sample_actions(obs, rng=rng), chosen)  # the learning flow differs


def test_batch_update_equals_sequential_updates(dataset, tmp_path):
    agent = make_agent(dataset)
    batches = [dataset.sample_sequence(16, H, 0.99) for _ in range(3)]
    sequential, info = sequential_updates_with_a_resume(agent, batches, tmp_path)  # and a resume
    fused, fused_info = agent.batch_update(jax.tree_util.tree_map(lambda *x: np.stack(x), *batches))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                           fused.network.params, sequential.network.params)  # fmt: skip
    np.testing.assert_allclose(fused_info['critic/distill_loss'], info['critic/distill_loss'], rtol=1e-4)
    assert max_abs(jax.tree_util.tree_map(lambda a, b: a - b, fused.network.params, agent.network.params)) > 0


def test_temperature_and_bad_settings(dataset):
    agent = make_agent(dataset, target_entropy=-100.0)
    batch = dataset.sample_sequence(16, H, 0.99)
    grads = jax.grad(lambda p: agent.actor_loss(batch, p, jax.random.PRNGKey(0))[0])(agent.network.params)
    assert float(grads['modules_temp']['log_temp']) > 0  # entropy above target: alpha goes down
    assert make_agent(dataset).config['target_entropy'] == -0.5 * D
    config = dict(tiny_config('dsrl'))
    for key, value in [('noise_scale', -1.0), ('best_of_n', 0), ('flow_steps', 0)]:
        with pytest.raises(UsageError, match=key):
            check_config({**config, key: value}, CONFIG_RULES, 'agents/dsrl.py')
    check_config(config, CONFIG_RULES, 'agents/dsrl.py')
