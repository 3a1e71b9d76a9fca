"""Small builders shared by the tests: index-tagged datasets and tiny agent configs."""

import csv
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from utils.datasets import Dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tagged_episodes(lengths, obs_dim=3, action_dim=2, success_episodes=(), image_shape=None):
    """Fields of episodes whose every step carries its global index t.

    observations[t] = t (every entry; images: t % 256), next_observations[t] = t + 0.5 (images: (t + 1) % 256),
    actions[t] = (t, -t, ...) / 1000, rewards[t] = t + 1, terminals = 1 at every episode's last step, and masks = 0 at
    the last step of the episodes listed in `success_episodes` (true terminations).
    """
    n = int(sum(lengths))
    t = np.arange(n)
    ends = np.cumsum(lengths) - 1
    terminals = np.zeros(n, np.float32)
    terminals[ends] = 1.0
    masks = np.ones(n, np.float32)
    for ep in success_episodes:
        masks[ends[ep]] = 0.0
    if image_shape is None:
        observations = np.repeat(t[:, None], obs_dim, axis=1).astype(np.float32)
        next_observations = observations + 0.5
    else:
        observations = np.broadcast_to((t % 256).astype(np.uint8)[:, None, None, None], (n, *image_shape)).copy()
        next_observations = np.broadcast_to(((t + 1) % 256).astype(np.uint8)[:, None, None, None], (n, *image_shape))
        next_observations = next_observations.copy()
    signs = np.where(np.arange(action_dim) % 2 == 0, 1.0, -1.0)
    actions = (t[:, None] * signs[None, :] / 1000.0).astype(np.float32)
    return dict(
        observations=observations,
        actions=actions,
        rewards=(t + 1).astype(np.float32),
        terminals=terminals,
        masks=masks,
        next_observations=next_observations,
    )


def tagged_dataset(lengths, seed=0, **kwargs):
    """A `Dataset` of `tagged_episodes`; options like frame_stack/p_aug go to `Dataset.create`."""
    options = {k: kwargs.pop(k) for k in ('frame_stack', 'p_aug') if k in kwargs}
    return Dataset.create(seed=seed, **tagged_episodes(lengths, **kwargs), **options)


def sample_transitions(dataset, batch_size):
    """`batch_size` single transitions of `dataset`, uniform over the stored ones (frame-stacked and augmented like
    its chunk batches), on the dataset's generator."""
    logical = dataset.rng.integers(0, dataset.size, size=batch_size)
    batch = dataset.get_subset(dataset._physical(logical))
    if dataset.frame_stack is not None:
        batch['observations'], batch['next_observations'] = dataset._stacked_observations(logical)
    if batch['observations'].ndim >= 4:
        dataset._augment(batch, ['observations', 'next_observations'])
    return batch


def random_dataset(n=300, obs_dim=5, action_dim=2, episode_length=50, seed=0):
    """A dataset of random transitions in fixed-length episodes, for agent tests."""
    rng = np.random.default_rng(seed)
    terminals = np.zeros(n, np.float32)
    terminals[episode_length - 1 :: episode_length] = 1.0
    observations = rng.normal(size=(n, obs_dim)).astype(np.float32)
    return Dataset.create(
        seed=seed,
        observations=observations,
        actions=rng.uniform(-1, 1, size=(n, action_dim)).astype(np.float32),
        rewards=rng.normal(size=n).astype(np.float32),
        terminals=terminals,
        masks=np.ones(n, np.float32),
        next_observations=np.roll(observations, -1, axis=0),
    )


def _tiny_config(get_config, settings, overrides):
    config = get_config()
    for k, v in {**settings, **overrides}.items():
        setattr(config, k, v)
    return config


# Each QAM-protocol agent's keys for tests that compile and run in seconds (besides `TINY_NETWORKS`): few flow,
# SDE or diffusion steps, and the method's main weight set so that its terms matter.
TINY_NETWORKS = dict(actor_hidden_dims=(16, 16), value_hidden_dims=(16, 16), num_qs=3, batch_size=16)
TINY_KEYS = {
    'qam': dict(flow_steps=3),
    'fedit': dict(flow_steps=3, edit_scale=0.3),
    'dcgql': dict(diffusion_steps=4, time_dim=8, alpha=2.0, inv_temp=1.5),
    'rebrac': dict(alpha_actor=0.1),
    'dsrl': dict(flow_steps=3, noise_scale=0.8),
    'cgql': dict(flow_steps=3, inv_temp=10.0, guidance_coef=0.1, noisy_coef=0.1),
    'fbrac': dict(flow_steps=3, alpha=1.0),
    'ifql': dict(flow_steps=3, num_samples=4),
    'bam': dict(flow_steps=3, inv_temp=10.0),
    'fawac': dict(flow_steps=3, inv_temp=0.8),
}


def tiny_config(agent_name, horizon_length=3, **overrides):
    """The `get_config()` of a QAM-protocol agent (`TINY_KEYS`) with tiny networks, `horizon_length` and
    `overrides`."""
    from agents import agent_module

    settings = dict(horizon_length=horizon_length, **TINY_NETWORKS, **TINY_KEYS[agent_name])
    return _tiny_config(agent_module({'agent_name': agent_name}).get_config, settings, overrides)


def tiny_qam_config(horizon_length=3, **overrides):
    """QAM config with tiny networks and few flow steps (the adjoint pass is one VJP per step)."""
    return tiny_config('qam', horizon_length, **overrides)


def tiny_acfql_config(horizon_length=3, **overrides):
    """ACFQL config with tiny networks so that tests compile and run in seconds on a CPU."""
    from agents.acfql import get_config

    settings = dict(horizon_length=horizon_length, actor_hidden_dims=(32, 32), value_hidden_dims=(32, 32),
                    flow_steps=3, actor_num_samples=4, batch_size=16)  # fmt: skip
    return _tiny_config(get_config, settings, overrides)


def sequential_updates_with_a_resume(agent, batches, save_dir):
    """`agent` after one `update` on each of `batches` in turn, and the last info; on the way, checks that an agent
    saved after the first update (`save_agent`) and restored into a fresh one (`restore_agent_with_file`) goes on
    bit for bit: all a resumed run needs of an agent (its whole state is in the checkpoint)."""
    import jax

    from utils.flax_utils import restore_agent_with_file, save_agent

    agent_after, info = agent.update(batches[0])
    restored = restore_agent_with_file(agent, save_agent(agent_after, str(save_dir), 1))
    for batch in batches[1:]:
        agent_after, info = agent_after.update(batch)
        restored, restored_info = restored.update(batch)
    ours, theirs = jax.device_get((agent_after, info)), jax.device_get((restored, restored_info))
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs), strict=True):
        np.testing.assert_array_equal(a, b)
    return agent_after, info


# A tiny main.py run on the generated cube-single data: 16x16 networks, chunks of 2, one evaluation episode; the
# tests add its lengths and intervals.
TINY_CUBE_RUN = (
    '--env_name=cube-single-play-singletask-task2-v0', '--agent.actor_hidden_dims=(16,16)',
    '--agent.value_hidden_dims=(16,16)', '--agent.batch_size=8', '--agent.flow_steps=2',
    '--agent.actor_num_samples=2', '--eval_episodes=1', '--eval_envs=1', '--horizon_length=2', '--fused_steps=2',
)  # fmt: skip


def subprocess_env():
    """Environment for driver subprocesses: CPU JAX, no wandb, the repo importable, and the OpenGL backend the
    drivers would choose here (probed once per test session; robosuite, imported by some tests, leaves
    MUJOCO_GL=egl in this process whether or not EGL renders)."""
    from envs.gl_backend import DISABLED, choose_gl_backend

    env = dict(os.environ, WANDB_MODE='disabled', PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
    env.pop('PYOPENGL_PLATFORM', None)
    env['MUJOCO_GL'] = choose_gl_backend(environ={})
    if env['MUJOCO_GL'] != DISABLED:
        env['PYOPENGL_PLATFORM'] = env['MUJOCO_GL']
    return env


# Generated test datasets, kept between suite runs like the compilation cache (conftest.py): each is made once per
# generator version and arguments, then copied into the tests' temporary folders.
DATA_CACHE = os.path.join(os.path.expanduser('~'), '.cache', 'qc-jax', 'test-data')


def _data_key(args):
    """The cache key of a generated dataset: the arguments, the source of `envs/` (the generator and the environments
    and renderer it builds) and the simulator versions."""
    from importlib.metadata import version

    digest = hashlib.sha256(repr((args, version('ogbench'), version('mujoco'), np.__version__)).encode())
    for path in sorted(glob.glob(os.path.join(ROOT, 'envs', '*.py'))):
        with open(path, 'rb') as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def generate_ogbench(out_dir, env_name='cube-single-play-v0', num_episodes=3, episode_length=61, env=None):
    """Writes a tiny OGBench play dataset (and its val split of one episode) made by the project's generator into
    `out_dir` (generated on the first call for these arguments and generator, then copied from `DATA_CACHE`).
    `env`: extra environment variables of the generator (a visual task's renderer)."""
    args = [
        f'--env_name={env_name}',
        f'--num_episodes={num_episodes}',
        '--num_val_episodes=1',
        f'--episode_length={episode_length}',
        '--seed=0',
        '--workers=1',
    ]  # a few short episodes: starting worker processes would take longer than collecting them
    cached = os.path.join(DATA_CACHE, _data_key(args))
    if not os.path.isdir(cached):
        os.makedirs(DATA_CACHE, exist_ok=True)
        made = tempfile.mkdtemp(dir=DATA_CACHE, prefix='making-')
        cmd = [sys.executable, '-m', 'envs.generate_ogbench', f'--save_dir={made}', *args]
        subprocess.run(cmd, cwd=ROOT, env=dict(subprocess_env(), **(env or {})), check=True, capture_output=True)
        try:
            os.rename(made, cached)  # atomic: a concurrent test process sees all of it or nothing
        except OSError:  # another process made it first
            shutil.rmtree(made, ignore_errors=True)
    shutil.copytree(cached, out_dir, dirs_exist_ok=True)
    return str(out_dir)


def generate_cube_single(out_dir, num_episodes=3, episode_length=61):
    """A tiny cube-single play dataset in `out_dir` (see `generate_ogbench`)."""
    return generate_ogbench(out_dir, num_episodes=num_episodes, episode_length=episode_length)


def run_driver(script, args):
    """Runs a driver script from the repo root; returns the CompletedProcess (text output captured)."""
    return subprocess.run(
        [sys.executable, script, *args], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True
    )


def start_driver(args):
    """Starts `main.py args` from the repo root without waiting (to signal it); output captured as text."""
    return subprocess.Popen(
        [sys.executable, 'main.py', *args], cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for(predicate, proc, timeout=120):
    """Whether `predicate()` came true within `timeout` seconds while `proc` still ran."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def checkpoint_files(run_dir):
    """The training checkpoints of a run directory, oldest first."""
    return sorted(glob.glob(os.path.join(run_dir, 'checkpoints', 'ckpt_*.pkl')))


def read_csv(path):
    """Rows of a CSV file as dicts."""
    with open(path) as f:
        return list(csv.DictReader(f))


def only_run_dir(save_dir):
    """The single run directory `save_dir/<group>/<exp>` a driver created."""
    runs = glob.glob(os.path.join(str(save_dir), '*', '*'))
    assert len(runs) == 1, runs
    return runs[0]


def parse_run(preset, argv):
    """The validated `RunConfig` of a driver preset and its command-line arguments, as the drivers build it."""
    from unittest import mock

    from absl import flags

    from training import define_flags, from_flags

    flag_values = flags.FlagValues()
    argv = ['prog', *argv]
    # ml_collections' config flag reads its `--agent.*` overrides from sys.argv (when it is defined and parsed), as
    # it does in the drivers.
    with mock.patch.object(sys, 'argv', argv):
        define_flags(preset, flag_values)
        flag_values(argv)
    return from_flags(flag_values, preset)


def refusal_in_process(driver, argv):
    """(exit code, stderr) of a driver refusing `argv`: its command-line parsing (`training.config.flags_parser`,
    on fresh flags), then its run config (`from_flags`); None where both accept it. What the driver process does
    before it loads anything, without the second it spends importing JAX."""
    import contextlib
    import io
    from unittest import mock

    from absl import flags

    import main
    import main_online
    from training import flags_parser, from_flags
    from utils.errors import UserError

    preset = {'main.py': main.PRESET, 'main_online.py': main_online.PRESET}[driver]
    fresh = flags.FlagValues()
    argv = [driver, *argv]
    stderr = io.StringIO()
    # ml_collections' config flag reads its `--agent.*` overrides from sys.argv, as in the drivers.
    with mock.patch.object(sys, 'argv', argv), contextlib.redirect_stderr(stderr):
        try:
            flags_parser(preset, 'summary', fresh)(argv)
        except SystemExit as e:
            return e.code, stderr.getvalue()
        try:
            from_flags(fresh, preset)
        except UserError as e:
            return e.exit_code, f'{e.prefix}{e}'
    return None


def fake_run(sweep_dir, name, steps, success, offline_steps, online_steps, finished=True, flags=None):
    """A run directory of a sweep as the drivers leave it: eval.csv, flags.json, finished.json when finished."""
    path = os.path.join(sweep_dir, 'runs', name)
    os.makedirs(path)
    with open(os.path.join(path, 'eval.csv'), 'w') as f:
        f.write('step,episode.return,success\n')
        f.writelines(f'{s},0,{v}\n' for s, v in zip(steps, success, strict=True))
    flags = {'online_steps': online_steps} | ({'offline_steps': offline_steps} if offline_steps else {}) | (flags or {})
    with open(os.path.join(path, 'flags.json'), 'w') as f:
        json.dump(flags, f)
    if finished:
        open(os.path.join(path, 'finished.json'), 'w').write('{}')
