"""The persistent compilation cache a run turns on is bounded, which turns on JAX's file lock: without it, a process
could read an entry another is still writing."""

import importlib.util

import jax

from training import setup


def test_the_cache_is_bounded_and_locked_and_warns_without_filelock(tmp_path, monkeypatch, capsys):
    saved = jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size
    try:
        jax.config.update('jax_compilation_cache_max_size', -1)
        assert setup.use_compilation_cache(str(tmp_path / 'a')) == str(tmp_path / 'a')
        assert jax.config.jax_compilation_cache_max_size == setup.COMPILATION_CACHE_BYTES
        jax.config.update('jax_compilation_cache_max_size', 1 << 20)  # a bound set before (the environment) stays
        setup.use_compilation_cache(str(tmp_path / 'b'))
        assert jax.config.jax_compilation_cache_max_size == 1 << 20

        jax.config.update('jax_compilation_cache_max_size', -1)
        real = importlib.util.find_spec
        without = lambda name, *a: None if name == 'filelock' else real(name, *a)  # noqa: E731
        monkeypatch.setattr(importlib.util, 'find_spec', without)
        setup.use_compilation_cache(str(tmp_path / 'c'))
        assert jax.config.jax_compilation_cache_max_size == -1  # unbounded: JAX would refuse a bound without the lock
        assert 'pip install filelock' in capsys.readouterr().err
        assert setup.use_compilation_cache('none') is None
    finally:
        jax.config.update('jax_compilation_cache_dir', saved[0])
        jax.config.update('jax_compilation_cache_max_size', saved[1])
