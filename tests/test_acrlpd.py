"""ACRLPD agent: action shapes, the critic target by hand, temperature and BC behaviour, fused updates."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from helpers import random_dataset

from agents.acrlpd import ACRLPDAgent, get_config

OBS_DIM, ACTION_DIM, H, BATCH = 5, 2, 3, 16


def tiny_config(**overrides):
    config = get_config()
    config.horizon_length = H
    config.actor_hidden_dims = (32, 32)
    config.value_hidden_dims = (32, 32)
    config.num_qs = 3
    config.batch_size = BATCH
    for k, v in overrides.items():
        setattr(config, k, v)
    return config


@pytest.fixture(scope='module')
def dataset():
    return random_dataset(obs_dim=OBS_DIM, action_dim=ACTION_DIM)


def make_agent(dataset, seed=0, **overrides):
    return ACRLPDAgent.create(seed, dataset['observations'][:1], dataset['actions'][:1], tiny_config(**overrides))


@pytest.fixture(scope='module')
def agents(dataset):
    return {chunking: make_agent(dataset, action_chunking=chunking) for chunking in (True, False)}


def sample_batch(dataset, batch_size=BATCH):
    return dataset.sample_sequence(batch_size, H, get_config().discount)


def with_params(agent, module, fn):
    """The agent with `fn` applied to the params dict of one module."""
    params = dict(agent.network.params)
    params[module] = fn(jax.tree_util.tree_map(lambda x: x, params[module]))
    return agent.replace(network=agent.network.replace(params=params))


def test_create_sets_derived_config(agents):
    agent = agents[True]
    assert agent.config['target_entropy'] == pytest.approx(-0.5 * H * ACTION_DIM)
    assert agents[False].config['target_entropy'] == pytest.approx(-0.5 * ACTION_DIM)
    assert agent.config['action_dim'] == ACTION_DIM and tuple(agent.config['ob_dims']) == (OBS_DIM,)
    params = agent.network.params
    for a, b in zip(
        jax.tree_util.tree_leaves(params['modules_critic']), jax.tree_util.tree_leaves(params['modules_target_critic'])
    ):
        np.testing.assert_array_equal(a, b)
    assert float(agent.network.select('temp')()) == pytest.approx(1.0)


def test_create_rejects_missing_horizon_and_bad_aggregation(dataset):
    with pytest.raises(ValueError, match='horizon_length'):
        make_agent(dataset, horizon_length=None)
    with pytest.raises(ValueError, match='q_agg'):
        make_agent(dataset, q_agg='max')


@pytest.mark.parametrize('chunking', [True, False])
def test_create_from_one_example_without_batch_axis(agents, dataset, chunking):
    config = tiny_config(action_chunking=chunking)
    # One example (obs_dim,), (A,) as the reference driver passes it, instead of a batch of one.
    agent = ACRLPDAgent.create(0, dataset['observations'][0], dataset['actions'][0], config)
    reference = agents[chunking]
    leaves = jax.tree_util.tree_leaves(agent.network.params)
    reference_leaves = jax.tree_util.tree_leaves(reference.network.params)
    assert len(leaves) == len(reference_leaves)
    for a, b in zip(leaves, reference_leaves):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert agent.config.to_dict() == reference.config.to_dict()
    assert tuple(agent.config['ob_dims']) == (OBS_DIM,) and agent.config['action_dim'] == ACTION_DIM
    width = H * ACTION_DIM if chunking else ACTION_DIM
    key = jax.random.PRNGKey(1)
    assert agent.sample_actions(dataset['observations'][0], rng=key).shape == (width,)
    assert agent.sample_actions(dataset['observations'][:4], rng=key).shape == (4, width)
    _, info = agent.update(sample_batch(dataset))
    assert all(np.isfinite(float(v)) for v in info.values())


@pytest.mark.parametrize('chunking', [True, False])
def test_sample_actions_shapes(agents, dataset, chunking):
    agent = agents[chunking]
    width = H * ACTION_DIM if chunking else ACTION_DIM
    single = agent.sample_actions(dataset['observations'][0], rng=jax.random.PRNGKey(1))
    batched = agent.sample_actions(dataset['observations'][:7], rng=jax.random.PRNGKey(1))
    assert single.shape == (width,) and batched.shape == (7, width)
    assert np.all(np.abs(np.asarray(batched)) <= 1)
    other = agent.sample_actions(dataset['observations'][:7], rng=jax.random.PRNGKey(2))
    assert not np.allclose(batched, other)
    # Without an rng the agent's own key is used, so repeated calls agree.
    np.testing.assert_array_equal(
        agent.sample_actions(dataset['observations'][:7]), agent.sample_actions(dataset['observations'][:7])
    )


@pytest.mark.parametrize('chunking', [True, False])
def test_update_losses_finite_and_params_change(agents, dataset, chunking):
    agent = agents[chunking]
    new_agent, info = agent.update(sample_batch(dataset))
    expected = {
        'critic/critic_loss',
        'actor/actor_loss',
        'actor/bc_loss',
        'alpha/alpha_loss',
        'alpha/alpha',
        'grad/norm',
    }
    assert expected <= set(info)
    assert all(np.isfinite(float(v)) for v in info.values())
    assert not np.array_equal(new_agent.rng, agent.rng)
    for module in ('modules_critic', 'modules_actor', 'modules_temp', 'modules_target_critic'):
        before = jax.tree_util.tree_leaves(agent.network.params[module])
        after = jax.tree_util.tree_leaves(new_agent.network.params[module])
        assert any(not np.array_equal(a, b) for a, b in zip(before, after)), module
    # The target moves by a tau-step toward the critic from before the step (the reference's order).
    tau = agent.config['tau']
    online = jax.tree_util.tree_leaves(agent.network.params['modules_critic'])
    old_target = jax.tree_util.tree_leaves(agent.network.params['modules_target_critic'])
    for p, tp, new_tp in zip(
        online, old_target, jax.tree_util.tree_leaves(new_agent.network.params['modules_target_critic'])
    ):
        np.testing.assert_allclose(new_tp, tau * p + (1 - tau) * tp, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('q_agg, rho', [('mean', 0.0), ('min', 0.0), ('mean', 0.5)])
def test_critic_target_and_loss_by_hand(agents, q_agg, rho):
    # Constant critics: zero final kernels and per-member biases make Q independent of its inputs.
    target_values, online_values = np.array([1.0, 2.0, 6.0]), np.array([0.5, -1.0, 3.0])

    def constant(values):
        def set_head(critic_params):
            head = critic_params['VmapStateActionValue_0']['Dense_0']
            head['kernel'] = jnp.zeros_like(head['kernel'])
            head['bias'] = jnp.asarray(values, jnp.float32)[:, None]
            return critic_params

        return set_head

    agent = with_params(agents[True], 'modules_target_critic', constant(target_values))
    agent = with_params(agent, 'modules_critic', constant(online_values))
    agent = agent.replace(
        config=ml_collections.FrozenConfigDict({**agent.config.as_configdict().to_dict(), 'q_agg': q_agg, 'rho': rho})
    )

    batch = dict(
        observations=np.zeros((3, OBS_DIM), np.float32),
        actions=np.zeros((3, H, ACTION_DIM), np.float32),
        next_observations=np.zeros((3, H, OBS_DIM), np.float32),
        rewards=np.array([[1.0, 1.5, 2.0], [0.0, 0.0, -1.0], [3.0, 3.0, 3.0]], np.float32),
        masks=np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]], np.float32),
        valid=np.array([[1, 1, 1], [1, 1, 1], [1, 1, 0]], np.float32),
    )
    agg = (3.0 if q_agg == 'mean' else 1.0) - rho * np.std(target_values)  # the QAM paper's pessimistic target
    gamma_h = 0.99**3
    targets = np.array([2.0 + gamma_h * agg, -1.0, 3.0 + gamma_h * agg])
    valid = np.array([1.0, 1.0, 0.0])
    expected_loss = np.mean((online_values[:, None] - targets[None, :]) ** 2 * valid[None, :])

    loss, info = agent.critic_loss(batch, agent.network.params, jax.random.PRNGKey(0))
    assert float(info['target_q_mean']) == pytest.approx(targets.mean(), rel=1e-5)
    assert float(loss) == pytest.approx(expected_loss, rel=1e-5)


def test_temperature_moves_toward_target_entropy(agents, dataset):
    batch = sample_batch(dataset)
    agent = agents[True]

    def with_log_std(bias):
        def set_head(actor_params):
            head = actor_params['OutputDenseLogStd']
            head['kernel'] = jnp.zeros_like(head['kernel'])
            head['bias'] = jnp.full_like(head['bias'], bias)
            return actor_params

        return with_params(agent, 'modules_actor', set_head)

    # Target entropy is -3: a wide policy is above it (alpha should fall), a near-deterministic one below (rise).
    for log_std, direction in ((0.0, -1.0), (-8.0, 1.0)):
        start = with_log_std(log_std)
        updated, info = start.update(batch)
        assert np.sign(float(info['alpha/entropy']) - start.config['target_entropy']) == -direction
        change = float(updated.network.select('temp')()) - float(start.network.select('temp')())
        assert np.sign(change) == direction


def test_bc_term(agents, dataset):
    batch = sample_batch(random_dataset(obs_dim=OBS_DIM, action_dim=ACTION_DIM, seed=1))
    # A narrow set of dataset chunks, far from the broad initial policy, so that imitation shows clearly.
    batch['actions'] = np.full_like(batch['actions'], 0.6) + 0.05 * np.sign(batch['actions'])
    _, info = agents[True].update(batch)
    assert float(info['actor/bc_loss']) == 0.0 and float(info['actor/bc_nll']) > 0

    def dataset_nll(agent):
        chunks = np.clip(batch['actions'].reshape(BATCH, -1), -1 + 1e-5, 1 - 1e-5)
        return float(-agent.network.select('actor')(batch['observations']).log_prob(chunks).mean())

    steps = 50
    stacked = jax.tree_util.tree_map(lambda x: np.stack([x] * steps), batch)
    plain, plain_info = agents[True].batch_update(stacked)
    assert float(plain_info['actor/bc_loss']) == 0.0
    bc = make_agent(dataset, bc_alpha=100.0)
    trained, info = bc.batch_update(stacked)
    assert float(info['actor/bc_loss']) == pytest.approx(100.0 * float(info['actor/bc_nll']), rel=1e-5)
    assert dataset_nll(trained) < dataset_nll(bc) - 1.0
    assert dataset_nll(trained) < dataset_nll(plain) - 0.5


def test_batch_update_equals_sequential_updates(agents, dataset):
    agent = agents[True]
    batches = [sample_batch(dataset) for _ in range(3)]
    sequential, infos = agent, []
    for b in batches:
        sequential, info = sequential.update(b)
        infos.append(info)
    stacked = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *batches)
    fused, fused_info = agent.batch_update(stacked)

    np.testing.assert_array_equal(fused.rng, sequential.rng)
    assert int(fused.network.step) == int(sequential.network.step) == int(agent.network.step) + 3
    leaves = zip(jax.tree_util.tree_leaves(fused.network), jax.tree_util.tree_leaves(sequential.network))
    for a, b in leaves:
        # XLA fuses the scan body differently from a standalone update, so float results can differ in the last ulp.
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for k in infos[0]:
        assert float(fused_info[k]) == pytest.approx(float(infos[-1][k]), rel=1e-4, abs=1e-5), k


def test_create_accepts_a_single_example_or_a_batch_of_one(dataset):
    obs, act = np.zeros(OBS_DIM, np.float32), np.zeros(ACTION_DIM, np.float32)
    single = ACRLPDAgent.create(0, obs, act, tiny_config())
    batched = ACRLPDAgent.create(0, obs[None], act[None], tiny_config())
    for a, b in zip(
        jax.tree_util.tree_leaves(single.network.params), jax.tree_util.tree_leaves(batched.network.params)
    ):
        np.testing.assert_array_equal(a, b)
    assert tuple(single.config['ob_dims']) == (OBS_DIM,)
    key = jax.random.PRNGKey(1)
    assert single.sample_actions(obs, rng=key).shape == (H * ACTION_DIM,)
    assert single.sample_actions(np.stack([obs] * 4), rng=key).shape == (4, H * ACTION_DIM)
    single, info = single.update(sample_batch(dataset))
    assert np.isfinite(float(info['critic/critic_loss']))


def test_temperature_loss_reuses_the_actor_loss_sample(agents, dataset):
    # As the reference: the temperature sees the entropy of the actor loss's own sample (not a second draw), and
    # moves alpha only (no gradient reaches the actor through it).
    agent = agents[True]
    batch = sample_batch(dataset)
    _, info = agent.total_loss(batch, agent.network.params, jax.random.PRNGKey(3))
    assert float(info['alpha/entropy']) == float(info['actor/entropy'])
    grads = jax.grad(lambda p: agent.temperature_loss(batch, p, jax.random.PRNGKey(3))[0])(agent.network.params)
    assert all(not np.any(np.asarray(g)) for g in jax.tree_util.tree_leaves(grads['modules_actor']))
    assert np.any(np.asarray(grads['modules_temp']['log_temp']))


def test_bc_mask_chunk_leaves_out_chunks_past_an_episode_end(agents, dataset):
    # The QAM paper's RLPD weights each chunk's BC log-likelihood by valid[..., -1]; QC's ('none') does not.
    batch = sample_batch(dataset)
    batch['valid'] = np.ones_like(batch['valid'])
    batch['valid'][: BATCH // 2, -1] = 0.0
    rng = jax.random.PRNGKey(3)
    plain = agents[True]
    masked = plain.replace(config=ml_collections.FrozenConfigDict(
        {**plain.config.as_configdict().to_dict(), 'bc_mask': 'chunk'}))  # fmt: skip
    chunks = np.clip(batch['actions'].reshape(BATCH, -1), -1 + 1e-5, 1 - 1e-5)
    log_probs = np.asarray(plain.network.select('actor')(batch['observations']).log_prob(chunks))
    _, info = plain.actor_loss(batch, plain.network.params, rng)
    _, masked_info = masked.actor_loss(batch, masked.network.params, rng)
    assert float(info['bc_nll']) == pytest.approx(-log_probs.mean(), rel=1e-5)
    assert float(masked_info['bc_nll']) == pytest.approx(-(log_probs * batch['valid'][:, -1]).mean(), rel=1e-5)


def mlp_by_hand(layers, x, activation, norm_after_activation, layer_norm):
    """A dense stack from its (kernel, bias, ln_scale, ln_bias) layers: the last one linear."""

    def norm(h, scale, bias):
        mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
        return (h - mean) / np.sqrt(var + 1e-6) * scale + bias

    for i, (kernel, bias, scale, shift) in enumerate(layers):
        x = x @ kernel + bias
        if i + 1 < len(layers):
            if layer_norm and not norm_after_activation:
                x = norm(x, scale, shift)
            x = activation(x)
            if layer_norm and norm_after_activation:
                x = norm(x, scale, shift)
    return x


@pytest.mark.parametrize('style', ['qc', 'qam'])
def test_network_style_sets_activation_and_layer_norm_order(dataset, style):
    # 'qc': the QC reference's RLPD critic, Dense -> LayerNorm -> ReLU; 'qam': the QAM reference's, Dense -> GELU ->
    # LayerNorm. Checked on the first critic of the ensemble against a forward pass written out here.
    agent = make_agent(dataset, network_style=style)
    obs, chunk = np.asarray(dataset['observations'][:4]), np.asarray(dataset['actions'][:4 * H]).reshape(4, -1)
    critic = jax.tree_util.tree_flatten_with_path(agent.network.params['modules_critic'])[0]
    leaves = {'/'.join(str(k.key) for k in path): np.asarray(v[0]) for path, v in critic}
    trunk = 'value_net' if style == 'qam' else 'VmapStateActionValue_0/MLP_0'
    head = 'value_net/Dense_2' if style == 'qam' else 'VmapStateActionValue_0/Dense_0'
    layers = [(leaves[f'{trunk}/Dense_{i}/kernel'], leaves[f'{trunk}/Dense_{i}/bias'],
               leaves[f'{trunk}/LayerNorm_{i}/scale'], leaves[f'{trunk}/LayerNorm_{i}/bias']) for i in range(2)]
    layers.append((leaves[f'{head}/kernel'], leaves[f'{head}/bias'], None, None))  # fmt: skip
    if style == 'qam':
        activation = lambda x: np.asarray(jax.nn.gelu(x))  # noqa: E731
    else:
        activation = lambda x: np.maximum(x, 0)  # noqa: E731
    expected = mlp_by_hand(layers, np.concatenate([obs, chunk], -1), activation, style == 'qam', True)[:, 0]
    q = np.asarray(agent.network.select('critic')(obs, chunk))[0]
    np.testing.assert_allclose(q, expected, rtol=1e-4, atol=1e-5)


def test_qam_network_style_needs_an_ensemble(dataset):
    with pytest.raises(ValueError, match='num_qs >= 2'):
        make_agent(dataset, network_style='qam', num_qs=1)
