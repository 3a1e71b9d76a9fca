"""Policy evaluation with open-loop execution of action chunks.

The agent proposes a chunk of H actions at once; the chunk is executed open loop (one action per env step) and a
new chunk is requested only after the previous one is used up. The per-episode bookkeeping lives in `ActionQueue`
and `EpisodeRunner` so that a batched evaluator (several env copies stepped in lockstep, sampling only for the
copies whose queue is empty) can reuse it without changing what a single episode sees.
"""

from collections import deque

import jax
import numpy as np

from log_utils import to_scalar


class ActionQueue:
    """FIFO of single-step actions cut from the agent's chunks."""

    def __init__(self, action_dim):
        self.action_dim = int(action_dim)
        self._actions = deque()

    def __len__(self):
        return len(self._actions)

    @property
    def empty(self):
        """True when a new chunk has to be sampled before the next step."""
        return not self._actions

    def clear(self):
        """Drops leftover actions, e.g. at an episode boundary, so a chunk never spans two episodes."""
        self._actions.clear()

    def push_chunk(self, chunk):
        """Appends a flat chunk of shape (H * action_dim,) (or (action_dim,)) as H single-step actions."""
        chunk = np.asarray(chunk)
        if chunk.size == 0 or chunk.size % self.action_dim != 0:
            raise ValueError(f'action chunk of size {chunk.size} is not a multiple of action_dim={self.action_dim}')
        self._actions.extend(chunk.reshape(-1, self.action_dim))

    def pop(self):
        """Removes and returns the next action to execute."""
        return self._actions.popleft()


class EpisodeRunner:
    """State of one episode in progress: the action queue, the JAX key and the trajectory so far.

    Episode `index` of an evaluation call is reset with env seed `seed + index`, and its chunk k is sampled with the
    JAX key `episode_key(seed, index, k)`, made inside the compiled policy call. Nothing depends on the agent's own
    key, on how many episodes the call runs, or on the order in which episodes (or env copies) are processed.
    """

    def __init__(self, env, action_dim, seed, index, render_every=0, record=True):
        self.env = env
        # A fresh (empty) queue per episode: leftovers of the previous episode's last chunk are never executed.
        self.queue = ActionQueue(action_dim)
        self.index = index
        self.render_every = render_every
        self.record = record
        self.seed = seed
        self._num_chunks = 0
        self.frames = []
        self.trajectory = {'observation': [], 'action': [], 'reward': [], 'done': [], 'info': []}
        self.episode_return = 0.0
        self.length = 0
        self.done = False
        self.last_info = {}
        self.observation, _ = env.reset(seed=seed + index)
        if self.render_every:
            self.frames.append(self._render())

    @property
    def needs_chunk(self):
        """True when the agent must be queried before this episode can step."""
        return not self.done and self.queue.empty

    def next_chunk(self):
        """The index of the next chunk of this episode (its key is `episode_key(seed, index, chunk)`)."""
        self._num_chunks += 1
        return self._num_chunks - 1

    def push_chunk(self, chunk):
        """Queues the actions of a chunk sampled for this episode."""
        self.queue.push_chunk(chunk)

    def step(self):
        """Executes the front action of the queue in the env."""
        action = np.clip(np.asarray(self.queue.pop()), -1, 1)
        next_observation, reward, terminated, truncated, info = self.env.step(action)
        done = bool(terminated) or bool(truncated)
        if self.record:
            traj = self.trajectory
            traj['observation'].append(self.observation)
            traj['action'].append(action)
            traj['reward'].append(reward)
            traj['done'].append(done)
            traj['info'].append(info)
        self.observation = next_observation
        self.episode_return += float(reward)
        self.length += 1
        self.last_info = info
        self.done = done
        if self.render_every and (self.length % self.render_every == 0 or done):
            self.frames.append(self._render())

    def _render(self):
        return np.asarray(self.env.render()).astype(np.uint8, copy=False)

    def stats(self):
        """Per-episode statistics under the reference's names: `episode.<key>` for the EpisodeMonitor summary
        (return and length counted here when there is no monitor) and `success` (the last step's, else the
        monitor's)."""
        summary = monitor_stats(self.last_info)
        success = to_scalar(self.last_info.get('success', summary.get('success')))
        stats = {'episode.return': self.episode_return, 'episode.length': float(self.length)}
        stats.update({f'episode.{k}': v for k, v in summary.items() if k != 'success'})
        if success is not None:
            stats['success'] = success
        return stats


def monitor_stats(info):
    """The scalar entries of the EpisodeMonitor summary `info['episode']` of an episode's last step ({} if none)."""
    stats = {}
    for key, value in (info.get('episode') or {}).items():
        value = to_scalar(value)
        if value is not None:
            stats[key] = value
    return stats


def mean_stats(per_episode):
    """Per-key means over episodes; a key missing from some episodes is averaged over those that report it."""
    keys = []
    for stats in per_episode:
        keys.extend(k for k in stats if k not in keys)
    return {k: float(np.mean([s[k] for s in per_episode if k in s])) for k in keys}


def episode_key(seed, index, chunk):
    """The JAX key of chunk `chunk` of episode `index` of an evaluation with base seed `seed`."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), index), chunk)


def _sample(agent, observation, seed, index, chunk):
    return agent.sample_actions(observations=observation, rng=episode_key(seed, index, chunk))


def _fetch(chunks):
    # The one wait on the device of a policy query: its actions.
    with jax.transfer_guard_device_to_host('allow'):
        return np.asarray(chunks)


_sample_one = jax.jit(_sample)


@jax.jit
def _vmapped_sample(agent, observations, seed, indices, chunks):
    return jax.vmap(_sample, in_axes=(None, 0, None, 0, 0))(agent, observations, seed, indices, chunks)


def run_episode(agent, env, action_dim, seed, index, render_every=0, record=True):
    """Runs one episode to completion; returns its `EpisodeRunner`. A JAX-pytree agent samples in one compiled call
    per chunk; any other object with `sample_actions` gets the episode's key."""
    runner = EpisodeRunner(env, action_dim, seed, index, render_every=render_every, record=record)
    compiled = _is_pytree(agent)
    while not runner.done:
        if runner.needs_chunk:
            chunk = runner.next_chunk()
            if compiled:
                runner.push_chunk(_fetch(_sample_one(agent, runner.observation, seed, index, chunk)))
            else:
                key = episode_key(seed, index, chunk)
                runner.push_chunk(agent.sample_actions(observations=runner.observation, rng=key))
        runner.step()
    return runner


def _is_pytree(agent):
    """Whether `agent` is a JAX pytree of arrays (the agents are), which a compiled call can take."""
    leaves = jax.tree_util.tree_leaves(agent)
    return bool(leaves) and all(isinstance(x, jax.Array | np.ndarray | np.generic) for x in leaves)


def _run_batched(agent, envs, action_dim, seed, num_episodes, runner_kwargs):
    """Runs episodes 0..num_episodes-1 over the env copies in lockstep; returns {index: finished runner}.

    A copy that finishes an episode immediately starts the next unassigned one, so copies drift out of phase and
    only the copies whose queue is empty are sampled for. Results do not depend on the number of copies because
    each episode's seed and keys depend on its index only.
    """
    next_index = iter(range(num_episodes))
    finished = {}
    slots = [None] * len(envs)

    def start(slot):
        index = next(next_index, None)
        slots[slot] = (
            None if index is None else EpisodeRunner(envs[slot], action_dim, seed, index, **runner_kwargs(index))
        )

    for slot in range(len(envs)):
        start(slot)
    while any(runner is not None for runner in slots):
        waiting = [runner for runner in slots if runner is not None and runner.needs_chunk]
        if waiting:
            # Padded to the number of copies (repeating the first row), so the compiled sampler has one input shape.
            rows = waiting + waiting[:1] * (len(envs) - len(waiting))
            observations = np.stack([runner.observation for runner in rows])
            indices = np.array([runner.index for runner in rows], dtype=np.int32)
            chunk_ids = np.array([runner.next_chunk() for runner in waiting] + [0] * (len(rows) - len(waiting)))
            chunks = _fetch(_vmapped_sample(agent, observations, seed, indices, chunk_ids.astype(np.int32)))
            for runner, chunk in zip(waiting, chunks):
                runner.push_chunk(chunk)
        for slot, runner in enumerate(slots):
            if runner is None:
                continue
            runner.step()
            if runner.done:
                finished[runner.index] = runner
                start(slot)
    return finished


def evaluate(
    agent,
    env,
    action_dim,
    num_eval_episodes=50,
    num_video_episodes=0,
    video_frame_skip=3,
    seed=0,
    record_trajectories=True,
    envs=None,
):
    """Evaluates `agent` in `env`, executing each sampled action chunk open loop.

    Args:
        agent: Object with `sample_actions(observations=..., rng=...)` returning a flat chunk of H * action_dim
            (or action_dim) values for a single observation.
        env: Gymnasium env (5-tuple step API; 4-tuple envs are accepted too).
        action_dim: Size of one env action.
        num_eval_episodes: Episodes that count towards the statistics.
        num_video_episodes: Extra episodes rendered with `env.render()`, not counted in the statistics.
        video_frame_skip: Keep one frame every this many steps (plus the first and last frame).
        seed: Episode i is reset with seed `seed + i` and samples with keys derived from `PRNGKey(seed)`, so the
            same call gives the same episodes at any point of training.
        record_trajectories: Set False to skip storing per-step data (saves memory with pixel observations).
        envs: Optional list of env copies for batched evaluation: episodes run on the copies in lockstep and the
            agent (a JAX pytree) is queried once per step, `sample_actions` vmapped over the copies whose queue is
            empty (`env` is then unused). The
            default (None) runs episodes one after another in `env`. Episode i gets the same seed and keys either
            way; the batched policy call can differ from the single one by float rounding, which contact-rich
            simulations may amplify, so per-episode results match exactly only for deterministic policies.

    Returns:
        (stats, trajectories, renders): the per-episode statistics averaged over the eval episodes; one dict of
        per-step lists (observation, action, reward, done, info) per eval episode; one uint8 array of frames
        (T, H, W, C) per video episode.
    """
    num_episodes = num_eval_episodes + num_video_episodes

    def runner_kwargs(index):
        is_video = index >= num_eval_episodes
        return dict(
            render_every=max(int(video_frame_skip), 1) if is_video else 0,
            record=record_trajectories and not is_video,
        )

    if envs:
        runners = _run_batched(agent, list(envs), action_dim, seed, num_episodes, runner_kwargs)
        runners = [runners[i] for i in range(num_episodes)]
    else:
        runners = [run_episode(agent, env, action_dim, seed, i, **runner_kwargs(i)) for i in range(num_episodes)]

    per_episode, trajectories, renders = [], [], []
    for runner in runners:
        if runner.index >= num_eval_episodes:
            renders.append(np.stack(runner.frames))
        else:
            per_episode.append(runner.stats())
            if record_trajectories:
                trajectories.append(runner.trajectory)
    stats = mean_stats(per_episode) if per_episode else {}
    return stats, trajectories, renders
