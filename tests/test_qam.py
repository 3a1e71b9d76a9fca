"""QAM agent (and ACFQL's QAM-paper keys) from the math: the memoryless trajectory and its adjoints by explicit
Jacobians, the adjoint-matching loss, the pessimistic ensemble target, the masked BC loss, the variants' sampling,
fused updates, and which parameters each distillation loss moves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import random_dataset, tiny_acfql_config, tiny_qam_config

from agents.acfql import ACFQLAgent
from agents.qam import CONFIG_CHECKS, CONFIG_RULES, QAMAgent
from utils.config_rules import check_config
from utils.errors import UsageError

OBS_DIM, ACTION_DIM, H = 4, 2, 3


@pytest.fixture(scope='module')
def dataset():
    # Episodes of 7 steps so that many chunks of 3 run past an episode end.
    return random_dataset(n=140, obs_dim=OBS_DIM, action_dim=ACTION_DIM, episode_length=7)


def make_agent(dataset, cls=QAMAgent, seed=0, **overrides):
    overrides.setdefault('horizon_length', H)
    config = (tiny_qam_config if cls is QAMAgent else tiny_acfql_config)(**overrides)
    return cls.create(seed, dataset['observations'][0], dataset['actions'][0], config)


def perturbed(agent, *modules, scale=0.3, seed=1):
    """`agent` with noise added to the params of `modules` (so that flows or critics that start equal differ)."""
    params = dict(agent.network.params)
    for i, name in enumerate(modules):
        leaves, treedef = jax.tree_util.tree_flatten(params[f'modules_{name}'])
        keys = jax.random.split(jax.random.PRNGKey(seed + i), len(leaves))
        noisy = [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
        params[f'modules_{name}'] = jax.tree_util.tree_unflatten(treedef, noisy)
    return agent.replace(network=agent.network.replace(params=params))


def with_params(agent, **modules):
    params = {**agent.network.params, **{f'modules_{k}': v for k, v in modules.items()}}
    return agent.replace(network=agent.network.replace(params=params))


def with_config(agent, **changes):
    return agent.replace(config=agent.config.copy(changes))


def assert_trees_close(a, b, **kwargs):
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kwargs), a, b)


@pytest.mark.parametrize('residual, target_actor', [(False, True), (True, False)])
def test_adjoint_pass_matches_a_hand_rolled_loop_with_explicit_jacobians(dataset, residual, target_actor):
    steps, inv_temp = 4, 0.7
    agent = make_agent(dataset, residual=residual, target_actor=target_actor, flow_steps=steps, inv_temp=inv_temp)
    agent = perturbed(agent, 'actor_fast', 'target_actor_slow', 'target_critic')
    obs = jnp.asarray(dataset['observations'][:5])
    key = jax.random.PRNGKey(3)
    xs, adjs, ts, _ = agent.adjoint_pass(obs, key)

    h = 1 / steps
    base = agent.network.select('target_actor_slow' if target_actor else 'actor_slow')
    fine = agent.network.select('actor_fast')
    x = jax.random.normal(key, (5, H * ACTION_DIM))
    trajectory = [x]
    for i, step_key in enumerate(jax.random.split(key, steps)):
        t = jnp.full((5, 1), i * h)
        if i < steps - 1:
            v = fine(obs, x, t) + (base(obs, x, t) if residual else 0)
            sigma = np.sqrt(2 * (1 - i * h + h) / (i * h + h))
            x = x + h * (2 * v - x / (i * h + h)) + np.sqrt(h) * sigma * jax.random.normal(step_key, x.shape)
        else:
            x = x + h * base(obs, x, t)  # the last step: the base flow's ODE
        trajectory.append(x)

    critic = agent.network.select('target_critic')

    def q_of_one(o, a):
        return critic(o[None], jnp.clip(a, -1, 1)[None]).mean()

    adj = -inv_temp * jax.vmap(jax.grad(q_of_one, argnums=1))(obs, trajectory[-1])
    expected = [None] * steps
    for i in reversed(range(steps)):
        s = i * h + h

        def drift_of_one(o, xi, s=s):
            return 2 * base(o[None], xi[None], jnp.full((1, 1), s))[0] - xi / s

        jacobians = jax.vmap(jax.jacobian(drift_of_one, argnums=1))(obs, trajectory[i])  # (B, D, D)
        adj = adj + h * jnp.einsum('bij,bi->bj', jacobians, adj)
        expected[i] = adj
    np.testing.assert_allclose(xs, np.stack(trajectory[:-1]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ts[:, 0, 0], np.arange(steps) * h, atol=1e-7)
    np.testing.assert_allclose(adjs, np.stack(expected), rtol=1e-4, atol=1e-6)
    assert float(jnp.abs(adjs).max()) > 1e-3  # the critic's gradient reached the adjoints


def test_adjoint_matching_loss_by_hand_and_zero_at_its_optimum(dataset):
    agent = perturbed(make_agent(dataset, inv_temp=0.5), 'actor_fast', 'target_critic')
    batch = dataset.sample_sequence(8, H, 0.99)
    rng = jax.random.PRNGKey(5)
    _, info = agent.actor_loss(batch, agent.network.params, rng)

    xs, adjs, ts, _ = agent.adjoint_pass(batch['observations'], jax.random.split(rng, 5)[3])
    h = 1 / agent.config['flow_steps']
    expected = 0.0
    for x, adj, t in zip(xs, adjs, ts):
        sigma = jnp.sqrt(2 * (1 - t + h) / (t + h))
        diff = agent.network.select('actor_fast')(batch['observations'], x, t)
        diff = diff - agent.network.select('target_actor_slow')(batch['observations'], x, t)
        expected = expected + jnp.sum(jnp.square(2 * diff / sigma + sigma * adj), axis=-1)
    np.testing.assert_allclose(info['adj_loss'], jnp.mean(expected), rtol=1e-5)

    # Without Q (inv_temp = 0) the fine-tuned flow's optimum is the base flow itself: the loss vanishes there.
    base = agent.network.params['modules_target_actor_slow']
    at_optimum = with_config(with_params(agent, actor_fast=base), inv_temp=0.0)
    _, info = at_optimum.actor_loss(batch, at_optimum.network.params, rng)
    assert float(info['adj_loss']) == 0.0
    assert float(agent.actor_loss(batch, agent.network.params, rng)[1]['adj_loss']) > 0


def ensemble_outputs(params, values):
    """Critic ensemble params whose member k outputs values[k] everywhere (zero last kernel, bias = values[k])."""
    last = max(k for k in params['value_net'] if k.startswith('Dense_'))
    layer = dict(params['value_net'][last])
    layer['kernel'] = jnp.zeros_like(layer['kernel'])
    layer['bias'] = jnp.asarray(values, jnp.float32).reshape(layer['bias'].shape)
    return {**params, 'value_net': {**params['value_net'], last: layer}}


@pytest.mark.parametrize('cls, rho', [(QAMAgent, 0.5), (ACFQLAgent, 0.5), (ACFQLAgent, 0.0)])
def test_critic_target_is_the_ensemble_mean_minus_rho_std(dataset, cls, rho):
    values = [1.0, 2.0, 4.0, -1.0]
    agent = make_agent(dataset, cls, num_qs=4, rho=rho)
    params = agent.network.params
    agent = with_params(
        agent,
        critic=ensemble_outputs(params['modules_critic'], [0.7] * 4),
        target_critic=ensemble_outputs(params['modules_target_critic'], values),
    )
    batch = dataset.sample_sequence(32, H, 0.99)
    assert 0 < batch['valid'][:, -1].sum() < 32  # some chunks run past an episode end
    loss, _ = agent.critic_loss(batch, agent.network.params, jax.random.PRNGKey(0))
    next_q = np.mean(values) - rho * np.std(values)
    target = batch['rewards'][:, -1] + 0.99**H * batch['masks'][:, -1] * next_q
    np.testing.assert_allclose(loss, np.mean(batch['valid'][:, -1] * (0.7 - target) ** 2), rtol=1e-5)


@pytest.mark.parametrize('cls', [QAMAgent, ACFQLAgent])
@pytest.mark.parametrize('chunking', [True, False])
def test_bc_flow_loss_leaves_out_chunks_that_run_past_an_episode_end(dataset, cls, chunking):
    overrides = dict(action_chunking=chunking)
    if cls is ACFQLAgent:
        overrides.update(bc_mask='chunk', actor_type='best-of-n')
    agent = make_agent(dataset, cls, **overrides)
    batch = dataset.sample_sequence(32, H, 0.99)
    rng = jax.random.PRNGKey(2)
    _, info = agent.actor_loss(batch, agent.network.params, rng)
    keys = jax.random.split(rng, 5)[1:3] if cls is QAMAgent else jax.random.split(rng, 3)[:2]
    target = batch['actions'].reshape(32, -1) if chunking else batch['actions'][:, 0]
    x_0 = jax.random.normal(keys[0], target.shape)
    t = jax.random.uniform(keys[1], (32, 1))
    flow = agent.network.select('actor_slow' if cls is QAMAgent else 'actor_bc_flow')
    sq_err = jnp.square(flow(batch['observations'], (1 - t) * x_0 + t * target, t) - (target - x_0)).mean(axis=-1)
    expected = jnp.mean(sq_err * batch['valid'][:, -1])
    np.testing.assert_allclose(info['flow_loss' if cls is QAMAgent else 'bc_flow_loss'], expected, rtol=1e-5)
    assert not np.isclose(float(expected), float(sq_err.mean()))  # the weighting matters on this batch


@pytest.mark.parametrize(
    'variant, chunking',
    [({}, True), ({'fql_alpha': 10.0}, False), ({'edit_scale': 0.1}, True), ({'edit_scale': 0.1}, False)],
    ids=['QAM', 'QAM-F-single', 'QAM-E', 'QAM-E-single'],
)
def test_actions_have_the_chunk_shape_and_stay_in_bounds(dataset, variant, chunking):
    agent = make_agent(dataset, action_chunking=chunking, best_of_n=3, **variant)
    width = H * ACTION_DIM if chunking else ACTION_DIM
    one = agent.sample_actions(jnp.asarray(dataset['observations'][0]), rng=jax.random.PRNGKey(0))
    many = agent.sample_actions(jnp.asarray(dataset['observations'][:6]), rng=jax.random.PRNGKey(0))
    assert one.shape == (width,) and many.shape == (6, width)
    assert float(jnp.abs(many).max()) <= 1.0


def test_best_of_n_keeps_the_fine_tuned_chunk_the_critic_ranks_highest(dataset):
    agent = perturbed(make_agent(dataset, best_of_n=5), 'actor_fast')
    obs = jnp.asarray(dataset['observations'][:4])
    rng = jax.random.PRNGKey(9)
    chosen = agent.sample_actions(obs, rng=rng)
    noises = jax.random.normal(jax.random.split(rng)[0], (4, 5, H * ACTION_DIM))
    obs_rep = jnp.repeat(obs[:, None], 5, axis=1)
    candidates = agent.compute_flow_actions(obs_rep, noises, ('actor_fast',))
    q = agent.network.select('critic')(obs_rep, candidates).mean(axis=0)  # (4, 5)
    np.testing.assert_allclose(chosen, np.asarray(candidates)[np.arange(4), np.asarray(q).argmax(axis=1)], rtol=1e-6)
    # With inv_temp = 0 the policy is the BC flow.
    bc = with_config(agent, inv_temp=0.0).sample_actions(obs, rng=rng)
    assert not np.allclose(bc, chosen)


@pytest.mark.parametrize('variant', [{'fql_alpha': 10.0}, {'edit_scale': 0.1}], ids=['QAM-F', 'QAM-E'])
def test_batch_update_equals_sequential_updates(dataset, variant):
    agent = make_agent(dataset, **variant)
    batches = [dataset.sample_sequence(16, H, 0.99) for _ in range(3)]
    sequential = agent
    for batch in batches:
        sequential, info = sequential.update(batch)
    fused, fused_info = agent.batch_update(jax.tree_util.tree_map(lambda *x: np.stack(x), *batches))
    assert_trees_close(fused.network.params, sequential.network.params, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(fused_info['actor/adj_loss'], info['actor/adj_loss'], rtol=1e-4)
    moved = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()),
                                                             fused.network.params, agent.network.params))  # fmt: skip
    assert max(moved) > 0


def test_targets_move_by_tau_toward_the_pre_step_critic_and_bc_flow(dataset):
    agent = perturbed(make_agent(dataset, tau=0.1), 'critic', 'actor_slow')
    new, _ = agent.update(dataset.sample_sequence(16, H, 0.99))
    old = agent.network.params
    for name in ('critic', 'actor_slow'):
        expected = jax.tree_util.tree_map(
            lambda p, tp: 0.1 * p + 0.9 * tp, old[f'modules_{name}'], old[f'modules_target_{name}']
        )
        assert_trees_close(new.network.params[f'modules_target_{name}'], expected, rtol=1e-5, atol=1e-7)


def actor_grads(agent, batch, rng):
    return jax.grad(lambda p: agent.actor_loss(batch, p, rng)[0])(agent.network.params)


@pytest.mark.parametrize('cls', [ACFQLAgent, QAMAgent], ids=['ACFQL', 'QAM-F'])
def test_distillation_moves_only_the_one_step_policy(dataset, cls):
    """The one-step policy regresses onto the flow's chunks; the flows it copies get no gradient from it."""
    if cls is ACFQLAgent:
        agent, key, one_step, flows = make_agent(dataset, cls), 'alpha', 'actor_onestep_flow', ('actor_bc_flow',)
    else:
        agent, key, one_step = make_agent(dataset, fql_alpha=1.0), 'fql_alpha', 'one_step_actor'
        flows = ('actor_slow', 'actor_fast')
    batch = dataset.sample_sequence(16, H, 0.99)
    rng = jax.random.PRNGKey(4)
    low = actor_grads(with_config(agent, **{key: 1.0}), batch, rng)
    high = actor_grads(with_config(agent, **{key: 300.0}), batch, rng)
    for name in flows:
        assert_trees_close(low[f'modules_{name}'], high[f'modules_{name}'], rtol=1e-6, atol=1e-8)
    differ = jax.tree_util.tree_map(lambda a, b: float(jnp.abs(a - b).max()), low[f'modules_{one_step}'],
                                    high[f'modules_{one_step}'])  # fmt: skip
    assert max(jax.tree_util.tree_leaves(differ)) > 1e-4
    for critic in ('critic', 'target_critic'):  # the actor's Q term does not train the critic
        assert max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(high[f'modules_{critic}'])) == 0


def test_edit_temperature_moves_toward_the_target_entropy(dataset):
    agent = make_agent(dataset, edit_scale=0.1, edit_target_entropy=-100.0)  # far below the policy's entropy
    batch = dataset.sample_sequence(16, H, 0.99)
    grads = actor_grads(agent, batch, jax.random.PRNGKey(0))
    # entropy > target: the loss alpha * (entropy - target) lowers alpha, i.e. a positive gradient of log alpha.
    assert float(grads['modules_edit_alpha']['log_temp']) > 0
    assert agent.config['edit_target_entropy'] == -100.0
    auto = make_agent(dataset, edit_scale=0.1)
    assert auto.config['edit_target_entropy'] == -0.5 * H * ACTION_DIM


def test_bad_settings_are_refused(dataset):
    with pytest.raises(ValueError, match='fql_alpha and edit_scale'):
        make_agent(dataset, fql_alpha=1.0, edit_scale=0.1)
    with pytest.raises(ValueError, match='horizon_length'):
        make_agent(dataset, horizon_length=None)
    config = tiny_qam_config()
    for key, value, words in [('inv_temp', -0.1, 'inv_temp'), ('best_of_n', 0, 'best_of_n')]:
        with pytest.raises(UsageError, match=words):
            check_config({**config, key: value}, CONFIG_RULES, 'agents/qam.py', CONFIG_CHECKS)
    with pytest.raises(UsageError, match='fql_alpha.*edit_scale'):
        check_config({**config, 'fql_alpha': 1.0, 'edit_scale': 0.1}, CONFIG_RULES, 'agents/qam.py', CONFIG_CHECKS)
    check_config(dict(config), CONFIG_RULES, 'agents/qam.py', CONFIG_CHECKS)  # the defaults pass


def test_edit_policy_draws_its_noise_event_axis_first_as_the_reference_does(dataset):
    """QAM-E's reference samples the edit with TFP, whose diagonal Gaussian draws normal(key, (D, *batch)) and moves
    the event axis last; the same key must give the same edit here."""
    agent = perturbed(make_agent(dataset, edit_scale=0.5), 'edit_actor')
    obs = jnp.asarray(dataset['observations'][:6])
    rng = jax.random.PRNGKey(11)
    noise_rng, edit_rng = jax.random.split(rng)
    flow = agent.compute_flow_actions(obs, jax.random.normal(noise_rng, (6, 1, H * ACTION_DIM))[:, 0], ('actor_fast',))
    dist = agent.network.select('edit_actor')(jnp.concatenate([obs, flow], axis=-1))
    loc, scale = dist.distribution.loc, dist.distribution.scale_diag  # (6, D)
    eps = jax.random.normal(edit_rng, (H * ACTION_DIM, 6)).T
    expected = jnp.clip(flow + 0.5 * jnp.tanh(loc + scale * eps), -1, 1)
    np.testing.assert_allclose(agent.sample_actions(obs, rng=rng), expected, rtol=1e-5, atol=1e-6)
    edit, log_prob = dist.sample_and_log_prob_event_first(edit_rng)
    np.testing.assert_allclose(edit, jnp.tanh(loc + scale * eps), rtol=1e-6)
    np.testing.assert_allclose(log_prob, dist.log_prob(edit), rtol=1e-3)  # unsaturated: tanh inverts accurately
