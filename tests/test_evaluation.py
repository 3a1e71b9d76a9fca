import flax
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import evaluation
from evaluation import ActionQueue, evaluate

ACTION_DIM = 2


class CounterEnv(gym.Env):
    """Observation is (step index, reset seed); records every reset seed and every action it receives."""

    def __init__(self, episode_length=7, with_monitor=False, success_at_end=True):
        self.episode_length = episode_length
        self.with_monitor = with_monitor
        self.success_at_end = success_at_end
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1, 1, (ACTION_DIM,), np.float32)
        self.reset_seeds = []
        self.actions = []  # one list per episode
        self.t = 0
        self.seed_value = None

    def _obs(self):
        return np.array([self.t, self.seed_value], dtype=np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.reset_seeds.append(seed)
        self.actions.append([])
        self.seed_value = seed
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.actions[-1].append(np.array(action, copy=True))
        self.t += 1
        # Reward depends on the seed so averaging over episodes is observable.
        reward = float(self.seed_value % 2)
        truncated = self.t >= self.episode_length
        info = {}
        if truncated:
            if self.success_at_end:
                info['success'] = float(self.seed_value % 2 == 0)
            if self.with_monitor:
                info['episode'] = {'return': 100.0 + self.seed_value, 'length': self.t, 'duration': 0.5}
        return self._obs(), reward, False, truncated, info

    def render(self):
        return np.full((4, 5, 3), self.t, dtype=np.float64)


class FakeAgent:
    """Returns chunk[k] = (obs step + offset_k) scaled into values partly outside [-1, 1]; records its calls."""

    def __init__(self, horizon):
        self.horizon = horizon
        self.calls = []  # (observation, rng data)
        self.rng = jax.random.PRNGKey(12345)

    def sample_actions(self, observations, rng=None):
        assert rng is not None, 'evaluation must pass its own key'
        self.calls.append((np.array(observations), tuple(np.asarray(jax.random.key_data(rng)).ravel().tolist())))
        base = np.arange(self.horizon * ACTION_DIM, dtype=np.float32) * 0.4 - 0.5
        return base + 0.01 * observations[0]


def expected_chunk(agent, step):
    return np.clip(np.arange(agent.horizon * ACTION_DIM) * 0.4 - 0.5 + 0.01 * step, -1, 1).reshape(-1, ACTION_DIM)


def test_action_queue_fifo_and_clear():
    q = ActionQueue(ACTION_DIM)
    assert q.empty
    q.push_chunk(np.arange(6))
    assert len(q) == 3
    np.testing.assert_array_equal(q.pop(), [0, 1])
    np.testing.assert_array_equal(q.pop(), [2, 3])
    q.clear()
    assert q.empty
    with pytest.raises(ValueError, match='multiple of action_dim'):
        q.push_chunk(np.arange(5))


@pytest.mark.parametrize('horizon', [1, 3, 5])
def test_chunk_sampled_every_h_steps_and_queue_cleared_on_reset(horizon):
    episode_length = 7
    env = CounterEnv(episode_length=episode_length)
    agent = FakeAgent(horizon)
    evaluate(agent, env, ACTION_DIM, num_eval_episodes=2, seed=10)

    sampled_steps = [int(obs[0]) for obs, _ in agent.calls]
    per_episode = list(range(0, episode_length, horizon))
    # A new episode starts with a fresh chunk at step 0 even if the last chunk was not used up.
    assert sampled_steps == per_episode * 2
    for actions in env.actions:
        assert len(actions) == episode_length
        for t, action in enumerate(actions):
            chunk_start = t - t % horizon
            np.testing.assert_allclose(action, expected_chunk(agent, chunk_start)[t % horizon], rtol=1e-6)
            assert np.all(np.abs(action) <= 1.0)
            assert isinstance(action, np.ndarray)


def test_episode_seeds_and_keys_independent_of_agent_rng_and_episode_count():
    env = CounterEnv()
    agent = FakeAgent(3)
    evaluate(agent, env, ACTION_DIM, num_eval_episodes=3, seed=7)
    assert env.reset_seeds == [7, 8, 9]
    keys_a = [k for _, k in agent.calls]
    # Keys differ across episodes and across chunks within an episode.
    assert len(set(keys_a)) == len(keys_a)

    # "Training" changes the agent's own key and the global numpy state; fewer episodes are run this time.
    env2 = CounterEnv()
    agent2 = FakeAgent(3)
    agent2.rng = jax.random.PRNGKey(999)
    np.random.seed(123)
    np.random.rand(10)
    evaluate(agent2, env2, ACTION_DIM, num_eval_episodes=2, seed=7)
    assert env2.reset_seeds == [7, 8]
    keys_b = [k for _, k in agent2.calls]
    assert keys_b == keys_a[: len(keys_b)]

    env3 = CounterEnv()
    agent3 = FakeAgent(3)
    evaluate(agent3, env3, ACTION_DIM, num_eval_episodes=1, seed=8)
    assert env3.reset_seeds == [8]
    # Seed 8's first episode shares its env seed with seed 7's second one but not its keys.
    assert len(agent3.calls) == 3
    assert [k for _, k in agent3.calls] != keys_a[3:6]


def test_stats_averaged_without_monitor():
    env = CounterEnv(episode_length=4)
    stats, trajs, renders = evaluate(FakeAgent(2), env, ACTION_DIM, num_eval_episodes=4, seed=0)
    # Seeds 0..3: odd seeds give reward 1 per step, even seeds succeed.
    assert stats['episode.return'] == pytest.approx(2.0)
    assert stats['episode.length'] == pytest.approx(4.0)
    assert stats['success'] == pytest.approx(0.5)
    assert renders == []
    assert len(trajs) == 4
    traj = trajs[1]
    assert set(traj) == {'observation', 'action', 'reward', 'done', 'info'}
    assert [int(o[0]) for o in traj['observation']] == [0, 1, 2, 3]
    assert traj['done'] == [False, False, False, True]
    assert traj['reward'] == [1.0] * 4
    assert traj['info'][-1]['success'] == 0.0


def test_stats_taken_from_episode_monitor():
    env = CounterEnv(episode_length=3, with_monitor=True)
    stats, _, _ = evaluate(FakeAgent(2), env, ACTION_DIM, num_eval_episodes=2, seed=4)
    assert stats['episode.return'] == pytest.approx((104.0 + 105.0) / 2)
    assert stats['episode.length'] == pytest.approx(3.0)
    assert stats['episode.duration'] == pytest.approx(0.5)
    assert stats['success'] == pytest.approx(0.5)
    # The reference's names: `success` and the monitor's summary under `episode.`, nothing bare or twice.
    assert set(stats) == {'episode.return', 'episode.length', 'episode.duration', 'success'}


def test_no_success_key_when_env_does_not_report_it():
    env = CounterEnv(episode_length=2, success_at_end=False)
    stats, _, _ = evaluate(FakeAgent(1), env, ACTION_DIM, num_eval_episodes=1)
    assert 'success' not in stats
    assert stats['episode.length'] == 2.0


def test_video_episodes_rendered_but_not_counted():
    env = CounterEnv(episode_length=7)
    stats, trajs, renders = evaluate(
        FakeAgent(3), env, ACTION_DIM, num_eval_episodes=2, num_video_episodes=2, video_frame_skip=3, seed=0
    )
    assert env.reset_seeds == [0, 1, 2, 3]
    # Only seeds 0 and 1 count: returns 0 and 7.
    assert stats['episode.return'] == pytest.approx(3.5)
    assert len(trajs) == 2
    assert len(renders) == 2
    for frames in renders:
        assert frames.dtype == np.uint8
        assert frames.shape[1:] == (4, 5, 3)
        # Frames after reset, after steps 3 and 6, and the final one (step 7).
        assert frames[:, 0, 0, 0].tolist() == [0, 3, 6, 7]


def test_jax_chunks_are_executed_as_numpy_actions():
    class JaxAgent(FakeAgent):
        def sample_actions(self, observations, rng=None):
            return jax.numpy.asarray(super().sample_actions(observations, rng))

    env = CounterEnv(episode_length=5)
    stats, _, _ = evaluate(JaxAgent(2), env, ACTION_DIM, num_eval_episodes=1, seed=1)
    assert stats['episode.length'] == 5.0
    assert all(isinstance(a, np.ndarray) for a in env.actions[0])


class VaryingLengthEnv(CounterEnv):
    """Terminates after 4 + seed % 3 steps, so env copies run out of phase in batched evaluation."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        terminated = self.t >= 4 + self.seed_value % 3
        if terminated:
            info['success'] = float(self.seed_value % 2 == 0)
        return obs, reward, terminated, truncated, info


class PureAgent(flax.struct.PyTreeNode):
    """JAX-traceable agent whose chunk depends on the observation and on the key."""

    scale: jax.Array
    horizon: int = flax.struct.field(pytree_node=False, default=3)

    def sample_actions(self, observations, rng=None):
        noise = jax.random.uniform(rng, (self.horizon * ACTION_DIM,), minval=-1.5, maxval=1.5)
        return noise + self.scale * observations[0]


def test_batched_evaluation_matches_sequential(monkeypatch):
    agent = PureAgent(scale=jnp.float32(0.1))
    kwargs = dict(num_eval_episodes=5, num_video_episodes=1, video_frame_skip=2, seed=3)
    seq_env = VaryingLengthEnv(episode_length=50)
    stats_s, trajs_s, renders_s = evaluate(agent, seq_env, ACTION_DIM, **kwargs)

    copies = [VaryingLengthEnv(episode_length=50) for _ in range(3)]
    calls = []
    vmapped_sample = evaluation.sample_episode_chunks

    def counted_sample(agent, observations, *key_parts):
        calls.append(len(observations))
        return vmapped_sample(agent, observations, *key_parts)

    monkeypatch.setattr(evaluation, 'sample_episode_chunks', counted_sample)
    stats_b, trajs_b, renders_b = evaluate(agent, None, ACTION_DIM, envs=copies, **kwargs)
    # Every copy ran episodes, and the batches were padded to the number of copies.
    assert all(env.reset_seeds for env in copies)
    assert sorted(s for env in copies for s in env.reset_seeds) == seq_env.reset_seeds == list(range(3, 9))
    assert set(calls) == {3}
    assert stats_b.keys() == stats_s.keys()
    for key in stats_s:
        assert stats_b[key] == pytest.approx(stats_s[key], abs=1e-6)
    assert len(trajs_b) == len(trajs_s) == 5
    for tb, ts in zip(trajs_b, trajs_s):
        np.testing.assert_allclose(np.array(tb['action']), np.array(ts['action']), atol=1e-6)
        np.testing.assert_array_equal(np.array(tb['observation']), np.array(ts['observation']))
        assert tb['done'] == ts['done']
    assert len(renders_b) == 1
    np.testing.assert_array_equal(renders_b[0], renders_s[0])

    # Two copies give the same statistics as three.
    stats_d, _, _ = evaluate(agent, None, ACTION_DIM, envs=[VaryingLengthEnv(50) for _ in range(2)], **kwargs)
    assert stats_d == pytest.approx(stats_s, abs=1e-6)


def test_lockstep_evaluation_of_several_agents_matches_each_alone():
    agents = [PureAgent(scale=jnp.float32(0.1)), PureAgent(scale=jnp.float32(0.3))]
    seeds, options = (3, 7), dict(num_eval_episodes=5, num_video_episodes=1, video_frame_skip=2)
    alone = [
        evaluate(agent, None, ACTION_DIM, envs=[VaryingLengthEnv(episode_length=50) for _ in range(2)], seed=seed,
                 **options)  # fmt: skip
        for agent, seed in zip(agents, seeds, strict=True)
    ]

    def sample_chunks(observations, key_seeds, indices, chunks):
        return np.stack([
            evaluation._fetch(evaluation.sample_episode_chunks(a, observations[g], key_seeds[g], indices[g], chunks[g]))
            for g, a in enumerate(agents)
        ])  # fmt: skip

    env_sets = [[VaryingLengthEnv(episode_length=50) for _ in range(2)] for _ in agents]
    kwargs = evaluation.runner_options(5, 2, record_trajectories=True)
    finished = evaluation.run_lockstep(sample_chunks, env_sets, ACTION_DIM, list(seeds), 6, kwargs)
    for g, (stats, trajs, renders) in enumerate(alone):
        together = evaluation.summarize([finished[g][i] for i in range(6)], 5, True)
        assert together[0] == pytest.approx(stats, abs=1e-6)
        for ta, tb in zip(together[1], trajs, strict=True):
            np.testing.assert_allclose(np.array(ta['action']), np.array(tb['action']), atol=1e-6)
        np.testing.assert_array_equal(together[2][0], renders[0])
    assert alone[0][0] != pytest.approx(alone[1][0], abs=1e-6)  # the two evaluations differ
