"""The persistent compilation cache a run turns on: JAX's unbounded cache with its entries written whole (a partial
file renamed into place) and the folder bounded when a run starts (`utils.compilation_cache`)."""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import compilation_cache as jax_cache
from jax._src import lru_cache

from training import setup
from utils import compilation_cache


@pytest.fixture
def own_cache(tmp_path):
    """JAX's persistent cache in `tmp_path / 'xla'` for one test, unbounded; the suite's settings after it."""
    saved = jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size
    jax.config.update('jax_compilation_cache_max_size', -1)
    jax_cache.reset_cache()
    yield str(tmp_path / 'xla')
    jax.config.update('jax_compilation_cache_dir', saved[0])
    jax.config.update('jax_compilation_cache_max_size', saved[1])
    jax_cache.reset_cache()


def test_a_run_writes_whole_entries_that_a_fresh_process_state_reads(own_cache):
    assert setup.use_compilation_cache(own_cache) == own_cache
    assert lru_cache.LRUCache.put.atomic
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.25)
    expected = np.asarray(f(jnp.arange(7.0)))
    entries = [n for n in os.listdir(own_cache) if 'sin' in n or n.startswith('jit__lambda')]
    assert entries and all(n.endswith(compilation_cache.ENTRY_SUFFIX) for n in entries), os.listdir(own_cache)
    assert not [n for n in os.listdir(own_cache) if n.endswith(compilation_cache.PART_SUFFIX)]
    jax.clear_caches()  # compiled again from nothing but the folder
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.25)(jnp.arange(7.0))), expected)


def test_a_writer_killed_mid_write_leaves_no_entry(tmp_path, monkeypatch):
    compilation_cache.write_entries_atomically()
    cache = lru_cache.LRUCache(str(tmp_path), max_size=-1)
    real_open = open

    class Dies:  # the process dies after half the bytes
        def __init__(self, path, mode):
            self.f = real_open(path, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise KeyboardInterrupt

    monkeypatch.setattr('builtins.open', Dies)
    with pytest.raises(KeyboardInterrupt):
        cache.put('key', b'x' * 1000)
    monkeypatch.undo()
    assert cache.get('key') is None  # no truncated entry for a reader; another process writes it whole
    cache.put('key', b'y' * 1000)
    assert cache.get('key') == b'y' * 1000


def test_trim_removes_the_oldest_entries_and_stale_partial_files(tmp_path):
    now = time.time()
    for i in range(5):
        path = tmp_path / f'k{i}{compilation_cache.ENTRY_SUFFIX}'
        path.write_bytes(b'z' * 100)
        (tmp_path / f'k{i}-atime').write_bytes(b'0' * 8)
        os.utime(path, (now - 100 + i, now - 100 + i))
    for name, age in (('old', compilation_cache.STALE_PART_S + 10), ('new', 1)):
        path = tmp_path / f'k9-cache.{name}{compilation_cache.PART_SUFFIX}'
        path.write_bytes(b'p')
        os.utime(path, (now - age, now - age))
    assert compilation_cache.trim(str(tmp_path), 250) == 200
    assert sorted(os.listdir(tmp_path)) == ['k3-atime', 'k3-cache', 'k4-atime', 'k4-cache', 'k9-cache.new.part']
    assert compilation_cache.trim(str(tmp_path / 'missing'), 0) == 0


def test_a_bound_set_for_jax_is_left_to_jax(tmp_path, own_cache):
    jax.config.update('jax_compilation_cache_max_size', 1 << 20)  # $JAX_COMPILATION_CACHE_MAX_SIZE
    (tmp_path / 'b').mkdir()
    (tmp_path / 'b' / f'old{compilation_cache.ENTRY_SUFFIX}').write_bytes(b'z' * 10)
    setup.use_compilation_cache(str(tmp_path / 'b'))
    assert jax.config.jax_compilation_cache_max_size == 1 << 20
    assert os.listdir(tmp_path / 'b') == [f'old{compilation_cache.ENTRY_SUFFIX}']  # not trimmed here
    assert setup.use_compilation_cache('none') is None


def test_a_cache_file_that_cannot_be_written_is_skipped_without_leftovers(tmp_path):
    from utils.io_utils import write_cache_file

    assert write_cache_file(str(tmp_path / 'sub' / 'entry'), b'abc')
    assert (tmp_path / 'sub' / 'entry').read_bytes() == b'abc'
    blocker = tmp_path / 'not-a-folder'
    blocker.write_bytes(b'')
    assert not write_cache_file(str(blocker / 'entry'), b'abc')  # its folder is a file: nothing written, no error
    assert sorted(p.name for p in tmp_path.iterdir()) == ['not-a-folder', 'sub']
