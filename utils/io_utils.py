"""Crash-safe file writes: a reader sees either the old file or the complete new one, never a partial file."""

import contextlib
import os
import tempfile
import threading


def _fsync_dir(path):
    # Makes the rename itself durable; some platforms cannot open a directory, hence best effort.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path, write_fn, binary=False, newline=None):
    """Calls `write_fn(file)` on a temporary file beside `path`, fsyncs it, then renames it over `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(dir=directory, prefix='.' + os.path.basename(path) + '.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'wb' if binary else 'w', newline=None if binary else newline) as f:
            write_fn(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise
    _fsync_dir(directory)


def atomic_write_bytes(path, data):
    """Writes `data` (bytes) to `path` atomically."""
    atomic_write(path, lambda f: f.write(data), binary=True)


# Suffix of a cache file being written (`write_cache_file`): a reader never opens one; a cleanup may remove old ones.
PART_SUFFIX = '.part'


def write_cache_file(path, data):
    """Writes `data` (bytes or a buffer) to `path` whole, best effort: a file of this process and thread beside it, then
    a rename.

    For caches, where losing an entry costs only a recompute: no fsync, and an unwritable folder is ignored (returns
    False). Concurrent writers of the same entry each rename their own complete file, so a reader sees one whole.
    """
    part = f'{path}.{os.getpid()}-{threading.get_ident()}{PART_SUFFIX}'
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(part, 'wb') as f:
            f.write(data)
        os.replace(part, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(part)
        return False
