"""Suite-wide settings: one persistent JAX compilation cache, shared by the test processes and the driver
subprocesses they start (and one of OGBench's compiled MuJoCo models, below).

Most of the suite's time is compiling small agents, often the same program again (every driver subprocess compiles
its agent anew, and every run of the suite compiles the same programs). A cache keyed by the compiled program serves
repeats from disk; results are those of the same compiled code, so nothing a test compares changes. It lives in
`~/.cache/qc-jax/test-xla` (or $JAX_COMPILATION_CACHE_DIR), its entries are written whole, and it is bounded by
`CACHE_BYTES` when a session starts (`utils.compilation_cache`). The programs are compiled with cheaper XLA settings
(below), and agents built alike in one test file share their compiled programs
(`utils.flax_utils.shared_definition`), so an in-process run after the first traces nothing again; they are let go
when a process holds too many (`_release_compiled_programs`).
"""

import gc
import os
import shutil

# Two XLA:CPU compile settings, each set unless a developer's own XLA_FLAGS name it: the backend's (LLVM's)
# optimisation level 0, and fused ops emitted by XLA's older elemental emitters instead of its MLIR fusion emitters.
# Together the CPU compiles the suite's many small programs in about a third of the time (four tiny agents' updates:
# 8.2 s of backend compile against 15.7 s with the level alone and 27 s with neither), and every comparison a test
# makes is between programs compiled alike. Set before JAX starts its backend; inherited by the driver subprocesses.
if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' --xla_backend_optimization_level=0').strip()
if '--xla_cpu_use_fusion_emitters' not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' --xla_cpu_use_fusion_emitters=false').strip()

import jax
import pytest
from helpers import generate_cube_single

from envs.ogbench_utils import MODEL_CACHE_ENV
from utils import compilation_cache

CACHE_BYTES = 1 << 30


def _size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


os.environ.setdefault(
    'JAX_COMPILATION_CACHE_DIR', os.path.join(os.path.expanduser('~'), '.cache', 'qc-jax', 'test-xla')
)
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
# Unbounded by JAX (its bound rescans the folder under a lock on every write: a cold suite took twice as long), its
# writes atomic, and the folder bounded here once per session; the driver processes do the same
# (`training.setup.use_compilation_cache`).
compilation_cache.write_entries_atomically()
compilation_cache.trim(os.environ['JAX_COMPILATION_CACHE_DIR'], CACHE_BYTES)

# OGBench's compiled MuJoCo models kept between the suite's processes: each process that makes an environment would
# otherwise compile its models again (~1 s; loading them takes ~0.15 s).
if MODEL_CACHE_ENV not in os.environ:
    models = os.path.join(os.path.expanduser('~'), '.cache', 'qc-jax', 'test-mujoco')
    if os.path.isdir(models) and _size(models) > CACHE_BYTES:
        shutil.rmtree(models, ignore_errors=True)
    os.environ[MODEL_CACHE_ENV] = models


# Memory maps a test process may hold before it lets go of its compiled programs (the kernel's limit is
# `vm.max_map_count`, 65,530 by default).
MAX_MAPS = 25_000


def _memory_maps():
    try:
        with open('/proc/self/maps') as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: no such limit to watch
        return 0


@pytest.fixture(autouse=True, scope='module')
def _release_compiled_programs():
    """After a test file, a process holding more than `MAX_MAPS` memory maps lets go of its compiled programs:
    every compiled XLA:CPU program holds maps, and a worker that kept the hundreds the suite compiles passed the
    kernel's limit (about 48,000 maps after 100 agent tests) and segfaulted in whatever mapped memory next (a
    compile, a cache read or write). Below it, later files reuse the programs in memory."""
    yield
    if _memory_maps() > MAX_MAPS:
        jax.clear_caches()
        gc.collect()


@pytest.fixture
def no_wandb(monkeypatch):
    """Runs trained in the test process log nothing to wandb (`pytestmark = pytest.mark.usefixtures('no_wandb')`)."""
    monkeypatch.setenv('WANDB_MODE', 'disabled')


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
    """A small generated cube-single dataset (3 episodes of 61 steps), shared by the driver tests."""
    return generate_cube_single(tmp_path_factory.mktemp('data'))


@pytest.fixture(scope='session')
def cube_dir(tmp_path_factory):
    """A tiny generated cube-single dataset (2 episodes of 41 steps), shared by the trainer tests."""
    return generate_cube_single(tmp_path_factory.mktemp('ogbench'), num_episodes=2, episode_length=41)


def pytest_collection_modifyitems(config, items):
    """The long end-to-end tests first (`slow(longest=True)` before the other `slow` ones, each group in file
    order): the workers share them from the start instead of one worker finishing them alone at the end."""

    def rank(item):
        marker = item.get_closest_marker('slow')
        return 2 if marker is None else (0 if marker.kwargs.get('longest') else 1)

    items.sort(key=rank)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """One garbage collection, then everything left is frozen: pytest collects five more times as it unconfigures
    (to report exceptions raised by finalizers), each a walk over the whole heap of a process that ran hundreds of
    JAX tests (seconds each), and the controller waits for every worker to exit."""
    gc.collect()
    gc.freeze()
