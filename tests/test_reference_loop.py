"""The online data path of both drivers against the reference's loop, transition by transition.

A plain loop written from what the reference's `main.py` / `main_online.py` do (uniform random single actions up
to `start_training` where the buffer starts empty, then open-loop chunks; reset and an empty queue at `done`;
`masks = 1 - terminated`, `terminals = done`; from `start_training` on, `utd_ratio` updates per step on chunks drawn
uniformly from `[0, size - H]` of each source, the data half first) runs next to this project's `Trainer` with the
same scripted actions on the same environment. Both must fill the same replay buffer and hand the agent the same
batches for the same sampled chunk starts, through episode ends by success and by time limit.
"""

import functools

import gymnasium
import jax
import numpy as np
import pytest
from helpers import parse_run

import main
import main_online
from agents import agents
from envs import ogbench_utils
from training import Trainer, device_replay
from training.data import LOSS_FIELDS, TRANSITION_KEYS
from training.lanes import Lane
from training.seeds import SeedGroup

ENV_NAME = 'cube-single-play-singletask-task2-v0'
HORIZON = 3
TIME_LIMIT = 30  # Steps before an episode is truncated (far below cube's own 200).
SUCCESS = 0.99  # An action whose first entry is at least this ends the episode by success.
SUCCESS_CHUNKS = {2: 1, 9: 2, 20: 0}  # Chunk index -> the action of the chunk that succeeds.
SUCCESS_RANDOM_STEPS = {17}  # Warm-up steps whose random action succeeds.


class ScriptedEnds(gymnasium.Wrapper):
    """A real environment whose episodes end by success when the action's first entry is >= `SUCCESS` and by time
    limit after `TIME_LIMIT` steps. Every reset starts from the state seeded by the number of steps taken so far,
    so two copies given the same actions see the same episodes whatever resets they had before."""

    def __init__(self, env):
        super().__init__(env)
        self.steps_taken = 0
        self.t = 0

    def reset(self, **kwargs):
        self.t = 0
        return self.env.reset(seed=1000 + self.steps_taken)

    def step(self, action):
        ob, reward, _, _, info = self.env.step(action)
        self.steps_taken += 1
        self.t += 1
        terminated = bool(action[0] >= SUCCESS)
        truncated = not terminated and self.t >= TIME_LIMIT
        return ob, reward, terminated, truncated, info


def scripted_random_action(step, action_dim):
    """The warm-up action of online step `step` (1-based)."""
    action = 0.9 * np.sin(0.37 * step * np.arange(1, action_dim + 1))
    if step in SUCCESS_RANDOM_STEPS:
        action[0] = SUCCESS
    return action.astype(np.float32)


def scripted_chunk(index, observation, action_dim):
    """Chunk `index` (0-based) of the policy, a function of the observation it acts on. (H * A,)"""
    chunk = 0.9 * np.sin(0.71 * index + float(np.sum(observation)) + 0.13 * np.arange(HORIZON * action_dim))
    chunk = chunk.reshape(HORIZON, action_dim)  # every entry within +-0.9, below `SUCCESS`
    if index in SUCCESS_CHUNKS:
        chunk[SUCCESS_CHUNKS[index], 0] = SUCCESS
    return chunk.reshape(-1).astype(np.float32)


class RecordingRng:
    """A generator that records every `integers` draw (the chunk starts) and otherwise is the generator."""

    def __init__(self, rng, name, draws):
        self._rng, self._name, self._draws = rng, name, draws

    def integers(self, low, high=None, size=None, **kwargs):
        out = self._rng.integers(low, high, size=size, **kwargs)
        self._draws.append((self._name, low, high, np.array(out)))
        return out

    def __getattr__(self, name):
        return getattr(self._rng, name)


def reference_chunks(source, starts, horizon, discount):
    """Chunks at `starts` as the reference's `sample_sequence` documents them, one step at a time."""
    n = len(starts)
    out = dict(
        observations=np.stack([source['observations'][s] for s in starts]),
        actions=np.stack([source['actions'][s : s + horizon] for s in starts]),
        next_observations=np.stack([source['next_observations'][s : s + horizon] for s in starts]),
        rewards=np.zeros((n, horizon)), masks=np.ones((n, horizon)), valid=np.ones((n, horizon)),
    )  # fmt: skip
    terminals = np.zeros((n, horizon))
    for b, s in enumerate(starts):
        for i in range(horizon):
            r, m, t = source['rewards'][s + i], source['masks'][s + i], source['terminals'][s + i]
            out['rewards'][b, i] = (out['rewards'][b, i - 1] if i else 0.0) + discount**i * r
            out['masks'][b, i] = min(out['masks'][b, i - 1], m) if i else m
            terminals[b, i] = max(terminals[b, i - 1], t) if i else t
            out['valid'][b, i] = 1.0 - terminals[b, i - 1] if i else 1.0
    return out


def reference_loop(env, dataset, prefix, online_steps, random_steps, start_training, utd, counts, discount, draws):
    """The reference's online loop with scripted actions. `prefix` is what the replay buffer starts with (the data
    for `main.py`, nothing for `main_online.py`); `counts` = (data, replay) chunks per batch; `draws` are the chunk
    starts this project's sampler drew, taken in order (each checked against the reference's range). Returns the
    replay buffer (dict of arrays) and every update's batch, in order."""
    action_dim = dataset['actions'].shape[-1]
    replay = {k: list(prefix[k]) if prefix is not None else [] for k in TRANSITION_KEYS}
    observation, _ = env.reset()
    queue, chunks, batches = [], 0, []
    for i in range(1, online_steps + 1):
        if not queue:
            if i <= random_steps:
                queue = [scripted_random_action(i, action_dim)]
            else:
                queue = list(scripted_chunk(chunks, observation, action_dim).reshape(HORIZON, action_dim))
                chunks += 1
        action = queue.pop(0)
        next_observation, reward, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
        transition = dict(
            observations=observation, actions=action, rewards=reward, terminals=float(done),
            masks=1.0 - terminated, next_observations=next_observation,
        )  # fmt: skip
        for k in TRANSITION_KEYS:
            replay[k].append(np.asarray(transition[k], dtype=np.float32))  # the buffer's dtype, as the dataset's
        if done:
            observation, _ = env.reset()
            queue = []
        else:
            observation = next_observation
        if i >= start_training:
            arrays = {k: np.stack(v) for k, v in replay.items()}
            parts = []
            for name, source, count in (('data', dataset, counts[0]), ('replay', arrays, counts[1])):
                if count == 0:
                    continue
                drawn, low, high, starts = draws.pop(0)
                size = len(source['observations'])
                assert (drawn, low, high, len(starts)) == (name, 0, size - HORIZON + 1, utd * count), i
                chunk = reference_chunks(source, starts, HORIZON, discount)
                parts.append({k: v.reshape(utd, count, *v.shape[1:]) for k, v in chunk.items()})
            batch = {k: np.concatenate([p[k] for p in parts], axis=1) for k in LOSS_FIELDS}
            batches.extend({k: v[u] for k, v in batch.items()} for u in range(utd))
    assert not draws
    return {k: np.stack(v) for k, v in replay.items()}, batches


@functools.cache
def gather_step(layout):
    """`device_replay.store_and_gather` for `layout`, compiled (op by op, a gather is dozens of dispatches)."""
    return jax.jit(functools.partial(device_replay.store_and_gather, layout=layout))


@pytest.mark.parametrize(
    'preset, extra',
    [
        (main_online.PRESET, ['--start_training=40', '--utd_ratio=2']),
        (main_online.PRESET, ['--start_training=40', '--utd_ratio=2', '--device_replay=False']),
        (main.PRESET, ['--offline_steps=0', '--start_training=3', '--agent.actor_num_samples=2',
                       '--agent.flow_steps=2']),
        (main.PRESET, ['--offline_steps=0', '--start_training=40', '--balanced_sampling', '--agent.flow_steps=2']),
    ],
    ids=['main_online', 'main_online_host_batches', 'main', 'main_balanced_sampling'],
)  # fmt: skip
def test_the_online_data_path_is_the_reference_loops(cube_dir, tmp_path, monkeypatch, preset, extra):
    monkeypatch.setenv('WANDB_MODE', 'disabled')
    online_steps = 110
    argv = [
        f'--env_name={ENV_NAME}', f'--dataset_dir={cube_dir}', f'--save_dir={tmp_path}', '--exp_name=run',
        '--agent.actor_hidden_dims=(8,)', '--agent.value_hidden_dims=(8,)', '--agent.batch_size=8',
        f'--horizon_length={HORIZON}', f'--online_steps={online_steps}', '--eval_interval=0', '--eval_episodes=1',
        '--eval_envs=1', '--log_interval=1000', '--buffer_size=1000', *extra,
    ]  # fmt: skip
    run = parse_run(preset, argv)
    draws, batches = [], []

    # This project's loop, with the scripted actions and every drawn chunk start and update batch recorded.
    step_of_random = iter(range(1, run.random_steps + 1))
    monkeypatch.setattr(
        'training.actor.OnlineActor.random_action',
        lambda self: scripted_random_action(next(step_of_random), self.action_dim),
    )
    action_dim = 5

    def sample_chunks(self, observations, key_seeds, indices):
        return np.stack([scripted_chunk(int(k), ob, action_dim) for ob, k in zip(observations, indices, strict=True)])

    monkeypatch.setattr(SeedGroup, 'sample_chunks', sample_chunks)
    real_start_online, real_batch_update, real_replay_steps = (
        Lane.start_online, SeedGroup.batch_update, SeedGroup._replay_steps)  # fmt: skip

    def start_online(self):
        real_start_online(self)
        self.dataset.rng = RecordingRng(self.dataset.rng, 'data', draws)
        self.replay.rng = RecordingRng(self.replay.rng, 'replay', draws)

    def batch_update(self, seed_batches):
        (batch,) = seed_batches  # (T * U, B, ...): the updates of T steps, in order
        batch = jax.device_get(batch)
        batches.extend({k: v[u] for k, v in batch.items()} for u in range(len(batch['observations'])))
        return real_batch_update(self, seed_batches)

    def replay_steps(self, steps):
        # The batches gathered on the device (`--device_replay`), step by step as the compiled call gathers them.
        replay, storage = self.replay, self.replay.storage
        for (packed,) in steps:
            storage, batch = gather_step(replay.layout)(storage, replay.data, packed)
            batch = jax.device_get(batch)  # one fetch, then NumPy slices
            batches.extend({k: v[u] for k, v in batch.items()} for u in range(replay.layout.updates))
        return real_replay_steps(self, steps)

    monkeypatch.setattr(Lane, 'start_online', start_online)
    monkeypatch.setattr(SeedGroup, 'batch_update', batch_update)
    monkeypatch.setattr(SeedGroup, '_replay_steps', replay_steps)
    trainer = Trainer(run, agents)
    lane = trainer.lanes[0]
    lane.env = ScriptedEnds(lane.env)
    dataset = lane.dataset
    trainer.train()
    assert (trainer.agents.replay is not None) == run.device_replay

    # The reference's loop on its own copy of the environment, with the starts this project drew.
    data = {k: dataset[k] for k in TRANSITION_KEYS}
    prefix = data if run.preset.replay_starts_with_data else None
    half = run.batch_size // 2
    counts = (half, run.batch_size - half) if run.preset.online_data_fraction else (0, run.batch_size)
    env = ScriptedEnds(ogbench_utils.make_env(ENV_NAME))
    replay, expected = reference_loop(
        env, data, prefix, online_steps, run.random_steps, run.start_training, run.utd_ratio, counts,
        run.discount, list(draws),
    )  # fmt: skip

    # Same replay buffer, transition by transition; episodes ended by success and by the time limit.
    size = len(replay['observations'])
    assert lane.replay.size == size
    for k in TRANSITION_KEYS:
        np.testing.assert_array_equal(lane.replay[k][np.arange(size)], replay[k], err_msg=k)
    online = {k: v[size - online_steps :] for k, v in replay.items()}
    assert np.sum(online['masks'] == 0) >= 2  # successes
    assert np.sum((online['terminals'] == 1) & (online['masks'] == 1)) >= 2  # time limits
    # Same batches for the same starts, in the same order, chunks across episode ends included.
    assert len(batches) == len(expected) == (online_steps - run.start_training + 1) * run.utd_ratio
    for got, want in zip(batches, expected, strict=True):
        for k in LOSS_FIELDS:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)
    replay_half = np.concatenate([b['valid'][counts[0] :] for b in batches])  # (updates * replay chunks, H)
    assert (replay_half == 0).any()  # some replay chunks ran past an episode end
