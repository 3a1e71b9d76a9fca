"""ACFQL agent: shapes, the critic target by hand, best-of-n ranking, Euler flow, fused updates, checkpoints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_dataset, tiny_acfql_config

from agents.acfql import ACFQLAgent
from utils.datasets import Dataset
from utils.flax_utils import restore_agent, restore_agent_with_file, save_agent
from utils.networks import FourierFeatures

OBS_DIM, ACTION_DIM, H = 5, 2, 3


@pytest.fixture(scope='module')
def dataset():
    return random_dataset(obs_dim=OBS_DIM, action_dim=ACTION_DIM)


# `create` takes one example without a batch axis (what the reference driver passes) or with a batch axis of 1.
EXAMPLE_FORMS = {'single': lambda x: x[0], 'batch_of_one': lambda x: x[:1]}


def make_agent(dataset, seed=0, example_form='batch_of_one', **overrides):
    overrides.setdefault('horizon_length', H)
    config = tiny_acfql_config(**overrides)
    pick = EXAMPLE_FORMS[example_form]
    return ACFQLAgent.create(seed, pick(dataset['observations']), pick(dataset['actions']), config)


@pytest.fixture(scope='module')
def agents(dataset):
    return {
        (actor_type, chunking): make_agent(dataset, actor_type=actor_type, action_chunking=chunking)
        for actor_type in ('distill-ddpg', 'best-of-n')
        for chunking in (True, False)
    }


def assert_trees_close(a, b, **kwargs):
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kwargs), a, b)


def assert_trees_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize('actor_type', ['distill-ddpg', 'best-of-n'])
@pytest.mark.parametrize('chunking', [True, False])
def test_create_from_one_example_with_or_without_batch_axis(agents, dataset, actor_type, chunking):
    agent = make_agent(dataset, example_form='single', actor_type=actor_type, action_chunking=chunking)
    # Same seed, same config: the unbatched example builds exactly the agent the batch of one builds.
    reference = agents[(actor_type, chunking)]
    assert_trees_equal(agent.network.params, reference.network.params)
    assert dict(agent.config) == dict(reference.config)
    width = H * ACTION_DIM if chunking else ACTION_DIM
    assert agent.config['ob_dims'] == (OBS_DIM,)
    assert agent.config['action_dim'] == ACTION_DIM and agent.config['full_action_dim'] == width
    key = jax.random.PRNGKey(1)
    assert agent.sample_actions(dataset['observations'][0], rng=key).shape == (width,)
    assert agent.sample_actions(dataset['observations'][:4], rng=key).shape == (4, width)
    _, info = agent.update(dataset.sample_sequence(8, H, 0.99))
    assert np.isfinite(info['critic/critic_loss']) and np.isfinite(info['actor/actor_loss'])


def test_create_refuses_examples_of_the_wrong_rank_or_batch_size(dataset):
    observations, actions = dataset['observations'], dataset['actions']
    config = tiny_acfql_config(horizon_length=H)
    with pytest.raises(ValueError, match='ex_actions'):
        ACFQLAgent.create(0, observations[:1], actions[:1][None], config)
    with pytest.raises(ValueError, match='batch size'):
        ACFQLAgent.create(0, observations[:3], actions[:1], config)


@pytest.mark.parametrize('actor_type', ['distill-ddpg', 'best-of-n'])
@pytest.mark.parametrize('chunking', [True, False])
def test_action_shapes_and_range(agents, dataset, actor_type, chunking):
    agent = agents[(actor_type, chunking)]
    width = H * ACTION_DIM if chunking else ACTION_DIM
    single = agent.sample_actions(dataset['observations'][0], rng=jax.random.PRNGKey(1))
    batched = agent.sample_actions(dataset['observations'][:9], rng=jax.random.PRNGKey(1))
    assert single.shape == (width,)
    assert batched.shape == (9, width)
    assert np.all(np.abs(np.asarray(batched)) <= 1.0)


@pytest.mark.parametrize('actor_type', ['distill-ddpg', 'best-of-n'])
@pytest.mark.parametrize('chunking', [True, False])
def test_updates_give_finite_losses_and_move_params(agents, dataset, actor_type, chunking):
    agent = agents[(actor_type, chunking)]
    new_agent = agent
    for _ in range(3):
        new_agent, info = new_agent.update(dataset.sample_sequence(16, H, 0.99))
    for key in ('critic/critic_loss', 'actor/actor_loss', 'actor/bc_flow_loss', 'grad/norm'):
        assert np.isfinite(info[key]), key
    assert ('actor/distill_loss' in info) == (actor_type == 'distill-ddpg')
    before = agent.network.params['modules_critic']
    after = new_agent.network.params['modules_critic']
    assert any(
        not np.allclose(x, y) for x, y in zip(jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after))
    )


def set_constant_output(params, value):
    """Makes every member of a critic ensemble output `value` (zero last kernel, bias = value)."""
    params = jax.tree_util.tree_map(lambda x: x, params)
    last = max(k for k in params['value_net'] if k.startswith('Dense_'))
    layer = dict(params['value_net'][last])
    layer['kernel'] = jnp.zeros_like(layer['kernel'])
    layer['bias'] = jnp.full_like(layer['bias'], value)
    params['value_net'] = {**params['value_net'], last: layer}
    return params


@pytest.mark.parametrize('chunking', [True, False])
def test_critic_target_equals_hand_computed_h_step_return(dataset, chunking):
    agent = make_agent(dataset, action_chunking=chunking)
    params = dict(agent.network.params)
    params['modules_critic'] = set_constant_output(params['modules_critic'], 0.7)
    params['modules_target_critic'] = set_constant_output(params['modules_target_critic'], 2.5)
    agent = agent.replace(network=agent.network.replace(params=params))

    gamma = agent.config['discount']
    fields = {k: np.asarray(dataset[k]) for k in dataset}
    batch = dataset.sample_sequence(32, H, gamma)
    starts = [int(np.nonzero(np.all(fields['observations'] == o, axis=1))[0][0]) for o in batch['observations']]
    loss, info = agent.critic_loss(batch, params, jax.random.PRNGKey(0))

    expected = []
    for s in starts:
        ret, mask, valid = 0.0, 1.0, 1.0
        for i in range(H):
            if i > 0:
                valid = min(valid, 1.0 - fields['terminals'][s + i - 1])
            ret += gamma**i * fields['rewards'][s + i]
            mask = min(mask, fields['masks'][s + i])
        target = ret + gamma**H * mask * 2.5
        expected.append(valid * (0.7 - target) ** 2)
    np.testing.assert_allclose(loss, np.mean(expected), rtol=1e-5)
    np.testing.assert_allclose(info['q_mean'], 0.7, rtol=1e-6)


def test_best_of_n_returns_the_candidate_the_critic_ranks_highest(dataset):
    agent = make_agent(dataset, actor_type='best-of-n', actor_num_samples=6)
    obs = jnp.asarray(dataset['observations'][:4])
    rng = jax.random.PRNGKey(7)
    chosen = agent.sample_actions(obs, rng=rng)

    noises = jax.random.normal(rng, (4, 6, H * ACTION_DIM))
    obs_rep = jnp.repeat(obs[:, None], 6, axis=1)
    candidates = agent.compute_flow_actions(obs_rep, noises)
    q = agent.network.select('critic')(obs_rep, candidates).mean(axis=0)  # (4, 6)
    best = np.asarray(candidates)[np.arange(4), np.asarray(q).argmax(axis=1)]
    np.testing.assert_allclose(chosen, best, rtol=1e-6)
    q_chosen = agent.network.select('critic')(obs, chosen).mean(axis=0)
    assert np.all(np.asarray(q_chosen)[:, None] >= np.asarray(q) - 1e-5)


def test_euler_integration_matches_a_hand_rolled_loop(dataset):
    agent = make_agent(dataset, flow_steps=5)
    obs = jnp.asarray(dataset['observations'][:8])
    noises = jax.random.normal(jax.random.PRNGKey(3), (8, H * ACTION_DIM))
    x = noises
    for i in range(5):
        t = jnp.full((8, 1), i / 5)
        x = x + agent.network.select('actor_bc_flow')(obs, x, t) / 5
    np.testing.assert_allclose(agent.compute_flow_actions(obs, noises), jnp.clip(x, -1, 1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('actor_type', ['distill-ddpg', 'best-of-n'])
def test_batch_update_equals_sequential_updates(dataset, actor_type):
    agent = make_agent(dataset, actor_type=actor_type)
    batches = [dataset.sample_sequence(16, H, 0.99) for _ in range(3)]
    sequential = agent
    infos = []
    for batch in batches:
        sequential, info = sequential.update(batch)
        infos.append(info)
    stacked = jax.tree_util.tree_map(lambda *x: np.stack(x), *batches)
    fused, fused_info = agent.batch_update(stacked)
    assert_trees_close(fused.network.params, sequential.network.params, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(jax.random.key_data(fused.rng), jax.random.key_data(sequential.rng))
    # The fused call reports what its last update reports on its own.
    np.testing.assert_allclose(fused_info['critic/critic_loss'], infos[-1]['critic/critic_loss'], rtol=1e-4)
    assert not np.isclose(float(infos[0]['critic/critic_loss']), float(infos[-1]['critic/critic_loss']))


@pytest.mark.parametrize('weight_decay', [0.0, 0.1])
def test_target_network_moves_by_tau_toward_the_pre_step_critic(dataset, weight_decay):
    agent = make_agent(dataset, tau=0.1, weight_decay=weight_decay)
    first, _ = agent.update(dataset.sample_sequence(16, H, 0.99))
    second, _ = first.update(dataset.sample_sequence(16, H, 0.99))
    # As in the reference, each update averages in the critic and target from before its gradient step, so AdamW's
    # decay of the target params (they are in the optimized tree) never reaches the target.
    old_critic = first.network.params['modules_critic']
    old_target = first.network.params['modules_target_critic']
    expected = jax.tree_util.tree_map(lambda c, t: 0.1 * c + 0.9 * t, old_critic, old_target)
    assert_trees_close(second.network.params['modules_target_critic'], expected, rtol=1e-6, atol=1e-8)
    # The target really moved (it started equal to the critic, which changed in the first step).
    leaves = zip(jax.tree_util.tree_leaves(old_target), jax.tree_util.tree_leaves(expected))
    assert any(not np.allclose(a, b) for a, b in leaves)


def test_grad_norm_is_the_sum_of_per_leaf_norms(dataset):
    agent = make_agent(dataset)
    batch = dataset.sample_sequence(16, H, 0.99)
    _, info = agent.update(batch)
    _, loss_rng = jax.random.split(agent.rng)  # the key `update` gives the losses
    grads = jax.jit(jax.grad(lambda p: agent.total_loss(batch, p, rng=loss_rng)[0]))(agent.network.params)
    norms = [float(jnp.linalg.norm(g)) for g in jax.tree_util.tree_leaves(grads)]
    # The reference logs the sum of the per-leaf norms, which is larger than the global L2 norm.
    np.testing.assert_allclose(info['grad/norm'], sum(norms), rtol=1e-4)
    assert float(info['grad/norm']) > 1.5 * float(np.sqrt(np.sum(np.square(norms))))


def test_fourier_time_features_are_fixed_sinusoids_unless_learnable(dataset):
    times = jnp.array([[0.0], [0.3], [1.0]])
    features = FourierFeatures(8)
    assert features.init(jax.random.PRNGKey(0), times) == {}  # nothing to train
    frequencies = np.exp(-np.log(10000.0) * np.arange(4) / 3)
    angles = np.asarray(times) * frequencies
    expected = np.concatenate([np.cos(angles), np.sin(angles)], axis=-1)
    np.testing.assert_allclose(features.apply({}, times), expected, rtol=1e-6, atol=1e-7)

    fixed = make_agent(dataset, use_fourier_features=True)
    learned = make_agent(dataset, use_fourier_features=True, learnable_fourier_features=True)
    assert 'ff' not in fixed.network.params['modules_actor_bc_flow']
    assert learned.network.params['modules_actor_bc_flow']['ff']['kernel'].shape == (32, 1)
    # The features reach the flow: its velocity depends on the time through them.
    obs, x = dataset['observations'][:2], jnp.zeros((2, H * ACTION_DIM))
    flow = fixed.network.select('actor_bc_flow')
    assert not np.allclose(flow(obs, x, jnp.zeros((2, 1))), flow(obs, x, jnp.full((2, 1), 0.5)))


def test_adamw_decays_weights_when_weight_decay_is_positive(dataset):
    batch = dataset.sample_sequence(16, H, 0.99)
    adam_agent, _ = make_agent(dataset).update(batch)
    base = make_agent(dataset, weight_decay=0.01)
    adamw_agent, _ = base.update(batch)
    # AdamW is Adam minus lr * wd * params on the same gradients.
    lr = base.config['lr']
    expected = jax.tree_util.tree_map(lambda a, p: a - lr * 0.01 * p, adam_agent.network.params, base.network.params)
    new_params = dict(adamw_agent.network.params)
    expected = dict(expected)
    # The target critic is not optimized; it only follows the critic.
    for tree in (new_params, expected):
        tree.pop('modules_target_critic')
    assert_trees_close(new_params, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('example_form', ['single', 'batch_of_one'])
@pytest.mark.parametrize('actor_type', ['distill-ddpg', 'best-of-n'])
def test_image_observation_agent(actor_type, example_form):
    rng = np.random.default_rng(0)
    n = 40
    observations = rng.integers(0, 255, size=(n, 16, 16, 3), dtype=np.uint8)
    terminals = np.zeros(n, np.float32)
    terminals[19::20] = 1
    dataset = Dataset.create(
        observations=observations,
        next_observations=np.roll(observations, -1, axis=0),
        actions=rng.uniform(-1, 1, size=(n, ACTION_DIM)).astype(np.float32),
        rewards=np.zeros(n, np.float32),
        terminals=terminals,
        masks=np.ones(n, np.float32),
    )
    # The example image is (16, 16, 3) for 'single' and (1, 16, 16, 3) for 'batch_of_one'.
    agent = make_agent(dataset, example_form=example_form, encoder='impala_debug', actor_type=actor_type)
    assert agent.config['ob_dims'] == (16, 16, 3)
    batch = dataset.sample_sequence(4, H, 0.99)
    assert batch['next_observations'].shape == (4, 16, 16, H, 3)
    agent, info = agent.update(batch)
    assert np.isfinite(info['critic/critic_loss']) and np.isfinite(info['actor/actor_loss'])
    assert agent.sample_actions(observations[0], rng=jax.random.PRNGKey(0)).shape == (H * ACTION_DIM,)
    assert agent.sample_actions(observations[:3], rng=jax.random.PRNGKey(0)).shape == (3, H * ACTION_DIM)


def test_save_restore_round_trip_gives_identical_actions(dataset, tmp_path):
    agent, _ = make_agent(dataset).update(dataset.sample_sequence(16, H, 0.99))
    path = save_agent(agent, str(tmp_path), 7)
    assert path.endswith('params_7.pkl')
    fresh = make_agent(dataset, seed=42)
    obs = dataset['observations'][:5]
    key = jax.random.PRNGKey(11)
    assert not np.allclose(fresh.sample_actions(obs, rng=key), agent.sample_actions(obs, rng=key))
    for restored in (restore_agent_with_file(fresh, path), restore_agent(fresh, str(tmp_path), 7)):
        np.testing.assert_array_equal(restored.sample_actions(obs, rng=key), agent.sample_actions(obs, rng=key))
        assert_trees_close(restored.network.opt_state, agent.network.opt_state)


def test_bad_configs_are_refused(dataset):
    with pytest.raises(ValueError, match='horizon_length'):
        make_agent(dataset, horizon_length=0)
    with pytest.raises(ValueError, match='actor_type'):
        make_agent(dataset, actor_type='best-of-m')


@pytest.mark.parametrize('actor_type', ['best-of-n', 'distill-ddpg'])
@pytest.mark.parametrize('image', [False, True], ids=['state', 'image'])
def test_create_accepts_a_single_example_or_a_batch_of_one(actor_type, image):
    obs_shape = (16, 16, 3) if image else (OBS_DIM,)
    overrides = dict(actor_type=actor_type, encoder='impala_debug' if image else None)
    obs = np.zeros(obs_shape, np.uint8 if image else np.float32)
    act = np.zeros(ACTION_DIM, np.float32)
    single = ACFQLAgent.create(0, obs, act, tiny_acfql_config(horizon_length=H, **overrides))
    batched = ACFQLAgent.create(0, obs[None], act[None], tiny_acfql_config(horizon_length=H, **overrides))
    assert_trees_close(single.network.params, batched.network.params)
    key = jax.random.PRNGKey(1)
    for agent in (single, batched):
        assert agent.sample_actions(obs, rng=key).shape == (H * ACTION_DIM,)
        assert agent.sample_actions(np.stack([obs] * 4), rng=key).shape == (4, H * ACTION_DIM)
    with pytest.raises(ValueError, match='ex_actions must be'):
        ACFQLAgent.create(0, obs[None, None], act[None, None], tiny_acfql_config(horizon_length=H, **overrides))
