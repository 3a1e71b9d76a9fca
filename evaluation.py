"""Policy evaluation with open-loop execution of action chunks.

The agent proposes a chunk of H actions at once; the chunk is executed open loop (one action per env step) and a
new chunk is requested only after the previous one is used up. The per-episode bookkeeping lives in `ActionQueue`
and `EpisodeRunner` so that a batched evaluator (several env copies stepped in lockstep, sampling only for the
copies whose queue is empty) can reuse it without changing what a single episode sees.
"""

from collections import deque

import jax
import numpy as np

from envs.workers import step_async
from log_utils import to_scalar

EVAL_EPISODES = 50  # Episodes of an evaluation (the reference's default; the runs' `--eval_episodes` default).


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
        self._action = self._result = None  # The step `send` started.
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
        self.send()
        self.receive()

    def send(self):
        """Starts the step of the front action of the queue (in a worker process, if the env lives in one, see
        `envs.workers`); `receive` completes it."""
        self._action = np.clip(np.asarray(self.queue.pop()), -1, 1)
        self._result = step_async(self.env, self._action)

    def receive(self):
        """Completes the step `send` started."""
        action = self._action
        next_observation, reward, terminated, truncated, info = self._result()
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


def episode_chunks(agent, observations, seed, indices, chunks):
    """The chunks of one evaluation's env copies, (C, H * A): copy c acts on `observations[c]` with the key
    `episode_key(seed, indices[c], chunks[c])`. The one episode sampler: `sample_episode_chunks` compiles it for one
    agent, `training.seeds.SeedGroup` maps it over seeds."""
    return jax.vmap(_sample, in_axes=(None, 0, None, 0, 0))(agent, observations, seed, indices, chunks)


sample_episode_chunks = jax.jit(episode_chunks)


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


def run_lockstep(sample_chunks, env_sets, action_dim, seeds, num_episodes, runner_kwargs):
    """Runs episodes 0..num_episodes-1 of G evaluations at once, each over its own env copies, all in lockstep;
    returns one {index: finished runner} per evaluation.

    Evaluation g resets episode i with `seeds[g] + i` (`EpisodeRunner`). A copy that finishes an episode at once
    starts the next unassigned one of its evaluation, so copies drift out of phase and only those whose queue is
    empty are sampled for, in one call for all evaluations: `sample_chunks(observations (G, C, ...), seeds (G,),
    indices (G, C), chunks (G, C))` returns (G, C, H * A) chunks as a NumPy array, rows padded to C copies (the
    padding repeats a row and is discarded). Results do not depend on the number of copies, nor on G, because each
    episode's seed and keys depend on its evaluation's seed and its index only.
    """
    copies = len(env_sets[0])
    if any(len(envs) != copies for envs in env_sets):
        raise ValueError('every evaluation needs the same number of env copies')
    next_index = [iter(range(num_episodes)) for _ in env_sets]
    finished = [{} for _ in env_sets]
    slots = [[None] * copies for _ in env_sets]
    template = [None] * len(env_sets)  # An observation of each evaluation, for padding.

    def start(g, slot):
        index = next(next_index[g], None)
        runner = None
        if index is not None:
            runner = EpisodeRunner(env_sets[g][slot], action_dim, seeds[g], index, **runner_kwargs(index))
            template[g] = runner
        slots[g][slot] = runner

    for g in range(len(env_sets)):
        for slot in range(copies):
            start(g, slot)
    while any(runner is not None for group in slots for runner in group):
        waiting = [[r for r in group if r is not None and r.needs_chunk] for group in slots]
        if any(waiting):
            # Each evaluation's rows padded to the number of copies, so the compiled sampler has one input shape.
            rows = [w + [w[0] if w else template[g]] * (copies - len(w)) for g, w in enumerate(waiting)]
            observations = np.stack([np.stack([r.observation for r in group]) for group in rows])
            indices = np.array([[r.index for r in group] for group in rows], dtype=np.int32)
            chunk_ids = np.zeros(indices.shape, dtype=np.int32)
            for g, w in enumerate(waiting):
                chunk_ids[g, : len(w)] = [r.next_chunk() for r in w]
            chunks = sample_chunks(observations, np.asarray(seeds, dtype=np.int32), indices, chunk_ids)
            for g, w in enumerate(waiting):
                for runner, chunk in zip(w, chunks[g]):
                    runner.push_chunk(chunk)
        running = [(g, slot, r) for g, group in enumerate(slots) for slot, r in enumerate(group) if r is not None]
        for _, _, runner in running:
            runner.send()  # Env copies in worker processes step from here on, side by side.
        for g, slot, runner in running:
            runner.receive()
            if runner.done:
                finished[g][runner.index] = runner
                start(g, slot)
    return finished


def summarize(runners, num_eval_episodes, record_trajectories):
    """(stats, trajectories, renders) of the finished runners of one evaluation (see `evaluate`)."""
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


def runner_options(num_eval_episodes, video_frame_skip, record_trajectories):
    """The `EpisodeRunner` options of episode `index`: episodes past the eval ones are rendered video episodes."""

    def options(index):
        is_video = index >= num_eval_episodes
        return dict(
            render_every=max(int(video_frame_skip), 1) if is_video else 0, record=record_trajectories and not is_video
        )

    return options


def evaluate(
    agent,
    env,
    action_dim,
    num_eval_episodes=EVAL_EPISODES,
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
    runner_kwargs = runner_options(num_eval_episodes, video_frame_skip, record_trajectories)
    if envs:

        def sample_chunks(observations, seeds, indices, chunks):
            return _fetch(sample_episode_chunks(agent, observations[0], seeds[0], indices[0], chunks[0]))[None]

        finished = run_lockstep(sample_chunks, [list(envs)], action_dim, [seed], num_episodes, runner_kwargs)[0]
        runners = [finished[i] for i in range(num_episodes)]
    else:
        runners = [run_episode(agent, env, action_dim, seed, i, **runner_kwargs(i)) for i in range(num_episodes)]
    return summarize(runners, num_eval_episodes, record_trajectories)
