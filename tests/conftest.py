"""Suite-wide settings: one persistent JAX compilation cache, shared by the test processes and the driver
subprocesses they start (and one of OGBench's compiled MuJoCo models, below).

Most of the suite's time is compiling small agents, often the same program again (every driver subprocess compiles
its agent anew, and every run of the suite compiles the same programs). A cache keyed by the compiled program serves
repeats from disk; results are those of the same compiled code, so nothing a test compares changes. It lives in
`~/.cache/qc-jax/test-xla` (or $JAX_COMPILATION_CACHE_DIR) and is bounded by `CACHE_BYTES` (JAX evicts the oldest
entries; the bound also turns on its file lock, so no process reads a half-written entry). The programs are compiled
at XLA's backend optimisation level 0 (below), and agents built alike in one test file share their compiled programs
(`utils.flax_utils.shared_definition`), so an in-process run after the first traces nothing again; they are let go
when a process holds too many (`_release_compiled_programs`).
"""

import gc
import os
import shutil

# XLA's backend (LLVM) optimisation level 0: the CPU compiles the suite's many small programs in about 40% less time,
# and every comparison a test makes is between programs compiled alike. Set before JAX starts its backend; inherited
# by the driver subprocesses. A developer's own XLA_FLAGS that set the level are kept.
if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' --xla_backend_optimization_level=0').strip()

import jax
import pytest
from helpers import generate_cube_single

from envs.ogbench_utils import MODEL_CACHE_ENV

CACHE_BYTES = 1 << 30


def _size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


os.environ.setdefault(
    'JAX_COMPILATION_CACHE_DIR', os.path.join(os.path.expanduser('~'), '.cache', 'qc-jax', 'test-xla')
)
# A bound: JAX then evicts the oldest entries and locks the cache (`filelock`), so the driver processes never read an
# entry another is writing. Inherited by the driver subprocesses.
os.environ.setdefault('JAX_COMPILATION_CACHE_MAX_SIZE', str(CACHE_BYTES))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
jax.config.update('jax_compilation_cache_max_size', int(os.environ['JAX_COMPILATION_CACHE_MAX_SIZE']))

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
