"""OGBench family on tiny generated play datasets (a few short episodes in a temporary folder)."""

import ctypes.util
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

from envs import ogbench_utils
from envs.common import EnvError
from envs.env_utils import RunEnvs, make_env_and_datasets, make_run_envs
from envs.generate_ogbench import generate_dataset, parse_env_name
from utils import seeding

EP_LEN = 40  # Steps per generated episode (OGBench: 1001); each episode gives EP_LEN - 1 transitions.
ENV_NAME = 'cube-single-play-singletask-task2-v0'


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp('ogbench')
    generate_dataset(
        'cube-single-play-v0',
        str(d / 'cube-single-play-v0.npz'),
        num_episodes=3,
        num_val_episodes=1,
        episode_length=EP_LEN,
        seed=0,
        show_progress=False,
    )
    return d


@pytest.fixture(scope='module')
def loaded(data_dir):
    return make_env_and_datasets(ENV_NAME, dataset_dir=str(data_dir), seed=0)


def test_generated_files_have_ogbench_layout(data_dir):
    for name, episodes in (('cube-single-play-v0.npz', 3), ('cube-single-play-v0-val.npz', 1)):
        with np.load(data_dir / name) as f:
            assert set(f.keys()) == {'observations', 'actions', 'terminals', 'qpos', 'qvel'}
            assert f['observations'].shape == (episodes * EP_LEN, 28) and f['observations'].dtype == np.float32
            assert f['actions'].shape == (episodes * EP_LEN, 5) and np.abs(f['actions']).max() <= 1.0
            assert f['terminals'].dtype == bool
            np.testing.assert_array_equal(np.nonzero(f['terminals'])[0], np.arange(1, episodes + 1) * EP_LEN - 1)
            assert f['qpos'].shape[1] == 21 and f['qvel'].shape[1] == 20


def test_generation_is_the_same_for_any_number_of_workers(tmp_path):
    """Every episode has its own seeds, so one process and two worker processes (each collecting the episodes it
    happens to get, after whatever it collected before) write the same data."""
    paths = []
    for workers in (1, 2):
        paths.append(tmp_path / f'workers{workers}' / 'cube-single-play-v0.npz')
        subprocess.run(
            [sys.executable, '-m', 'envs.generate_ogbench', '--env_name=cube-single-play-v0',
             f'--save_path={paths[-1]}', '--num_episodes=4', '--num_val_episodes=1', '--episode_length=15',
             '--seed=3', f'--workers={workers}'],
            check=True, capture_output=True,
        )  # fmt: skip
    for name in ('cube-single-play-v0.npz', 'cube-single-play-v0-val.npz'):
        with np.load(paths[0].parent / name) as a, np.load(paths[1].parent / name) as b:
            assert set(a.keys()) == set(b.keys())
            for k in a.keys():
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    with np.load(paths[0]) as a:
        starts = a['qpos'][::15]
        assert len(np.unique(starts, axis=0)) == 4  # each episode starts from its own state


def test_datasets_shapes_dtypes_and_episode_ends(loaded):
    _, _, train, val = loaded
    n = 3 * (EP_LEN - 1)
    assert train.size == n and val.size == EP_LEN - 1
    assert set(train.keys()) == {'observations', 'actions', 'next_observations', 'rewards', 'masks', 'terminals'}
    for k, v in train.items():
        assert v.dtype == np.float32, k
    assert train['observations'].shape == (n, 28) and train['actions'].shape == (n, 5)
    np.testing.assert_array_equal(np.nonzero(train['terminals'])[0], np.arange(1, 4) * (EP_LEN - 1) - 1)
    # next_observations are the following observations inside an episode.
    inside = train['terminals'][:-1] == 0
    np.testing.assert_array_equal(train['next_observations'][:-1][inside], train['observations'][1:][inside])
    assert np.abs(train['actions']).max() <= 1 - 1e-5


def test_rewards_are_relabelled_like_ogbench(loaded, data_dir):
    import ogbench

    env, _, train, _ = loaded
    _, ref, _ = ogbench.make_env_and_datasets(ENV_NAME, dataset_path=str(data_dir / 'cube-single-play-v0.npz'))
    np.testing.assert_array_equal(train['rewards'], ref['rewards'])
    np.testing.assert_array_equal(train['masks'], ref['masks'])
    # One cube: reward is success - 1 and a success step does not bootstrap.
    assert set(np.unique(train['rewards'])) <= {-1.0, 0.0}
    np.testing.assert_array_equal(train['masks'], -train['rewards'])


def test_env_steps_and_reports_episode(loaded):
    env, eval_env, _, _ = loaded
    ob, _ = eval_env.reset(seed=1)
    assert ob.shape == (28,)
    for _ in range(3):
        ob, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert reward in (-1.0, 0.0) and 'success' in info and not any('privileged' in k for k in info)
    # Run to the time limit (200 steps for cube-single) so the monitor closes the episode.
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(np.zeros(5))
    assert {'return', 'length', 'success'} <= set(info['episode'])


def test_env_replays_its_own_data_format(data_dir):
    """The pinned MuJoCo/OGBench step the recorded dynamics: from a dataset state (`qpos`/`qvel`) the recorded
    action leads to the recorded next observation.

    Not bit for bit: OGBench aims each action from the effector pose MuJoCo left at the start of the last physics
    substep, which a restored `qpos`/`qvel` does not carry (with that pose restored too the replay is exact), and
    the files hold float32 states. That leaves small errors, largest in joint velocities and the contact flag; a
    change of simulator, model or observation layout leaves far larger ones, as a wrong action does here.
    """
    data = np.load(data_dir / 'cube-single-play-v0.npz')
    env = ogbench_utils.make_ogbench_env(ENV_NAME)
    env.reset(seed=0)
    qpos, qvel = data['qpos'].astype(np.float64), data['qvel'].astype(np.float64)
    steps = [t for t in range(len(qpos) - 1) if not data['terminals'][t]]

    def replay_errors(sign):
        errors = []
        for t in steps:
            env.unwrapped.set_state(qpos[t], qvel[t])
            ob, *_ = env.step(sign * data['actions'][t])
            errors.append(np.abs(ob - data['observations'][t + 1]))
        return np.array(errors)  # (T, 28)

    errors = replay_errors(1.0)
    positions = np.r_[0:6, 12:18, 19:28]  # joints, effector, gripper opening, cube pose (not velocities or contact)
    assert len(steps) == 3 * (EP_LEN - 1)
    assert errors[:, positions].max() < 1e-2 and errors.max() < 0.1 and np.median(errors) < 1e-3
    assert np.median(replay_errors(-1.0).max(axis=1)) > 0.1  # the check tells a wrong step apart


def rollout(env):
    """The observations, rewards and flags of 60 seeded random steps of an OGBench environment."""
    actions = np.random.default_rng(0).uniform(-1, 1, (60, 5))
    ob, _ = env.reset(seed=3)
    rows = [ob]
    for a in actions:
        ob, reward, terminated, truncated, info = env.step(a)
        rows.append(np.r_[ob, reward, terminated, truncated, info['success']])
    return np.concatenate(rows)


def test_environments_made_from_reused_models_step_as_freshly_compiled_ones():
    """`make_ogbench_env` compiles a task's MuJoCo models once per process and gives every later environment a copy:
    such an environment resets, steps and observes bit for bit as one that compiled its own, and owns its model."""
    import gymnasium
    import mujoco

    reused = [ogbench_utils.make_ogbench_env(ENV_NAME) for _ in range(2)]  # the second from the first's models
    compiled = mujoco.MjModel.__dict__['from_xml_string']
    assert compiled is ogbench_utils._PATCH['original']  # restored outside `make_ogbench_env`
    fresh = gymnasium.make(ogbench_utils.split_name(ENV_NAME)[0])  # compiles its own
    assert len(ogbench_utils._COMPILED) >= 2  # the scene and the arm's inverse-kinematics model
    expected = rollout(fresh)
    for env in reused:
        np.testing.assert_array_equal(rollout(env), expected)
    models = [env.unwrapped._model for env in (*reused, fresh)]
    assert models[0] is not models[1] and models[0].opt.timestep == models[2].opt.timestep
    models[0].opt.timestep *= 2  # a change to one environment's model reaches no other
    assert models[1].opt.timestep == models[2].opt.timestep


def test_models_kept_on_disk_load_as_the_compiled_ones(tmp_path, monkeypatch):
    """With `$QC_MUJOCO_MODEL_CACHE` a process loads the models another compiled (none compiles again); a damaged
    file is compiled and written again; environments made either way step bit for bit alike."""
    import gymnasium
    import mujoco

    monkeypatch.setenv(ogbench_utils.MODEL_CACHE_ENV, str(tmp_path / 'models'))
    monkeypatch.setattr(ogbench_utils, '_COMPILED', {})  # as a new process
    written = ogbench_utils.make_ogbench_env(ENV_NAME)
    files = sorted((tmp_path / 'models').iterdir())
    assert [f.suffix for f in files] == ['.mjb', '.mjb']  # the scene and the arm's inverse-kinematics model
    sizes = [f.stat().st_size for f in files]

    def no_compiling(*args, **kwargs):
        raise AssertionError('compiled although the file was there')

    with monkeypatch.context() as patch:
        patch.setattr(ogbench_utils, '_COMPILED', {})
        patch.setattr(mujoco.MjModel, 'from_xml_string', staticmethod(no_compiling))
        loaded = ogbench_utils.make_ogbench_env(ENV_NAME)
    files[0].write_bytes(files[0].read_bytes()[:1000])  # damaged
    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warning about the file to MUJOCO_LOG.TXT in the working folder
    monkeypatch.setattr(ogbench_utils, '_COMPILED', {})
    rewritten = ogbench_utils.make_ogbench_env(ENV_NAME)
    assert [f.stat().st_size for f in files] == sizes and not list((tmp_path / 'models').glob('*.part'))
    expected = rollout(gymnasium.make(ogbench_utils.split_name(ENV_NAME)[0]))
    for env in (written, loaded, rewritten):
        np.testing.assert_array_equal(rollout(env), expected)


def test_frame_stack_and_compact(data_dir):
    env, _, train, _ = make_env_and_datasets(ENV_NAME, dataset_dir=str(data_dir), frame_stack=2, compact_dataset=True)
    assert env.reset()[0].shape == (56,)
    assert 'next_observations' not in train and 'valids' in train and train.size == 3 * EP_LEN


def test_shards_cycle_one_at_a_time(data_dir, tmp_path):
    for i in range(2):
        shutil.copy(data_dir / 'cube-single-play-v0.npz', tmp_path / f'cube-single-play-v0-{i:03d}.npz')
    shutil.copy(data_dir / 'cube-single-play-v0-val.npz', tmp_path / 'cube-single-play-v0-000-val.npz')
    _, _, train, val = make_env_and_datasets(ENV_NAME, ogbench_dataset_dir=str(tmp_path))
    assert train.size == 3 * (EP_LEN - 1) and val.size == EP_LEN - 1
    cycler = ogbench_utils.OGBenchShardCycler(ENV_NAME, str(tmp_path))
    assert len(cycler) == 2 and cycler.current_path.endswith('-000.npz')
    first = cycler.current()
    second = cycler.next()
    assert cycler.current_path.endswith('-001.npz') and cycler.val_dataset() is None
    np.testing.assert_array_equal(first['rewards'], second['rewards'])
    cycler.next()
    assert cycler.index == 0 and np.abs(cycler.current()['actions']).max() <= 1 - 1e-5


def test_missing_dataset_names_path_and_generate_command(tmp_path):
    with pytest.raises(EnvError) as e:
        make_env_and_datasets('puzzle-3x3-play-singletask-task1-v0', dataset_dir=str(tmp_path))
    msg = str(e.value)
    assert os.path.join(str(tmp_path), 'puzzle-3x3-play-v0.npz') in msg
    assert 'python -m envs.generate_ogbench --env_name=puzzle-3x3-play-v0' in msg and '\n' not in msg
    with pytest.raises(EnvError, match='no dataset shards'):
        ogbench_utils.shard_paths(str(tmp_path))


def test_puzzle_generation_stores_button_states(tmp_path):
    path = str(tmp_path / 'puzzle-3x3-play-v0.npz')
    generate_dataset(
        'puzzle-3x3-play-v0', path, num_episodes=1, num_val_episodes=1, episode_length=10, show_progress=False
    )
    with np.load(path) as f:
        assert f['button_states'].shape == (10, 9) and f['button_states'].dtype == np.int64


def test_name_parsing():
    assert ogbench_utils.split_name('cube-double-play-singletask-task3-v0') == (
        'cube-double-singletask-task3-v0',
        'cube-double-play-v0',
    )
    assert ogbench_utils.split_name('scene-play-singletask-v0') == ('scene-singletask-v0', 'scene-play-v0')
    assert ogbench_utils.split_name('visual-cube-single-play-singletask-task1-v0') == (
        'visual-cube-single-singletask-task1-v0',
        'visual-cube-single-play-v0',
    )
    assert ogbench_utils.split_name('visual-puzzle-4x4-play-singletask-v0')[1] == 'visual-puzzle-4x4-play-v0'
    assert ogbench_utils.is_visual('visual-scene-play-singletask-task2-v0')
    assert not ogbench_utils.is_visual('cube-single-play-singletask-task1-v0')
    assert not ogbench_utils.is_ogbench_env('visual-antmaze-large-navigate-singletask-v0')
    assert parse_env_name('visual-cube-single-play-v0') == (
        'cube-single',
        'visual-cube-single-v0',
        'visual-cube-single-play-v0',
    )
    assert parse_env_name('visual-scene-v0')[1:] == ('visual-scene-v0', 'visual-scene-play-v0')
    with pytest.raises(EnvError):
        generate_dataset('antmaze-large-v0', 'x.npz')


def _rng_state(dataset):
    return json.dumps(dataset.rng.bit_generator.state, sort_keys=True)


def _stream_state(seed, name, *index):
    return json.dumps(seeding.generator(seed, name, *index).bit_generator.state, sort_keys=True)


def _same_dataset(a, b):
    assert set(a.keys()) == set(b.keys()) and _rng_state(a) == _rng_state(b)
    for k in a.keys():
        np.testing.assert_array_equal(a[k], b[k])


def test_run_envs_match_make_env_and_datasets(data_dir):
    run = make_run_envs(ENV_NAME, dataset_dir=str(data_dir), seed=3, num_eval_envs=3)
    env, eval_env, train, val = make_env_and_datasets(ENV_NAME, dataset_dir=str(data_dir), seed=3)
    assert isinstance(run, RunEnvs) and run.shards is None and len(run.eval_envs) == 3
    _same_dataset(run.train_dataset, train)
    _same_dataset(run.val_dataset, val)
    assert _rng_state(train) == _stream_state(3, 'dataset') and _rng_state(val) == _stream_state(3, 'val_dataset')
    # Same seeds, same states (two MuJoCo instances in one process may differ in the last bits of a step).
    for a, b in ((run.env, env), (run.eval_envs[0], eval_env)):
        np.testing.assert_allclose(a.step(np.zeros(5))[0], b.step(np.zeros(5))[0], rtol=1e-9, atol=1e-12)
    assert all(e.observation_space == env.observation_space for e in run.eval_envs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.shards = object()


def test_run_envs_build_one_shard_cycler(data_dir, tmp_path):
    for i in range(3):
        shutil.copy(data_dir / 'cube-single-play-v0.npz', tmp_path / f'cube-single-play-v0-{i:03d}.npz')
    shutil.copy(data_dir / 'cube-single-play-v0-val.npz', tmp_path / 'cube-single-play-v0-000-val.npz')
    run = make_run_envs(ENV_NAME, ogbench_dataset_dir=str(tmp_path), seed=5, num_eval_envs=2)
    assert isinstance(run.shards, ogbench_utils.OGBenchShardCycler) and run.shards.current() is run.train_dataset
    assert run.shards.index == 0 and len(run.eval_envs) == 2 and run.val_dataset.size == EP_LEN - 1
    _, _, train, val = make_env_and_datasets(ENV_NAME, ogbench_dataset_dir=str(tmp_path), seed=5)
    _same_dataset(run.train_dataset, train)
    _same_dataset(run.val_dataset, val)
    assert np.abs(run.train_dataset['actions']).max() <= 1 - 1e-5
    # The k-th shard loaded samples with sub-stream k of the run's dataset stream.
    datasets = [run.train_dataset] + [run.shards.next() for _ in range(3)]
    assert run.shards.index == 0
    for k, dataset in enumerate(datasets):
        assert _rng_state(dataset) == _stream_state(5, 'dataset', k)
    assert _rng_state(run.shards.seek(2)) == _stream_state(5, 'dataset', 4)
    assert run.shards.index == 2 and run.shards.loads == 5


VISUAL_NAME = 'visual-cube-single-play-singletask-task1-v0'
VISUAL_EP_LEN = 6
# Runs with MUJOCO_GL=osmesa in a fresh interpreter: MuJoCo picks its OpenGL backend when it is first imported.
VISUAL_CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from envs.env_utils import make_env_and_datasets
    from envs.generate_ogbench import generate_dataset

    data_dir, name, ep_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
    start = time.perf_counter()
    generate_dataset('visual-cube-single-play-v0', f'{data_dir}/visual-cube-single-play-v0.npz', num_episodes=2,
                     num_val_episodes=1, episode_length=ep_len, seed=0, show_progress=False)
    generated = time.perf_counter() - start
    env, eval_env, train, val = make_env_and_datasets(name, dataset_dir=data_dir, seed=0)
    obs = [env.reset(seed=0)[0], eval_env.step(np.zeros(5))[0]]
    inside = train['terminals'][:-1] == 0
    following = np.array_equal(train['next_observations'][:-1][inside], train['observations'][1:][inside])
    out = dict(
        generated_s=generated,
        train={k: [list(v.shape), str(v.dtype)] for k, v in train.items()},
        val=[list(val['observations'].shape), str(val['observations'].dtype)],
        rewards=train['rewards'].tolist(),
        space=[list(env.observation_space.shape), str(env.observation_space.dtype)],
        obs=[[list(o.shape), str(o.dtype)] for o in obs],
        next_is_following=bool(following),
    )
    for e in (env, eval_env):
        e.close()
    print('RESULT ' + json.dumps(out))
""")


@pytest.mark.skipif(ctypes.util.find_library('OSMesa') is None, reason='needs libosmesa6 (OSMesa) to render offscreen')
@pytest.mark.slow
def test_visual_dataset_generates_and_loads_with_pixels(tmp_path):
    data_dir, shard_dir, state_dir = tmp_path / 'data', tmp_path / 'shards', tmp_path / 'state'
    # The state-based twin (fast, no rendering) with the same seed: the oracles plan from the simulator state, so the
    # visual collection must follow the same trajectories.
    generate_dataset(
        'cube-single-play-v0',
        str(state_dir / 'cube-single-play-v0.npz'),
        num_episodes=2,
        num_val_episodes=1,
        episode_length=VISUAL_EP_LEN,
        seed=0,
        show_progress=False,
    )
    start = time.perf_counter()
    res = subprocess.run(
        [sys.executable, '-c', VISUAL_CHILD, str(data_dir), VISUAL_NAME, str(VISUAL_EP_LEN)],
        capture_output=True,
        text=True,
        # Both set: robosuite, imported by other test modules, leaves MUJOCO_GL=egl and PYOPENGL_PLATFORM=egl behind.
        env=dict(os.environ, MUJOCO_GL='osmesa', PYOPENGL_PLATFORM='osmesa'),
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        timeout=300,
    )
    lines = [line for line in res.stdout.splitlines() if line.startswith('RESULT ')]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    out = json.loads(lines[-1][len('RESULT ') :])
    print(f'visual: generated in {out["generated_s"]:.1f}s, child done in {time.perf_counter() - start:.1f}s')

    n_train, n_val = 2 * VISUAL_EP_LEN, VISUAL_EP_LEN
    with np.load(data_dir / 'visual-cube-single-play-v0.npz') as f, np.load(state_dir / 'cube-single-play-v0.npz') as g:
        assert f['observations'].shape == (n_train, 64, 64, 3) and f['observations'].dtype == np.uint8
        assert f['observations'].std() > 0  # Real frames, not a blank buffer.
        assert set(f.keys()) == set(g.keys()) == {'observations', 'actions', 'terminals', 'qpos', 'qvel'}
        for k in ('actions', 'terminals', 'qpos', 'qvel'):
            np.testing.assert_array_equal(f[k], g[k])
    with np.load(data_dir / 'visual-cube-single-play-v0-val.npz') as f:
        assert f['observations'].shape == (n_val, 64, 64, 3) and f['observations'].dtype == np.uint8

    n = 2 * (VISUAL_EP_LEN - 1)
    assert out['train']['observations'] == out['train']['next_observations'] == [[n, 64, 64, 3], 'uint8']
    assert out['train']['actions'] == [[n, 5], 'float32'] and out['train']['rewards'] == [[n], 'float32']
    assert out['val'] == [[VISUAL_EP_LEN - 1, 64, 64, 3], 'uint8'] and out['next_is_following']
    assert out['space'] == [[64, 64, 3], 'uint8'] and out['obs'] == [[[64, 64, 3], 'uint8']] * 2
    # Relabelled from the simulator state, so the rewards are those of the state-based twin.
    state_env, _, state_train, _ = make_env_and_datasets(
        'cube-single-play-singletask-task1-v0', dataset_dir=str(state_dir)
    )
    np.testing.assert_array_equal(out['rewards'], state_train['rewards'])
    # The shard loader keeps the frames' dtype too (relabelling reads only the simulator state, so a state-based
    # environment of the same task can do it here, where nothing renders).
    shard_dir.mkdir()
    shutil.copy(data_dir / 'visual-cube-single-play-v0.npz', shard_dir / 'visual-cube-single-play-v0-000.npz')
    cycler = ogbench_utils.OGBenchShardCycler(VISUAL_NAME, str(shard_dir), relabel_env=state_env.unwrapped)
    shard = cycler.current()
    assert shard['observations'].shape == (n, 64, 64, 3) and shard['observations'].dtype == np.uint8
    np.testing.assert_array_equal(shard['rewards'], state_train['rewards'])


def test_visual_rendering_failure_is_one_actionable_line():
    """With rendering off (MUJOCO_GL=disable, what `envs.gl_backend` sets where no backend renders), a visual name
    ends in an `EnvError` that says what to set."""
    code = textwrap.dedent("""
        from envs.common import EnvError
        from envs.ogbench_utils import make_ogbench_env
        try:
            make_ogbench_env('visual-cube-single-play-singletask-task1-v0')
            print('RESULT rendered')
        except EnvError as e:
            print('RESULT ' + str(e))
    """)
    res = subprocess.run(
        [sys.executable, '-c', code],
        capture_output=True,
        text=True,
        env=dict({k: v for k, v in os.environ.items() if k not in ('PYOPENGL_PLATFORM', 'DISPLAY')}, MUJOCO_GL='off'),
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        timeout=300,
    )
    lines = [line for line in res.stdout.splitlines() if line.startswith('RESULT ')]
    assert lines, res.stderr[-3000:]
    assert 'cannot render' in lines[-1] and 'MUJOCO_GL=osmesa' in lines[-1], lines[-1]


def write_maze_files(data_dir, steps=40):
    """A small antmaze-large-navigate-v0 in OGBench's layout (random actions, 2 episodes): the mazes' datasets come
    from trained expert policies and cannot be generated here, but their loading and relabelling can be tested."""
    env = ogbench_utils.make_ogbench_env('antmaze-large-navigate-singletask-task1-v0')
    rng = np.random.default_rng(0)
    fields = {k: [] for k in ('observations', 'actions', 'terminals', 'qpos', 'qvel')}
    for episode in range(2):
        obs, _ = env.reset(seed=episode)
        for i in range(steps // 2):
            action = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
            for key, value in (('observations', obs), ('actions', action), ('terminals', float(i == steps // 2 - 1)),
                               ('qpos', env.unwrapped.data.qpos.copy()), ('qvel', env.unwrapped.data.qvel.copy())):
                fields[key].append(value)  # fmt: skip
            obs, *_ = env.step(action)
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in fields.items()}
    for name in ('antmaze-large-navigate-v0', 'antmaze-large-navigate-v0-val'):
        np.savez(os.path.join(data_dir, f'{name}.npz'), **arrays)
    return arrays


def test_maze_navigate_tasks_load_where_their_files_are(tmp_path, monkeypatch):
    name = 'antmaze-large-navigate-singletask-task1-v0'
    with pytest.raises(EnvError, match='cannot be generated here') as e:
        make_env_and_datasets(name, dataset_dir=str(tmp_path))
    assert 'antmaze-large-navigate-v0.npz' in str(e.value) and '\n' not in str(e.value)
    arrays = write_maze_files(str(tmp_path))
    temp = tmp_path / 'temp'
    temp.mkdir()
    monkeypatch.setattr(tempfile, 'tempdir', str(temp))
    env, _, train, _ = make_env_and_datasets(name, dataset_dir=str(tmp_path))
    # OGBench writes each maze environment's XML to a temporary file of its own (two here); none is left behind.
    assert list(temp.iterdir()) == []
    env.reset(seed=0)
    env.step(env.action_space.sample())
    assert env.observation_space.shape == (29,) and env.action_space.shape == (8,)
    np.testing.assert_array_equal(train['observations'][:5], arrays['observations'][:5])
    # Relabelled by OGBench for task 1's goal: -1 away from it, as random actions from the start stay.
    assert set(np.unique(train['rewards'])) <= {-1.0, 0.0} and train['rewards'].min() == -1.0
    assert ogbench_utils.split_name(name) == ('antmaze-large-singletask-task1-v0', 'antmaze-large-navigate-v0')
