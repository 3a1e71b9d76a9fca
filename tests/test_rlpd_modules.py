"""RLPD-style networks and distributions: tanh-Gaussian densities, ensembles, MLPs, pixel encoders."""

import functools
import math

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlpd_distributions import TanhDeterministic, TanhNormal, TanhTransformed
from rlpd_networks import MLP, Ensemble, MLPResNet, PixelMultiplexer, StateActionValue
from rlpd_networks.encoders import D4PGEncoder

TINY_MLP = functools.partial(MLP, hidden_dims=(16, 16), activate_final=True)


def tanh_normal(mean, std):
    return TanhTransformed(distrax.MultivariateNormalDiag(jnp.asarray(mean), jnp.asarray(std)))


def reference_log_prob(y, mean, std):
    """Change of variables in float64: log N(atanh y; mean, std) - log(1 - y^2), summed over the last axis."""
    y, mean, std = (np.asarray(v, np.float64) for v in (y, mean, std))
    x = np.arctanh(y)
    log_normal = -0.5 * ((x - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
    return np.sum(log_normal - np.log1p(-(y**2)), axis=-1)


def test_tanh_log_prob_matches_change_of_variables():
    mean, std = np.array([0.3, -1.0, 0.0]), np.array([0.5, 1.5, 0.1])
    y = np.array([[0.1, -0.7, 0.05], [0.9, 0.2, -0.02], [-0.99, -0.999, 0.0]], np.float32)
    np.testing.assert_allclose(tanh_normal(mean, std).log_prob(y), reference_log_prob(y, mean, std), rtol=1e-4)


def test_tanh_density_is_derivative_of_cdf():
    # In 1-D, P(Y <= y) = Phi((atanh y - mean) / std); its central difference must match exp(log_prob).
    mean, std, h = 0.4, 0.8, 1e-4

    def cdf(y):
        return 0.5 * (1 + math.erf((math.atanh(y) - mean) / (std * math.sqrt(2))))

    dist = tanh_normal([mean], [std])
    for y in (-0.8, -0.1, 0.3, 0.7, 0.95):
        finite_difference = (cdf(y + h) - cdf(y - h)) / (2 * h)
        density = float(jnp.exp(dist.log_prob(jnp.array([y], jnp.float32))))
        assert density == pytest.approx(finite_difference, rel=2e-3)


def test_tanh_density_matches_sample_histogram():
    dist = tanh_normal([0.5], [1.2])
    samples = np.asarray(dist.sample(seed=jax.random.PRNGKey(0), sample_shape=(200_000,)))[:, 0]
    assert np.all(np.abs(samples) <= 1)
    counts, edges = np.histogram(samples, bins=20, range=(-0.9, 0.9))
    empirical = counts / (len(samples) * np.diff(edges))
    centers = (edges[:-1] + edges[1:]) / 2
    density = np.exp(np.asarray(dist.log_prob(centers[:, None].astype(np.float32))))
    np.testing.assert_allclose(empirical, density, rtol=0.06)


def test_sample_and_log_prob_consistent_and_finite_when_saturated():
    dist = tanh_normal([0.2, -0.3], [0.7, 0.4])
    samples, log_probs = dist.sample_and_log_prob(seed=jax.random.PRNGKey(1), sample_shape=(64,))
    np.testing.assert_allclose(log_probs, dist.log_prob(samples), rtol=1e-3, atol=1e-3)
    # Means far out push tanh to exactly +-1 in float32, where a plain atanh would give inf/nan.
    saturated = tanh_normal([30.0, -30.0], [1.0, 1.0])
    samples, log_probs = saturated.sample_and_log_prob(seed=jax.random.PRNGKey(2), sample_shape=(16,))
    assert np.all(np.abs(samples) == 1.0)
    assert np.all(np.isfinite(log_probs))
    assert np.all(np.isfinite(saturated.log_prob(samples)))


def test_tanh_normal_head_mode_shapes_and_log_std_clipping():
    head = TanhNormal(TINY_MLP, action_dim=4)
    obs = jax.random.normal(jax.random.PRNGKey(0), (3, 5))
    params = head.init(jax.random.PRNGKey(1), obs)
    dist = head.apply(params, obs)
    assert dist.sample(seed=jax.random.PRNGKey(2)).shape == (3, 4)
    assert dist.log_prob(jnp.zeros((3, 4))).shape == (3,)
    np.testing.assert_allclose(dist.mode(), jnp.tanh(dist.distribution.mean()), rtol=1e-6)
    assert head.apply(params, obs[0]).sample(seed=jax.random.PRNGKey(2)).shape == (4,)

    for bias, expected_log_std in ((50.0, 2.0), (-50.0, -20.0)):
        p = jax.tree_util.tree_map(lambda x: x, params)
        p['params']['OutputDenseLogStd']['kernel'] = jnp.zeros_like(p['params']['OutputDenseLogStd']['kernel'])
        p['params']['OutputDenseLogStd']['bias'] = jnp.full((4,), bias)
        scale = head.apply(p, obs).distribution.stddev()
        np.testing.assert_allclose(scale, np.exp(expected_log_std), rtol=1e-5)


def test_tanh_deterministic_is_bounded():
    head = TanhDeterministic(TINY_MLP, action_dim=3)
    obs = 100.0 * jax.random.normal(jax.random.PRNGKey(0), (8, 5))
    actions = head.apply(head.init(jax.random.PRNGKey(1), obs), obs)
    assert actions.shape == (8, 3)
    assert np.all(np.abs(np.asarray(actions)) <= 1)


def make_ensemble(num=3):
    critic = Ensemble(functools.partial(StateActionValue, base_cls=TINY_MLP), num=num)
    obs, act = jnp.ones((4, 5)), jnp.ones((4, 2))
    return critic, critic.init(jax.random.PRNGKey(0), obs, act), obs, act


def test_ensemble_members_are_independent():
    critic, params, obs, act = make_ensemble()
    q = critic.apply(params, obs, act)
    assert q.shape == (3, 4)
    kernels = params['params']['VmapStateActionValue_0']['MLP_0']['Dense_0']['kernel']
    assert not np.allclose(kernels[0], kernels[1]) and not np.allclose(kernels[1], kernels[2])
    assert len({float(v) for v in q[:, 0]}) == 3

    # The first member's output depends on the first slice of every parameter only.
    grads = jax.tree_util.tree_leaves(jax.grad(lambda p: critic.apply(p, obs, act)[0].sum())(params))
    assert all(np.all(g[1:] == 0) for g in grads)
    assert all(np.any(g[0] != 0) for g in grads)


def test_mlp_final_activation_layer_norm_and_dropout():
    x = jax.random.normal(jax.random.PRNGKey(0), (6, 4))
    plain = MLP(hidden_dims=(8, 3))
    out = plain.apply(plain.init(jax.random.PRNGKey(1), x), x)
    assert out.shape == (6, 3) and np.any(out < 0)
    final = MLP(hidden_dims=(8, 3), activate_final=True)
    assert np.all(final.apply(final.init(jax.random.PRNGKey(1), x), x) >= 0)

    normed = MLP(hidden_dims=(8, 8), use_layer_norm=True)
    assert 'LayerNorm_0' in normed.init(jax.random.PRNGKey(1), x)['params']

    dropped = MLP(hidden_dims=(64, 8), dropout_rate=0.5)
    params = dropped.init(jax.random.PRNGKey(1), x)
    np.testing.assert_array_equal(dropped.apply(params, x), dropped.apply(params, x, training=False))
    train_out = dropped.apply(params, x, training=True, rngs={'dropout': jax.random.PRNGKey(2)})
    assert not np.allclose(train_out, dropped.apply(params, x))


def test_mlp_resnet_projects_and_normalizes():
    net = MLPResNet(num_blocks=2, features=16)
    x = jax.random.normal(jax.random.PRNGKey(0), (5, 7))
    params = net.init(jax.random.PRNGKey(1), x)
    out = net.apply(params, x)
    assert out.shape == (5, 16) and np.all(out >= 0)
    assert set(params['params']) == {'Dense_0', 'LayerNorm_0', 'MLPResNetBlock_0', 'MLPResNetBlock_1'}

    # Zeroing a block's last layer makes it the identity: the residual path carries its input unchanged.
    p = jax.tree_util.tree_map(lambda v: v, params)
    for name in ('MLPResNetBlock_0', 'MLPResNetBlock_1'):
        p['params'][name]['Dense_1'] = jax.tree_util.tree_map(jnp.zeros_like, p['params'][name]['Dense_1'])
    h = x @ params['params']['Dense_0']['kernel'] + params['params']['Dense_0']['bias']
    ln = params['params']['LayerNorm_0']
    expected = nn.relu(nn.LayerNorm().apply({'params': ln}, h))
    np.testing.assert_allclose(net.apply(p, x), expected, rtol=1e-5, atol=1e-5)


def test_pixel_multiplexer_with_d4pg_encoder():
    encoder = functools.partial(D4PGEncoder, features=(8, 8), filters=(3, 3), strides=(2, 1))
    actor = PixelMultiplexer(
        encoder_cls=encoder, network_cls=functools.partial(TanhNormal, TINY_MLP, 2), latent_dim=6, stop_gradient=True
    )
    images = jax.random.randint(jax.random.PRNGKey(0), (3, 16, 16, 3), 0, 256).astype(jnp.uint8)
    params = actor.init(jax.random.PRNGKey(1), images)
    assert actor.apply(params, images).sample(seed=jax.random.PRNGKey(2)).shape == (3, 2)
    # stop_gradient keeps this head's loss out of the encoder.
    grads = jax.grad(lambda p: actor.apply(p, images).mode().sum())(params)
    assert all(np.all(g == 0) for g in jax.tree_util.tree_leaves(grads['params']['encoder_0']))
    assert any(np.any(g != 0) for g in jax.tree_util.tree_leaves(grads['params']['TanhNormal_0']))

    critic = PixelMultiplexer(
        encoder_cls=encoder, network_cls=functools.partial(StateActionValue, base_cls=TINY_MLP), latent_dim=6
    )
    obs = {'pixels': images, 'state': jnp.ones((3, 4))}
    params = critic.init(jax.random.PRNGKey(1), obs, jnp.zeros((3, 2)))
    assert critic.apply(params, obs, jnp.zeros((3, 2))).shape == (3,)
    assert params['params']['Dense_1']['kernel'].shape == (4, 6)  # the state bottleneck
    grads = jax.grad(lambda p: critic.apply(p, obs, jnp.zeros((3, 2))).sum())(params)
    assert any(np.any(g != 0) for g in jax.tree_util.tree_leaves(grads['params']['encoder_0']))
