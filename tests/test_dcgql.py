"""QSM and DAC (`agents/dcgql.py`) from the math: the noise schedules, both actor losses at noised dataset chunks,
the reverse sampler step by step, which parameters the actor loss moves, fused updates and the config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_dataset, sequential_updates_with_a_resume, tiny_config

from agents.dcgql import CONFIG_RULES, DCGQLAgent, paper_method
from utils.config_rules import check_config
from utils.diffusion import beta_schedule, schedule
from utils.errors import UsageError

OBS_DIM, ACTION_DIM, H, T = 4, 2, 3, 4
D = H * ACTION_DIM


@pytest.fixture(scope='module')
def dataset():
    return random_dataset(n=140, obs_dim=OBS_DIM, action_dim=ACTION_DIM, episode_length=7)


def make_agent(dataset, seed=0, **overrides):
    config = tiny_config('dcgql', horizon_length=H, **overrides)
    return DCGQLAgent.create(seed, dataset['observations'][0], dataset['actions'][0], config)


def test_schedules():
    vp = np.asarray(beta_schedule('vp', 5))
    t = np.arange(1, 6)
    np.testing.assert_allclose(vp[1:], 1 - np.exp(-0.1 / 5 - 0.5 * 9.9 * (2 * t - 1) / 25), rtol=1e-5)
    assert vp[0] == 0 and vp.shape == (6,)
    np.testing.assert_allclose(beta_schedule('linear', 3)[1:], [1e-4, 0.01005, 0.02], rtol=1e-5)
    cosine = np.asarray(beta_schedule('cosine', 1000))
    assert 0 < cosine[1] < cosine[500] < cosine[-1] <= 0.999
    alphas, alpha_bars = schedule('vp', 5)
    np.testing.assert_allclose(alpha_bars, np.cumprod(1 - vp), rtol=1e-6)
    assert alpha_bars[0] == 1 and np.all(np.diff(np.asarray(alpha_bars)) < 0)
    with pytest.raises(ValueError, match='beta_schedule'):
        beta_schedule('sigmoid', 5)


@pytest.mark.parametrize('loss_type', ['qsm', 'dac'])
def test_actor_loss_by_hand(dataset, loss_type):
    agent = make_agent(dataset, actor_loss_type=loss_type)
    batch = dataset.sample_sequence(32, H, 0.99)
    valid = batch['valid'][:, -1]
    assert 0 < valid.sum() < 32  # some chunks run past an episode end
    rng = jax.random.PRNGKey(3)
    loss, info = agent.actor_loss(batch, agent.network.params, rng)
    time_key, rest = jax.random.split(rng)
    t = jax.random.randint(time_key, (32,), 1, T + 1)
    noise = jax.random.normal(jax.random.split(rest)[0], (32, D))
    _, alpha_bars = schedule('vp', T)
    a = batch['actions'].reshape(32, -1)
    noisy = jnp.sqrt(alpha_bars[t])[:, None] * a + jnp.sqrt(1 - alpha_bars[t])[:, None] * noise
    obs = jnp.asarray(batch['observations'])
    q_grad = jax.grad(lambda x: agent.network.select('target_critic')(obs, x).mean(axis=0).sum())(noisy)
    eps = agent.network.select('actor')(obs, noisy, t[:, None].astype(jnp.float32))
    bc = np.mean(np.mean((noise - eps) ** 2, axis=-1) * valid)
    if loss_type == 'qsm':
        guidance = np.mean(np.mean((-1.5 * q_grad - eps) ** 2, axis=-1) * valid)
    else:
        guidance = np.mean(np.mean(jnp.sqrt(1 - alpha_bars[t])[:, None] * q_grad * eps, axis=-1) * valid)
    np.testing.assert_allclose(info['bc_loss'], bc, rtol=1e-5)
    np.testing.assert_allclose(info['actor_loss'], guidance, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(loss, 2.0 * bc + guidance, rtol=1e-5, atol=1e-7)
    assert not np.isclose(bc, np.mean((noise - eps) ** 2))  # the chunk weighting matters on this batch


@pytest.mark.parametrize('clip_before, clip_after', [(False, True), (True, False)], ids=['qsm', 'dac'])
def test_sampler_step_by_step(dataset, clip_before, clip_after):
    agent = make_agent(dataset, clip_sampler_before=clip_before, clip_sampler_after=clip_after)
    obs = jnp.asarray(dataset['observations'][:5])
    rng = jax.random.PRNGKey(8)
    noise_key, sampler_key = jax.random.split(rng)
    x = jax.random.normal(noise_key, (5, D))
    key = jax.random.split(sampler_key)[1]
    alphas, abar = schedule('vp', T)
    for t in range(T, 0, -1):
        eps = agent.network.select('actor')(obs, x, jnp.full((5, 1), float(t)))
        x0 = (x - jnp.sqrt(1 - abar[t]) * eps) / jnp.sqrt(abar[t])
        if clip_before:  # the mean of q(x_{t-1} | x_t, x0)
            x0 = jnp.clip(x0, -1, 1)
            mean = jnp.sqrt(abar[t - 1]) * (1 - alphas[t]) * x0 + jnp.sqrt(alphas[t]) * (1 - abar[t - 1]) * x
            x = mean / (1 - abar[t])
        else:
            x = x0
        key, z_key = jax.random.split(key)
        if t > 1:
            x = x + jnp.sqrt(1 - alphas[t]) * jax.random.normal(z_key, x.shape)
        if clip_after:
            x = jnp.clip(x, -1, 1)
    np.testing.assert_allclose(agent.sample_actions(obs, rng=rng), x, rtol=1e-4, atol=1e-5)
    one = agent.sample_actions(obs[0], rng=rng)
    assert one.shape == (D,)
    grid = agent.sample_actions(jnp.stack([obs[:2], obs[2:4]]), rng=rng)
    assert grid.shape == (2, 2, D)


def test_the_actor_loss_trains_the_noise_network_only(dataset):
    agent = make_agent(dataset, actor_loss_type='qsm', use_target_critic_grad=False)
    batch = dataset.sample_sequence(16, H, 0.99)
    grads = jax.grad(lambda p: agent.actor_loss(batch, p, jax.random.PRNGKey(1))[0])(agent.network.params)
    for critic in ('critic', 'target_critic'):  # grad Q is a target of the regression, not trained through
        assert max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(grads[f'modules_{critic}'])) == 0
    assert max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(grads['modules_actor'])) > 0


def test_batch_update_equals_sequential_updates(dataset, tmp_path):
    agent = make_agent(dataset, actor_loss_type='dac', clip_sampler_before=True)
    batches = [dataset.sample_sequence(16, H, 0.99) for _ in range(3)]
    sequential, info = sequential_updates_with_a_resume(agent, batches, tmp_path)  # and a resume
    fused, fused_info = agent.batch_update(jax.tree_util.tree_map(lambda *x: np.stack(x), *batches))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                           fused.network.params, sequential.network.params)  # fmt: skip
    np.testing.assert_allclose(fused_info['actor/actor_loss'], info['actor/actor_loss'], rtol=1e-4, atol=1e-7)
    moved = jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), fused.network.params,
                                   agent.network.params)  # fmt: skip
    assert max(jax.tree_util.tree_leaves(moved)) > 0


def test_names_and_bad_settings(dataset):
    assert paper_method({'actor_loss_type': 'qsm'}) == 'QSM' and paper_method({'actor_loss_type': 'dac'}) == 'DAC'
    assert paper_method({'actor_loss_type': 'dac'}, 'qc') is None
    config = dict(tiny_config('dcgql'))
    for key, value in [('actor_loss_type', 'awr'), ('beta_schedule', 'sigmoid'), ('diffusion_steps', 0),
                       ('alpha', -1.0)]:  # fmt: skip
        with pytest.raises(UsageError, match=key):
            check_config({**config, key: value}, CONFIG_RULES, 'agents/dcgql.py')
    check_config(config, CONFIG_RULES, 'agents/dcgql.py')  # the defaults pass
    with pytest.raises(ValueError, match='beta_schedule'):
        make_agent(dataset, beta_schedule='sigmoid')
