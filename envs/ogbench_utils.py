"""OGBench single-task manipulation environments and datasets, loaded and relabelled by the `ogbench` package itself.

Name layout: `[visual-]<env>-<dataset type>-singletask[-task<k>]-v0`, e.g. `cube-double-play-singletask-task2-v0`.
The gym environment drops the dataset type (`cube-double-singletask-task2-v0`); the dataset file drops the task
(`cube-double-play-v0.npz` and `cube-double-play-v0-val.npz`). With the `visual-` prefix the environment observes
64x64x3 uint8 pixels (OGBench's `visual-cube-double-singletask-task2-v0`) and the dataset is OGBench's pixel one
(`visual-cube-double-play-v0.npz`); rendering needs an offscreen OpenGL (`MUJOCO_GL=egl` on a GPU node,
`MUJOCO_GL=osmesa` on CPU), set before MuJoCo is imported.
"""

import contextlib
import copy
import glob
import hashlib
import os
import re
import tempfile
import threading

import numpy as np

from envs.common import (
    RENDERING_HINT,
    EnvError,
    check_episode_ends,
    check_spaces,
    check_values,
    clip_actions,
    dataset_from_arrays,
    describe_error,
    load_checked,
    npz_layout,
)
from utils import seeding
from utils.io_utils import write_cache_file

DEFAULT_DATASET_DIR = '~/.ogbench/data'
_NAME_RE = re.compile(
    r'^(?:(?P<visual>visual-)?(?P<env>cube-(?:single|double|triple|quadruple|octuple)|scene|puzzle-\d+x\d+)'
    r'-(?P<type>play|noisy)|(?P<maze>(?:ant|humanoid)maze-(?:medium|large|giant))-(?P<maze_type>navigate))'
    r'(?:-(?P<size>\d+[mk]))?-singletask(?:-(?P<task>task\d+))?-(?P<version>v\d+)$'
)
# The locomotion mazes (the QAM paper's antmaze and humanoidmaze `navigate` tasks, state observations): OGBench
# collects their datasets with trained expert policies, which this project does not have, so they cannot be
# generated here; their published files must be present.


def is_ogbench_env(env_name):
    """Whether `env_name` is an OGBench single-task manipulation name (state-based or `visual-`)."""
    return _NAME_RE.match(env_name) is not None


def is_visual(env_name):
    """Whether `env_name` is a pixel-based OGBench name (`visual-` prefix)."""
    m = _NAME_RE.match(env_name)
    return m is not None and m['visual'] is not None


def split_name(env_name):
    """(gym environment id, dataset name) of an OGBench single-task name."""
    m = _NAME_RE.match(env_name)
    if m is None:
        raise EnvError(f'{env_name!r} is not an OGBench single-task name (e.g. cube-single-play-singletask-task2-v0)')
    visual = m['visual'] or ''
    env, kind = (m['env'], m['type']) if m['env'] else (m['maze'], m['maze_type'])
    task = f'-{m["task"]}' if m['task'] else ''
    gym_id = f'{visual}{env}-singletask{task}-{m["version"]}'
    dataset_name = f'{visual}{env}-{kind}-{m["version"]}'
    return gym_id, dataset_name



def make_rendering_env(make, gym_id):
    """`make()` for a pixel-based environment, with a failure of offscreen rendering reported as an `EnvError`."""
    try:
        return make()
    except EnvError:
        raise
    except Exception as e:  # MuJoCo and PyOpenGL raise many kinds (FatalError, EGLError, ImportError, ...).
        gl = os.environ.get('MUJOCO_GL', 'unset')
        raise EnvError(
            f'cannot render the pixel observations of {gym_id} (MUJOCO_GL={gl}; {describe_error(e)}); {RENDERING_HINT}'
        ) from e


def _import_ogbench():
    try:
        import ogbench  # noqa: F401  (registers the environments with gymnasium)
        import ogbench.relabel_utils
        import ogbench.utils
    except ImportError as e:
        raise EnvError(f'ogbench cannot be imported ({e}); run: pip install ogbench==1.2.2') from e
    return ogbench


def generate_command(dataset_name, dataset_dir):
    """The shell command that writes `dataset_name` into `dataset_dir` (played oracle data, like OGBench's)."""
    return f'python -m envs.generate_ogbench --env_name={dataset_name} --save_dir={dataset_dir}'


def missing_data_hint(dataset_name, dataset_dir):
    """How to get a missing dataset: generate it (manipulation), or copy OGBench's files (the mazes)."""
    if dataset_name.startswith(('antmaze', 'humanoidmaze')):
        return (f'OGBench collects the maze datasets with trained expert policies, so they cannot be generated '
                f'here; download them where there is internet (ogbench.download_datasets([{dataset_name!r}])) and copy '
                f'{dataset_name}.npz and {dataset_name}-val.npz into {dataset_dir}')  # fmt: skip
    return (f'download it with ogbench.download_datasets([{dataset_name!r}]) or generate it locally with: '
            f'{generate_command(dataset_name, dataset_dir)}')  # fmt: skip


def dataset_paths(env_name, dataset_dir=None, with_val=True):
    """Train and validation file paths of an OGBench name; raises `EnvError` when one is missing (the validation
    file only `with_val`).

    OGBench would download missing files; this machine may have no network, so the user is told how to make them.
    """
    _, dataset_name = split_name(env_name)
    dataset_dir = os.path.expanduser(dataset_dir or DEFAULT_DATASET_DIR)
    train_path = os.path.join(dataset_dir, f'{dataset_name}.npz')
    val_path = os.path.join(dataset_dir, f'{dataset_name}-val.npz')
    for path in (train_path, val_path) if with_val else (train_path,):
        if not os.path.exists(path):
            raise EnvError(f'OGBench dataset not found at {path}; {missing_data_hint(dataset_name, dataset_dir)}')
    return train_path, val_path


def make_ogbench_env(env_name, **env_kwargs):
    """The gymnasium environment (single-task mode) of an OGBench name, made as `ogbench.make_env_and_datasets` makes
    it (`gymnasium.make` of the gym id), from the MuJoCo models compiled for an earlier one of this process where they
    are the same (`reused_compiled_models`)."""
    import gymnasium

    _import_ogbench()
    gym_id, _ = split_name(env_name)
    def make():
        return _without_temporary_xml(gymnasium.make(gym_id, **env_kwargs))

    with reused_compiled_models():
        return make_rendering_env(make, gym_id) if is_visual(env_name) else make()


def _without_temporary_xml(env):
    """OGBench's mazes write each environment's MuJoCo XML to a new temporary file (`tempfile.mkstemp`) and never
    remove it: a run making environments of a maze task left one file in the temporary folder per environment. The
    model is built from it in the constructor and never read again, so it is removed here."""
    path = getattr(env.unwrapped, 'fullpath', '')
    name = os.path.basename(path)
    if os.path.dirname(path) == tempfile.gettempdir() and name.startswith('tmp') and name.endswith('.xml'):
        with contextlib.suppress(OSError):
            os.remove(path)
    return env


# MuJoCo models compiled in this process, by their XML and assets (see `reused_compiled_models`); never emptied: a
# process holds the two models of each task it makes environments of (90 MB for a cube task, mostly the arm's meshes;
# a process with 4 cube environments measured 963 MB resident against 949 MB when each compiled its own).
_COMPILED = {}
_PATCH = dict(lock=threading.Lock(), depth=0, original=None)
# A folder where the compiled models are also kept between processes, as MuJoCo's binary model files (unset: not
# kept). The test suite sets it: its ~100 processes make the same few environments, each first one compiling for ~1 s
# where loading the file takes ~0.15 s. A run gains little from it (one compile per process) and a cube task's two
# files take ~95 MB, so it is off unless set.
MODEL_CACHE_ENV = 'QC_MUJOCO_MODEL_CACHE'


def check_model_cache():
    """Refuses (one line) a `$QC_MUJOCO_MODEL_CACHE` that names no folder this process can make."""
    folder = os.environ.get(MODEL_CACHE_ENV)
    if folder:
        try:
            os.makedirs(os.path.expanduser(folder), exist_ok=True)
        except OSError as e:
            raise EnvError(
                f'${MODEL_CACHE_ENV}={folder}: cannot make that folder ({e.strerror}); unset it (compiled models are '
                'then not kept) or name a writable folder'
            ) from e


def _compile_once(xml, assets=None):
    """`mujoco.MjModel.from_xml_string`, compiling each (XML, assets) once per process and returning a copy."""
    key = (xml, tuple(sorted((name, hashlib.sha256(data).digest()) for name, data in (assets or {}).items())))
    model = _COMPILED.get(key)
    if model is None:
        model = _COMPILED.setdefault(key, _load_or_compile(key, assets))
    return copy.deepcopy(model)  # mj_copyModel: the same model, owned by the one environment that asked


def _load_or_compile(key, assets):
    """The model of `key` from the `$QC_MUJOCO_MODEL_CACHE` folder where it is there and readable, else compiled (and
    written there, atomically: processes building at the same time never see a partial file)."""
    import mujoco

    folder = os.environ.get(MODEL_CACHE_ENV)
    if not folder:
        return _PATCH['original'].__func__(key[0], assets)
    digest = hashlib.sha256(repr((mujoco.__version__, key)).encode()).hexdigest()
    path = os.path.join(os.path.expanduser(folder), f'{digest}.mjb')
    if os.path.exists(path):
        with contextlib.suppress(ValueError):  # unreadable (e.g. damaged): compiled and written again
            return mujoco.MjModel.from_binary_path(path)
    model = _PATCH['original'].__func__(key[0], assets)
    data = np.empty(mujoco.mj_sizeModel(model), np.uint8)
    mujoco.mj_saveModel(model, None, data)
    write_cache_file(path, data)  # an unwritable folder only costs the next process a compile
    return model


@contextlib.contextmanager
def reused_compiled_models():
    """Within: `mujoco.MjModel.from_xml_string` compiles an (XML, assets) pair once per process and returns a copy of
    that model for the same pair again.

    Why: every OGBench environment compiles its scene and its arm's inverse-kinematics model from XML (about 0.4 and
    0.3 s on a CPU, most of making one), and a run makes the same ones again for its evaluation copies and its other
    seeds. MuJoCo's compiler is deterministic and `copy.deepcopy` of a model is `mj_copyModel`, so an environment made
    from a copy steps, observes and renders exactly as one that compiled its own (tests/test_envs_ogbench.py).
    """
    import mujoco

    with _PATCH['lock']:
        if _PATCH['depth'] == 0:
            _PATCH['original'] = mujoco.MjModel.__dict__['from_xml_string']
            mujoco.MjModel.from_xml_string = staticmethod(_compile_once)
        _PATCH['depth'] += 1
    try:
        yield
    finally:
        with _PATCH['lock']:
            _PATCH['depth'] -= 1
            if _PATCH['depth'] == 0:
                mujoco.MjModel.from_xml_string = _PATCH['original']


def check_npz(path, env, keys=('observations', 'actions')):
    """Cheap checks of an OGBench .npz before OGBench reads it: readable archive, fields, lengths, the widths of
    `keys` against `env` (array headers only), and episode ends (the small `terminals` array)."""
    layout = npz_layout(path)
    check_spaces(path, layout, env, keys)
    check_episode_ends(path, load_checked(path, lambda: np.load(path)['terminals']))


def _to_dataset(data, path):
    # The relabelling needed qpos/qvel/button_states; agents never see them, so they are dropped to save memory.
    fields = {k: v for k, v in data.items() if k not in ('qpos', 'qvel', 'button_states')}
    dataset = dataset_from_arrays(**fields)
    dataset.source = path
    return dataset


def load_relabelled(env_name, path, relabel_env, compact_dataset=False):
    """One OGBench npz file loaded and relabelled with OGBench's own functions, as a `Dataset`.

    `relabel_env` is reset by the relabelling (that is how OGBench reads the task's goal), so it must not be an
    environment in the middle of an episode.
    """
    ogbench = _import_ogbench()
    gym_id, _ = split_name(env_name)
    # Relabelling needs only the simulator, so `relabel_env` may be the state-based twin of a pixel task: only the
    # actions are compared here; the trainer compares a shard's observations with the training environment.
    check_npz(path, relabel_env, keys=('actions',) if is_visual(env_name) else ('observations', 'actions'))
    ob_dtype = np.uint8 if is_visual(env_name) else np.float32  # As `ogbench.make_env_and_datasets` loads them.

    def load():
        data = ogbench.utils.load_dataset(path, ob_dtype=ob_dtype, compact_dataset=compact_dataset, add_info=True)
        ogbench.relabel_utils.relabel_dataset(gym_id, relabel_env, data)
        return data

    data = load_checked(path, load)
    check_values(path, data)
    return _to_dataset(data, path)


def shard_paths(shard_dir):
    """Sorted training shards (`*.npz` except `*-val.npz`) of a sharded dataset folder."""
    shard_dir = os.path.expanduser(shard_dir)
    paths = sorted(p for p in glob.glob(os.path.join(shard_dir, '*.npz')) if not p.endswith('-val.npz'))
    if not paths:
        raise EnvError(
            f'no dataset shards (*.npz) in {shard_dir}; point --ogbench_dataset_dir at a folder of OGBench npz files '
            f'(e.g. generated with: python -m envs.generate_ogbench --env_name=cube-single-play-v0 '
            f'--save_path={os.path.join(shard_dir, "cube-single-play-v0-000.npz")})'
        )
    return paths


class OGBenchShardCycler:
    """Serves a sharded OGBench dataset one shard at a time, so the full set is never in memory.

    The driver calls `next()` every `dataset_replace_interval` steps; shards cycle in sorted order. Each shard is
    relabelled like a regular OGBench file and its actions clipped like in `make_env_and_datasets`. A shard's
    validation set is its `-val.npz` sibling when there is one (`val_dataset()`, else None).

    Seeds: the k-th shard loaded (counted from 0, whatever its index) samples with sub-stream k of the run's
    `dataset` stream (`utils.seeding.stream(seed, 'dataset', k)`), independent of every other shard's.
    """

    def __init__(
        self, env_name, shard_dir, compact_dataset=False, action_clip_eps=1e-5, start_index=0, seed=0, relabel_env=None
    ):
        self.env_name = env_name
        self.paths = shard_paths(shard_dir)
        self.compact_dataset = compact_dataset
        self.action_clip_eps = action_clip_eps
        self.index = start_index % len(self.paths)
        self.seed = seed
        self.loads = 0  # Shards loaded so far: the next one samples with sub-stream `loads` of the dataset stream.
        # A private environment: relabelling resets it, which must not disturb the training environment.
        self._relabel_env = relabel_env if relabel_env is not None else make_ogbench_env(env_name)
        self._current = None

    def __len__(self):
        return len(self.paths)

    @property
    def current_path(self):
        """Path of the shard that `current()` returns."""
        return self.paths[self.index]

    def _load(self, path):
        dataset = load_relabelled(self.env_name, path, self._relabel_env, self.compact_dataset)
        dataset = clip_actions(dataset, self.action_clip_eps)
        dataset.seed(seeding.stream(self.seed, 'dataset', self.loads))
        self.loads += 1
        return dataset

    def current(self):
        """The current shard as a `Dataset` (loaded on first use)."""
        if self._current is None:
            self._current = self._load(self.current_path)
        return self._current

    def _change(self, index):
        self._current = None  # Release the old shard before the new one is read.
        self.index = index % len(self.paths)
        return self.current()

    def next(self):
        """Drops the current shard, loads the next one (cyclically) and returns it."""
        return self._change(self.index + 1)

    def seek(self, index):
        """Makes shard `index` the current one (a resumed run continues on the shard it was using)."""
        return self._change(index)

    def val_dataset(self):
        """Validation set of the current shard (clipped, not seeded), or None when it has no `-val.npz` sibling."""
        val_path = self.current_path.replace('.npz', '-val.npz')
        if not os.path.exists(val_path):
            return None
        return clip_actions(
            load_relabelled(self.env_name, val_path, self._relabel_env, self.compact_dataset), self.action_clip_eps
        )


def make_ogbench_env_and_datasets(env_name, dataset_dir=None, compact_dataset=False, with_val=True):
    """(env, eval_env, train_dataset, val_dataset) of an OGBench single-task name, unwrapped, unclipped and unseeded;
    with `with_val=False` the validation file is neither needed nor read (val_dataset is None).

    Sharded datasets are served by `OGBenchShardCycler` (see `envs.env_utils.make_run_envs`).
    """
    ogbench = _import_ogbench()
    # Missing data is reported before the (slow) environments are built.
    train_path, val_path = dataset_paths(env_name, dataset_dir, with_val=with_val)
    paths = (train_path, val_path) if with_val else (train_path,)
    for path in paths:
        npz_layout(path)  # Headers only: a damaged file is refused before the (slow) environments are built.
    env = make_ogbench_env(env_name)
    eval_env = make_ogbench_env(env_name)
    if not with_val:
        return env, eval_env, load_relabelled(env_name, train_path, eval_env, compact_dataset), None
    for path in paths:
        check_npz(path, env)
    # Passing the file path keeps OGBench from trying to download; it finds the `-val.npz` sibling itself.
    train, val = load_checked(
        train_path,
        lambda: ogbench.make_env_and_datasets(
            env_name,
            dataset_path=train_path,
            compact_dataset=compact_dataset,
            dataset_only=True,
            cur_env=eval_env,
            add_info=False,
        ),
    )
    check_values(train_path, train)
    check_values(val_path, val)
    return env, eval_env, _to_dataset(train, train_path), _to_dataset(val, val_path)


# The family interface (see `envs.env_utils`).


def matches(env_name):
    """Whether this family serves `env_name`."""
    return is_ogbench_env(env_name)


def check_name(env_name):
    """Refuses a name OGBench has no environment for, naming the tasks it has ("cube-single has tasks 1-5"),
    before any data is looked up; and a `$QC_MUJOCO_MODEL_CACHE` that names no folder it can make."""
    import gymnasium

    check_model_cache()
    _import_ogbench()
    gym_id, _ = split_name(env_name)
    if gym_id in gymnasium.registry:
        return
    m = _NAME_RE.match(env_name)
    base = f'{m["visual"] or ""}{m["env"] or m["maze"]}'
    registered = '\n'.join(gymnasium.registry)
    tasks = sorted(int(t) for t in re.findall(rf'^{re.escape(base)}-singletask-task(\d+)-', registered, flags=re.M))
    if not tasks:
        raise EnvError(f'OGBench has no environment {base!r} ({env_name}); e.g. cube-single-play-singletask-task1-v0')
    example = env_name.replace(f'-{m["task"]}-', f'-task{tasks[0]}-')
    raise EnvError(f'unknown task in {env_name}: {base} has tasks {tasks[0]}-{tasks[-1]} (e.g. {example})')


def reward_shift(env_name):
    """OGBench rewards are used as they are online."""
    return 0.0


# Info keys the EpisodeMonitor drops: privileged simulator state must not reach the loggers.
INFO_FILTERS = ('.*privileged.*', '.*proprio.*')


def make_env(env_name, dataset_dir=None, seed=0):
    """One environment of an OGBench name (the dataset is not needed)."""
    return make_ogbench_env(env_name)


def make_env_and_datasets(env_name, dataset_dir=None, seed=0, compact_dataset=False, with_val=True):
    """(env, eval_env, train_dataset, val_dataset), unwrapped and unclipped; see `make_ogbench_env_and_datasets`."""
    return make_ogbench_env_and_datasets(
        env_name, dataset_dir=dataset_dir, compact_dataset=compact_dataset, with_val=with_val
    )
