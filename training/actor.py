"""Acting online: open-loop action chunks in the training environment, one replay transition per step."""

from collections import deque

import numpy as np

from envs.workers import RemoteEnv, steps_async
from evaluation import ActionQueue, mean_stats
from utils import seeding


class OnlineActor:
    """Acts in an environment with open-loop action chunks and turns each step into a replay transition.

    A new chunk is sampled (`policy_actions`) only when the action queue is empty; the queue is cleared whenever an
    episode ends, so a chunk never spans two episodes (as in evaluation). Chunk k is sampled with the JAX key
    `fold_in(PRNGKey(key_seed), k)`, made inside the compiled policy call, so acting needs no JAX op of its own.
    With `state_fn`, `last_state` holds the simulator state each step reached, taken before any reset. With
    `frame_dim` (frame-stacked environments), transitions keep only the newest `frame_dim` entries of the
    observation's last axis: the replay buffer stacks frames itself when it samples, like the offline dataset.
    """

    def __init__(self, env, action_dim, seed, reward_fn=None, state_fn=None, frame_dim=None):
        self.env = env
        self.action_dim = action_dim
        self.reward_fn = reward_fn
        self.state_fn = state_fn
        self.frame_dim = frame_dim
        self.last_state = None
        # Each its own stream of the run seed (`utils.seeding`): chunk keys, and uniform actions before training.
        self.key_seed = np.uint32(seeding.int_seed(seed, 'actor'))
        self.chunks = 0  # Chunks sampled so far (the next chunk's key index).
        self.action_rng = seeding.generator(seed, 'random_actions')
        self.queue = ActionQueue(action_dim)
        self.observation, _ = env.reset()
        self._action = self._result = None  # The step `send` started.
        self._ahead = deque()  # Results of steps sent ahead (`push_chunk`), in order.

    def random_action(self):
        """A uniform random action in [-1, 1] (the warm-up before training starts)."""
        return self.action_rng.uniform(-1.0, 1.0, size=self.action_dim).astype(np.float32)

    def _stored(self, observation):
        return observation if self.frame_dim is None else observation[..., -self.frame_dim :]

    def push_chunk(self, chunk):
        """Queues a sampled (H * A) chunk. An environment in a worker process gets all its actions at once and steps
        through them ahead of the loop, up to an episode end; `send` then takes their results in turn."""
        self.queue.push_chunk(chunk)
        self.chunks += 1
        if isinstance(self.env, RemoteEnv):
            actions = np.clip(np.asarray(chunk).reshape(-1, self.action_dim), -1.0, 1.0)
            self._ahead.extend(steps_async(self.env, actions, self.state_fn))

    def send(self, action):
        """Starts one env step with `action`, the front of the queue or a random action (in a worker process, if the
        environment lives in one); `receive` completes it. Sending every seed's step before receiving any lets the
        workers' environments step at once."""
        if not self._ahead:  # Else the step was sent with its chunk.
            self._ahead.extend(steps_async(self.env, [np.clip(action, -1.0, 1.0)], self.state_fn))
        self._action = action
        self._result = self._ahead.popleft()

    def receive(self):
        """Completes the step `send` started. Returns (transition, info, done)."""
        action = self._action
        (next_observation, reward, terminated, truncated, info), state, reset_observation = self._result()
        if self.state_fn is not None:
            self.last_state = state
        if self.reward_fn is not None:
            reward = self.reward_fn(reward)
        done = terminated or truncated
        transition = dict(
            observations=self._stored(self.observation),
            actions=np.asarray(action, dtype=np.float32),
            rewards=np.float32(reward),
            terminals=np.float32(done),
            masks=np.float32(1.0 - terminated),
            next_observations=self._stored(next_observation),
        )
        if done:
            self.observation = reset_observation
            self.queue.clear()
            for result in self._ahead:  # The chunk's actions after the episode end never ran; their answers are None.
                result()
            self._ahead.clear()
        else:
            self.observation = next_observation
        return transition, info, done

    def step(self, action):
        """Takes one env step with `action`. Returns (transition, info, done)."""
        self.send(action)
        return self.receive()


def episode_row(episodes):
    """The `env` log row of the episodes (`monitor_stats` dicts) that ended since the last row: mean `episode.*`
    statistics and `episodes`, their count."""
    row = {f'episode.{k}': v for k, v in mean_stats(episodes).items()}
    row['episodes'] = len(episodes)
    return row


def policy_actions(actors, sample_chunks):
    """The next action of every seed's actor, with one policy call for all seeds when any queue is empty.

    `sample_chunks(observations (S, ...), key_seeds (S,), key_indices (S,))` returns (S, H * A) chunks as a NumPy
    array (`SeedGroup.sample_chunks`). Only the actors that need a new chunk count it; the others' rows of the call
    are discarded, so each seed draws what it would draw alone.
    """
    need = [actor.queue.empty for actor in actors]
    if any(need):
        observations = np.stack([actor.observation for actor in actors])
        key_seeds = np.array([actor.key_seed for actor in actors], dtype=np.uint32)
        key_indices = np.array([actor.chunks for actor in actors], dtype=np.int32)
        chunks = sample_chunks(observations, key_seeds, key_indices)  # (S, H * A)
        for actor, n, chunk in zip(actors, need, chunks, strict=True):
            if n:
                actor.push_chunk(chunk)
    return [actor.queue.pop() for actor in actors]
