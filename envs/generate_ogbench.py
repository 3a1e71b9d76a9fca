"""Writes an OGBench manipulation `play` dataset locally, for machines that cannot download OGBench's files.

It drives OGBench's own plan oracles in data-collection mode with the settings of OGBench's published play datasets
(action noise 0.1, noise smoothing 0.5, 1001-step episodes, a new random subtask whenever the oracle finishes one,
cube stacking probabilities per cube count, validation episodes = a tenth of the training ones), and saves the
same npz layout (`observations, actions, terminals, qpos, qvel`, plus `button_states` for scene and puzzle).

    python -m envs.generate_ogbench --env_name=cube-single-play-v0 --num_episodes=50 --save_dir=data/ogbench

writes data/ogbench/cube-single-play-v0.npz and data/ogbench/cube-single-play-v0-val.npz, which
`make_env_and_datasets('cube-single-play-singletask-task2-v0', dataset_dir='data/ogbench')` loads.

Visual datasets (`visual-cube-single-play-v0`, ...) are collected like OGBench collects its own: the same oracles run
in the pixel-based environment (they plan from the simulator state in `info`, never from the observation), and the
64x64x3 uint8 frames are stored as `observations`, next to the `qpos`/`qvel` the single-task relabelling needs.
Rendering is offscreen, so set MUJOCO_GL first (`egl` on a GPU node, `osmesa` on CPU):

    MUJOCO_GL=osmesa python -m envs.generate_ogbench --env_name=visual-cube-single-play-v0 --num_episodes=2 \
        --num_val_episodes=1 --episode_length=20 --save_dir=data/ogbench
"""

import argparse
import contextlib
import os
import re
from collections import defaultdict

import numpy as np

from envs.common import EnvError
from envs.ogbench_utils import make_rendering_env, reused_compiled_models
from utils.errors import run_cli

# Number of training episodes of OGBench's published play datasets.
DEFAULT_NUM_EPISODES = {
    'cube-single': 1000,
    'cube-double': 1000,
    'cube-triple': 3000,
    'cube-quadruple': 5000,
    'scene': 1000,
    'puzzle-3x3': 1000,
    'puzzle-4x4': 1000,
    'puzzle-4x5': 3000,
    'puzzle-4x6': 5000,
}
_ENV_RE = re.compile(
    r'^(?P<visual>visual-)?(?P<env>cube-(?:single|double|triple|quadruple)|scene|puzzle-\d+x\d+)(?:-play)?-(?P<v>v\d+)$'
)


def parse_env_name(name):
    """(environment base, gym id, dataset name) from `cube-single-play-v0` or `cube-single-v0` (optionally with the
    `visual-` prefix, which the gym id and the dataset name keep and the base drops)."""
    m = _ENV_RE.match(name)
    if m is None:
        raise EnvError(
            f'cannot generate {name!r}: expected an OGBench manipulation play dataset name such as '
            f'cube-single-play-v0, scene-play-v0, puzzle-3x3-play-v0 or visual-cube-single-play-v0'
        )
    visual = m['visual'] or ''
    return m['env'], f'{visual}{m["env"]}-{m["v"]}', f'{visual}{m["env"]}-play-{m["v"]}'


def sample_p_stack(env_base, rng):
    """Per-episode probability that a new cube target is on top of another cube (OGBench's play settings)."""
    ranges = {
        'cube-single': (0.0, 0.0),
        'cube-double': (0.0, 0.25),
        'cube-triple': (0.05, 0.35),
        'cube-quadruple': (0.1, 0.5),
    }
    if env_base in ranges:
        lo, hi = ranges[env_base]
        return float(rng.uniform(lo, hi)) if hi > lo else lo
    return 0.5


@contextlib.contextmanager
def legacy_numpy_seed(seed):
    """Seeds NumPy's global generator for the duration of the block, then restores its previous state.

    OGBench's oracles draw their plan noise from the global generator; seeding it here makes a run reproducible
    without leaving the caller's global state changed.
    """
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def _make_oracles(env, env_base, noise, noise_smoothing):
    from ogbench.manipspace.oracles.plan.button_plan import ButtonPlanOracle
    from ogbench.manipspace.oracles.plan.cube_plan import CubePlanOracle
    from ogbench.manipspace.oracles.plan.drawer_plan import DrawerPlanOracle
    from ogbench.manipspace.oracles.plan.window_plan import WindowPlanOracle

    kw = dict(env=env, noise=noise, noise_smoothing=noise_smoothing)
    if env_base.startswith('cube'):
        return {'cube': CubePlanOracle(**kw)}
    if env_base == 'scene':
        return {
            'cube': CubePlanOracle(**kw),
            'button': ButtonPlanOracle(**kw),
            'drawer': DrawerPlanOracle(**kw),
            'window': WindowPlanOracle(**kw),
        }
    # Puzzle buttons are pressed with a closed gripper.
    return {'button': ButtonPlanOracle(gripper_always_closed=True, **kw)}


def _scene_episode_is_healthy(ep_qpos):
    # Like OGBench: the cube must stay in view, i.e. not too far right, and only far left when inside the drawer.
    xyz = np.asarray(ep_qpos)[:, 14:17]
    too_right = (xyz[:, 1] >= 0.29).any()
    left_outside_drawer = ((xyz[:, 1] <= -0.3) & ((xyz[:, 2] < 0.06) | (xyz[:, 2] > 0.08))).any()
    return not (too_right or left_outside_drawer)


def collect_episode(env, oracles, env_base, rng, episode_length, reset_seed=None):
    """One data-collection episode of `episode_length` steps from `env.reset(seed=reset_seed)`; returns a dict of
    per-step arrays."""
    ob, info = env.reset(seed=reset_seed)
    p_stack = sample_p_stack(env_base, rng)
    agent = oracles[info['privileged/target_task']]
    agent.reset(ob, info)
    ep = defaultdict(list)
    has_buttons = hasattr(env.unwrapped, '_cur_button_states')
    done = False
    while not done:
        action = np.clip(np.asarray(agent.select_action(ob, info)), -1, 1)
        next_ob, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        if agent.done:
            agent_ob, agent_info = env.unwrapped.set_new_target(p_stack=p_stack)
            agent = oracles[agent_info['privileged/target_task']]
            agent.reset(agent_ob, agent_info)
        ep['observations'].append(ob)
        ep['actions'].append(action)
        ep['terminals'].append(done)
        ep['qpos'].append(info['prev_qpos'])
        ep['qvel'].append(info['prev_qvel'])
        if has_buttons:
            ep['button_states'].append(info['prev_button_states'])
        ob = next_ob
    return {k: np.asarray(v) for k, v in ep.items()}


def episode_seeds(seed, index, attempt=0):
    """(reset seed, oracle noise seed, generator) of episode `index` of a dataset made with `seed`: every episode
    has its own, so it is the same whichever worker collects it and whatever it collected before."""
    sequence = np.random.SeedSequence([seed, index, attempt])
    reset_seed, noise_seed = (int(x) % 2**31 for x in sequence.generate_state(2))
    return reset_seed, noise_seed, np.random.default_rng(sequence.spawn(1)[0])


class EpisodeCollector:
    """An environment and its oracles that collect episodes by index (one per worker process)."""

    def __init__(self, gym_id, env_base, episode_length, noise, noise_smoothing):
        import gymnasium

        try:
            import ogbench.manipspace  # noqa: F401  (registers the environments)
        except ImportError as e:
            raise EnvError(f'ogbench cannot be imported ({e}); run: pip install ogbench==1.2.2') from e

        def make():
            with reused_compiled_models():  # the models of this process's (or the model cache's) earlier ones
                return gymnasium.make(
                    gym_id, terminate_at_goal=False, mode='data_collection', max_episode_steps=episode_length
                )

        self.env = make_rendering_env(make, gym_id) if gym_id.startswith('visual-') else make()
        self.env_base, self.episode_length = env_base, episode_length
        self.oracles = _make_oracles(self.env, env_base, noise, noise_smoothing)

    def collect(self, seed, index):
        """Episode `index` of the dataset made with `seed` (per-step arrays). A scene episode that OGBench would drop
        (the cube out of view) is redone with the episode's next seeds."""
        attempt = 0
        while True:
            reset_seed, noise_seed, rng = episode_seeds(seed, index, attempt)
            with legacy_numpy_seed(noise_seed):
                ep = collect_episode(self.env, self.oracles, self.env_base, rng, self.episode_length, reset_seed)
            if self.env_base != 'scene' or _scene_episode_is_healthy(ep['qpos']):
                return ep
            attempt += 1


_COLLECTOR = None  # The worker process's `EpisodeCollector`.


def _start_worker(*args):
    global _COLLECTOR
    _COLLECTOR = EpisodeCollector(*args)


def _collect_in_worker(seed, index):
    return index, _COLLECTOR.collect(seed, index)


def collect_episodes(gym_id, env_base, total, episode_length, seed, noise, noise_smoothing, workers, show_progress):
    """Episodes 0..total-1, collected by `workers` processes (this one when 1); the same episodes for any count."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from tqdm import tqdm

    settings = (gym_id, env_base, episode_length, noise, noise_smoothing)
    episodes = [None] * total
    desc = f'{gym_id} ({total} episodes of {episode_length} steps, {workers} worker{"s" * (workers > 1)})'
    with tqdm(total=total, desc=desc, unit='episode', disable=not show_progress) as progress:
        if workers == 1:
            collector = EpisodeCollector(*settings)
            for index in range(total):
                episodes[index] = collector.collect(seed, index)
                progress.update(1)
            collector.env.close()
            return episodes
        # Fresh interpreters (spawn): MuJoCo and rendering contexts are not shared with this process.
        context = multiprocessing.get_context('spawn')
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=settings) as pool:
            futures = [pool.submit(_collect_in_worker, seed, index) for index in range(total)]
            for future in as_completed(futures):
                index, ep = future.result()
                episodes[index] = ep
                progress.update(1)
    return episodes


def _to_arrays(episodes, visual=False):
    out = {}
    for k in episodes[0]:
        dtype = {'terminals': bool, 'button_states': np.int64}.get(k, np.float32)
        if k == 'observations' and visual:
            dtype = np.uint8  # Frames, as in OGBench's visual datasets.
        out[k] = np.concatenate([np.asarray(ep[k], dtype=dtype) for ep in episodes])
    return out


def generate_dataset(
    env_name,
    save_path,
    num_episodes=None,
    num_val_episodes=None,
    episode_length=1001,
    seed=0,
    noise=0.1,
    noise_smoothing=0.5,
    show_progress=True,
    workers=1,
):
    """Collects `num_episodes` training and `num_val_episodes` validation episodes and writes both npz files.

    Args:
        env_name: `cube-single-play-v0` (or `cube-single-v0`), `scene-play-v0`, `puzzle-3x3-play-v0`, ..., and their
            pixel-based `visual-` variants (rendered offscreen: MUJOCO_GL must be set before MuJoCo is imported).
        save_path: Training file; the validation file is the same path ending in `-val.npz`.
        num_episodes: Training episodes (default: the count of OGBench's published dataset).
        num_val_episodes: Validation episodes (default: num_episodes // 10, at least 1).
        episode_length: Steps per episode, 1001 as in OGBench (shorter only for quick tests).
        seed: Seed of the episodes' starts and the oracles' noise; the output is a function of the arguments.
        workers: Processes that collect episodes side by side; the output does not depend on it.

    Returns:
        (train_path, val_path).
    """
    env_base, gym_id, _ = parse_env_name(env_name)
    if num_episodes is None:
        num_episodes = DEFAULT_NUM_EPISODES.get(env_base, 1000)
    if num_val_episodes is None:
        num_val_episodes = max(1, num_episodes // 10)
    if num_episodes < 1 or episode_length < 2:
        raise EnvError('need --num_episodes >= 1 and --episode_length >= 2')
    if workers < 1:
        raise EnvError(f'need --workers >= 1, got {workers}')
    if not str(save_path).endswith('.npz'):
        raise EnvError(f'--save_path must end in .npz, got {save_path}')

    total = num_episodes + num_val_episodes
    workers = min(workers, total)
    args = (gym_id, env_base, total, episode_length, seed, noise, noise_smoothing, workers, show_progress)
    episodes = collect_episodes(*args)
    visual = gym_id.startswith('visual-')
    val_path = str(save_path)[: -len('.npz')] + '-val.npz'
    os.makedirs(os.path.dirname(os.path.abspath(save_path)), exist_ok=True)
    np.savez_compressed(save_path, **_to_arrays(episodes[:num_episodes], visual))
    np.savez_compressed(val_path, **_to_arrays(episodes[num_episodes:], visual))
    return str(save_path), val_path


def main(argv=None):
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument(
        '--env_name',
        default='cube-single-play-v0',
        help='dataset name, e.g. cube-single-play-v0, visual-cube-single-play-v0',
    )
    p.add_argument('--save_path', default=None, help='training npz path (default: <save_dir>/<dataset name>.npz)')
    p.add_argument('--save_dir', default='~/.ogbench/data', help='folder used when --save_path is not given')
    p.add_argument('--num_episodes', type=int, default=None, help="training episodes (default: OGBench's count)")
    p.add_argument('--num_val_episodes', type=int, default=None, help='validation episodes (default: a tenth)')
    p.add_argument('--episode_length', type=int, default=1001, help='steps per episode (OGBench: 1001)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--noise', type=float, default=0.1, help='plan noise level (OGBench: 0.1)')
    p.add_argument('--noise_smoothing', type=float, default=0.5, help='plan noise smoothing (OGBench: 0.5)')
    p.add_argument('--workers', type=int, default=os.cpu_count() or 1,
                   help='processes collecting episodes side by side (default: the CPU count); the data is the same '
                   'for any count')  # fmt: skip
    args = p.parse_args(argv)
    _, _, dataset_name = parse_env_name(args.env_name)
    save_path = args.save_path or os.path.join(os.path.expanduser(args.save_dir), f'{dataset_name}.npz')
    train_path, val_path = generate_dataset(
        args.env_name,
        save_path,
        num_episodes=args.num_episodes,
        num_val_episodes=args.num_val_episodes,
        episode_length=args.episode_length,
        seed=args.seed,
        noise=args.noise,
        noise_smoothing=args.noise_smoothing,
        workers=args.workers,
    )
    print(f'wrote {train_path} and {val_path}')


if __name__ == '__main__':
    run_cli(main)
