"""FEdit agent from the math: the edit policy's loss on BC flow chunks, which parameters each loss moves, edited
sampling with best-of-N, the temperature, fused updates and the config checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_dataset, sequential_updates_with_a_resume, tiny_config

from agents.fedit import CONFIG_RULES, FEditAgent
from utils.config_rules import check_config
from utils.errors import UsageError

OBS_DIM, ACTION_DIM, H = 4, 2, 3
D = H * ACTION_DIM


@pytest.fixture(scope='module')
def dataset():
    return random_dataset(n=140, obs_dim=OBS_DIM, action_dim=ACTION_DIM, episode_length=7)


def make_agent(dataset, seed=0, **overrides):
    config = tiny_config('fedit', horizon_length=H, **overrides)
    return FEditAgent.create(seed, dataset['observations'][0], dataset['actions'][0], config)


def perturbed(agent, *modules, scale=0.3, seed=1):
    """`agent` with noise added to the params of `modules` (so that the edit is not near zero at init)."""
    params = dict(agent.network.params)
    for i, name in enumerate(modules):
        leaves, treedef = jax.tree_util.tree_flatten(params[f'modules_{name}'])
        keys = jax.random.split(jax.random.PRNGKey(seed + i), len(leaves))
        noisy = [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
        params[f'modules_{name}'] = jax.tree_util.tree_unflatten(treedef, noisy)
    return agent.replace(network=agent.network.replace(params=params))


def with_config(agent, **changes):
    return agent.replace(config=agent.config.copy(changes))


def edit_of(agent, obs, chunks, key):
    """The edit tanh(u), u = loc + scale * eps, of the edit policy at (obs, chunks), eps drawn event axis first
    (TFP's layout), and its log-probability: the Gaussian's at u minus log |d tanh / du| = 2 (log 2 - u -
    softplus(-2 u)) per dimension."""
    dist = agent.network.select('edit_actor')(jnp.concatenate([obs, chunks], axis=-1))
    loc, scale = dist.distribution.loc, dist.distribution.scale_diag  # (..., D)
    eps = jnp.moveaxis(jax.random.normal(key, (D, *loc.shape[:-1])), 0, -1)
    u = loc + scale * eps
    gaussian = jnp.sum(-0.5 * eps**2 - jnp.log(scale) - 0.5 * jnp.log(2 * jnp.pi), axis=-1)
    log_det = jnp.sum(2 * (jnp.log(2.0) - u - jax.nn.softplus(-2 * u)), axis=-1)
    return jnp.tanh(u), gaussian - log_det


def test_edit_loss_is_minus_q_of_the_edited_flow_chunk_plus_the_entropy_terms(dataset):
    agent = perturbed(make_agent(dataset, edit_scale=0.4), 'edit_actor', 'actor_bc_flow')
    batch = dataset.sample_sequence(16, H, 0.99)
    rng = jax.random.PRNGKey(5)
    _, info = agent.actor_loss(batch, agent.network.params, rng)
    # Keys as the reference splits them: (rest, flow noise, flow time), then (_, chunk noise, edit sample) of rest.
    rest = jax.random.split(rng, 3)[0]
    _, noise_key, edit_key = jax.random.split(rest, 3)
    obs = jnp.asarray(batch['observations'])
    flow = agent.compute_flow_actions(obs, jax.random.normal(noise_key, (16, D)))
    edit, log_prob = edit_of(agent, obs, flow, edit_key)
    q = agent.network.select('critic')(obs, jnp.clip(flow + 0.4 * edit, -1, 1)).mean(axis=0)
    np.testing.assert_allclose(info['edit_q_loss'], -q.mean(), rtol=1e-5)
    np.testing.assert_allclose(info['edit_entropy'], -log_prob.mean(), rtol=1e-4)
    np.testing.assert_allclose(info['edit_entropy_loss'], log_prob.mean(), rtol=1e-4)  # alpha = 1 at first
    parts = info['bc_flow_loss'] + info['edit_q_loss'] + info['edit_entropy_loss'] + info['edit_alpha_loss']
    np.testing.assert_allclose(info['actor_loss'], parts, rtol=1e-5)


def test_the_bc_flow_learns_only_from_the_data_and_the_edit_only_from_q(dataset):
    """The edit's Q term reaches the edit policy alone: not the BC flow whose chunks it edits, nor the critic."""
    agent = perturbed(make_agent(dataset), 'edit_actor')
    batch = dataset.sample_sequence(16, H, 0.99)
    rng = jax.random.PRNGKey(4)

    def grads(scale):
        edited = with_config(agent, edit_scale=scale)
        return jax.grad(lambda p: edited.actor_loss(batch, p, rng)[0])(agent.network.params)

    low, high = grads(0.1), grads(0.9)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8),
                           low['modules_actor_bc_flow'], high['modules_actor_bc_flow'])  # fmt: skip
    differ = jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), low['modules_edit_actor'],
                                    high['modules_edit_actor'])  # fmt: skip
    assert max(jax.tree_util.tree_leaves(differ)) > 1e-5
    for critic in ('critic', 'target_critic'):
        assert max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(high[f'modules_{critic}'])) == 0


def test_sampling_keeps_the_edited_chunk_the_critic_ranks_highest(dataset):
    agent = perturbed(make_agent(dataset, best_of_n=5, edit_scale=0.5), 'edit_actor', 'critic')
    obs = jnp.asarray(dataset['observations'][:4])
    rng = jax.random.PRNGKey(9)
    chosen = agent.sample_actions(obs, rng=rng)
    noise_key, edit_key = jax.random.split(rng)
    obs_rep = jnp.repeat(obs[:, None], 5, axis=1)  # (4, 5, obs)
    flow = agent.compute_flow_actions(obs_rep, jax.random.normal(noise_key, (4, 5, D)))
    candidates = jnp.clip(flow + 0.5 * edit_of(agent, obs_rep, flow, edit_key)[0], -1, 1)  # (4, 5, D)
    q = np.asarray(agent.network.select('critic')(obs_rep, candidates).mean(axis=0))  # (4, 5)
    np.testing.assert_allclose(chosen, np.asarray(candidates)[np.arange(4), q.argmax(axis=1)], rtol=1e-5, atol=1e-6)
    # Without an edit the policy is the BC flow.
    plain = with_config(agent, edit_scale=0.0, best_of_n=1).sample_actions(obs, rng=rng)
    np.testing.assert_allclose(plain, agent.compute_flow_actions(obs, jax.random.normal(noise_key, (4, 1, D))[:, 0]),
                               rtol=1e-5, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize('chunking', [True, False])
def test_actions_have_the_chunk_shape_and_stay_in_bounds(dataset, chunking):
    agent = make_agent(dataset, action_chunking=chunking, best_of_n=3, edit_scale=0.8)
    width = D if chunking else ACTION_DIM
    one = agent.sample_actions(jnp.asarray(dataset['observations'][0]), rng=jax.random.PRNGKey(0))
    many = agent.sample_actions(jnp.asarray(dataset['observations'][:6]), rng=jax.random.PRNGKey(0))
    assert one.shape == (width,) and many.shape == (6, width)
    assert float(jnp.abs(many).max()) <= 1.0


def test_edit_temperature_moves_toward_the_target_entropy(dataset):
    agent = make_agent(dataset, edit_target_entropy=-100.0)  # far below the edit policy's entropy
    batch = dataset.sample_sequence(16, H, 0.99)
    grads = jax.grad(lambda p: agent.actor_loss(batch, p, jax.random.PRNGKey(0))[0])(agent.network.params)
    assert float(grads['modules_edit_alpha']['log_temp']) > 0  # entropy above target: alpha goes down
    assert make_agent(dataset).config['edit_target_entropy'] == -0.5 * D


def test_batch_update_equals_sequential_updates(dataset, tmp_path):
    agent = make_agent(dataset)
    batches = [dataset.sample_sequence(16, H, 0.99) for _ in range(3)]
    sequential, info = sequential_updates_with_a_resume(agent, batches, tmp_path)  # and a resume
    fused, fused_info = agent.batch_update(jax.tree_util.tree_map(lambda *x: np.stack(x), *batches))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                           fused.network.params, sequential.network.params)  # fmt: skip
    np.testing.assert_allclose(fused_info['actor/edit_q_loss'], info['actor/edit_q_loss'], rtol=1e-4)
    moved = jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), fused.network.params,
                                   agent.network.params)  # fmt: skip
    assert max(jax.tree_util.tree_leaves(moved)) > 0


def test_bad_settings_are_refused():
    config = dict(tiny_config('fedit'))
    for key, value in [('edit_scale', -0.1), ('best_of_n', 0), ('rho', -1.0)]:
        with pytest.raises(UsageError, match=key):
            check_config({**config, key: value}, CONFIG_RULES, 'agents/fedit.py')
    check_config(config, CONFIG_RULES, 'agents/fedit.py')  # the defaults pass
