"""Suite-wide settings: one persistent JAX compilation cache, shared by the test runs and their driver subprocesses.

Most of the suite's time is compiling small agents, often the same program again (every Trainer and every driver
subprocess compiles its agent anew, and every run of the suite compiles the same programs). A cache keyed by the
compiled program serves repeats from disk; results are those of the same compiled code, so nothing a test compares
changes. It lives in `~/.cache/qc-jax/test-xla` (or $JAX_COMPILATION_CACHE_DIR) and is bounded: JAX evicts the
least recently used programs beyond `CACHE_BYTES`.
"""

import os

import jax
import pytest
from helpers import generate_cube_single

CACHE_BYTES = 1 << 30

if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
    os.environ['JAX_COMPILATION_CACHE_DIR'] = os.path.join(os.path.expanduser('~'), '.cache', 'qc-jax', 'test-xla')
    os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
    os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '0'
    os.environ['JAX_COMPILATION_CACHE_MAX_SIZE'] = str(CACHE_BYTES)
jax.config.update('jax_compilation_cache_dir', os.environ['JAX_COMPILATION_CACHE_DIR'])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
jax.config.update('jax_compilation_cache_max_size', int(os.environ.get('JAX_COMPILATION_CACHE_MAX_SIZE', CACHE_BYTES)))


@pytest.fixture(scope='session')
def cube_dir(tmp_path_factory):
    """A tiny generated cube-single dataset (2 episodes of 41 steps), shared by the trainer tests."""
    return generate_cube_single(tmp_path_factory.mktemp('ogbench'), num_episodes=2, episode_length=41)
