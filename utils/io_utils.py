"""Crash-safe file writes: a reader sees either the old file or the complete new one, never a partial file."""

import os
import tempfile


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
