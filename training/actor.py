"""Acting online: open-loop action chunks in the training environments, one replay transition per step and seed.

`SeedActors` acts for all seeds of a run (one policy call for the seeds whose queue is empty, then every seed's
environment step, side by side); each seed's `OnlineActor` holds its environment, action queue and random streams.
An environment in a worker process (`envs.workers`) and one of this process are stepped through the same calls.
"""

from collections import deque

import numpy as np

from envs.workers import steps_async
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
        """Queues a sampled (H * A) chunk and starts its steps: an environment in a worker process gets all its
        actions at once and steps through them ahead of the loop, up to an episode end (one of this process steps
        as `receive` asks); `send` then takes their results in turn."""
        self.queue.push_chunk(chunk)
        self.chunks += 1
        actions = np.clip(np.asarray(chunk).reshape(-1, self.action_dim), -1.0, 1.0)  # (H, A)
        self._ahead.extend(steps_async(self.env, actions, self.state_fn))

    def send(self, action):
        """Starts one env step with `action`, the front of the queue or a random action (in a worker process, if the
        environment lives in one); `receive` completes it. Sending every seed's step before receiving any lets the
        workers' environments step at once."""
        if not self._ahead:  # A random action; the steps of a chunk's actions started with the chunk.
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


class SeedActors:
    """Acts for every seed of a run: `step` takes each seed's next action (a uniform random one during the warm-up,
    else the next of its open-loop chunk, with one policy call for the seeds whose queue is empty), steps every
    seed's environment and returns the transitions."""

    def __init__(self, actors, agents):
        self.actors = actors  # One `OnlineActor` per seed.
        self.agents = agents  # The `training.seeds.SeedGroup` whose `sample_chunks` samples the chunks.

    def step(self, random=False):
        """One step of every seed; returns per seed (transition, info, done)."""
        actions = [actor.random_action() for actor in self.actors] if random else self.policy_actions()
        return self.env_step(actions)

    def policy_actions(self):
        """The next action of every seed, with one policy call for all seeds when any queue is empty. Only the
        actors that need a new chunk count it; the others' rows of the call are discarded, so each seed draws what
        it would draw alone."""
        need = [actor.queue.empty for actor in self.actors]
        if any(need):
            observations = np.stack([actor.observation for actor in self.actors])
            key_seeds = np.array([actor.key_seed for actor in self.actors], dtype=np.uint32)
            key_indices = np.array([actor.chunks for actor in self.actors], dtype=np.int32)
            chunks = self.agents.sample_chunks(observations, key_seeds, key_indices)  # (S, H * A)
            for actor, n, chunk in zip(self.actors, need, chunks, strict=True):
                if n:
                    actor.push_chunk(chunk)
        return [actor.queue.pop() for actor in self.actors]

    def env_step(self, actions):
        """Every seed's environment step with its action. All steps are sent before any is received, so environments
        in worker processes step side by side, and with this process's own."""
        for actor, action in zip(self.actors, actions, strict=True):
            actor.send(action)
        return [actor.receive() for actor in self.actors]
