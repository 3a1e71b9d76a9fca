"""JAX's persistent compilation cache as the runs and the test suite use it: entries written whole or not at all, and
the folder bounded once per process instead of on every write.

JAX's own bounded cache (`jax_compilation_cache_max_size`) rescans the whole folder under a file lock on every
entry it writes, and reads and rewrites an access-time file under the same lock on every hit. With thousands of
entries (the test suite writes about 3,700) that made a cold suite twice as slow (8 tests: 72 s against 37 s
unbounded). Its unbounded cache writes an entry in place, so a process killed mid-write (a SIGKILL, a preemption)
leaves a truncated entry that JAX never replaces, and a process can read an entry another is still writing. Here the
cache is JAX's unbounded one with its writes made atomic (`write_entries_atomically`), and `trim` bounds the folder
when a process starts using it.
"""

import contextlib
import os
import time

from utils.io_utils import PART_SUFFIX, write_cache_file

# JAX's file names: `<key>-cache` for an entry (and `<key>-atime` next to it when JAX bounds the cache itself).
ENTRY_SUFFIX = '-cache'
STALE_PART_S = 3600  # a partial file this old belongs to a writer that died


def write_entries_atomically():
    """Makes JAX's unbounded cache write each entry to a private partial file and rename it into place: readers see
    a whole entry or none, and a writer killed mid-write leaves only a partial file (`trim` removes it). A cache JAX
    bounds itself (its lock, its own writes) is left as it is, and so is a JAX whose cache class differs from the
    one this was written against (it then writes in place, as before)."""
    try:
        from jax._src import lru_cache
    except ImportError:
        return
    cls = getattr(lru_cache, 'LRUCache', None)
    original = getattr(cls, 'put', None)
    if original is None or getattr(original, 'atomic', False):
        return

    def put(self, key, value):
        folder = str(getattr(self, 'path', ''))
        if getattr(self, 'eviction_enabled', True) or not key or not folder or '://' in folder:  # not a local folder
            return original(self, key, value)
        target = os.path.join(folder, f'{key}{ENTRY_SUFFIX}')
        if os.path.exists(target):
            return
        write_cache_file(target, value)  # an unwritable folder only costs a later process a compile

    put.atomic = True
    cls.put = put


def trim(folder, max_bytes):
    """Removes the oldest entries of the cache in `folder` until its entries take at most `max_bytes`, and partial
    files older than `STALE_PART_S`; returns the bytes left. Entries another process is reading may go: that reader
    then compiles the program again."""
    entries, total, now = [], 0, time.time()
    with contextlib.suppress(OSError), os.scandir(folder) as it:
        for entry in it:
            with contextlib.suppress(OSError):
                stat = entry.stat()
                if entry.name.endswith(PART_SUFFIX):
                    if now - stat.st_mtime > STALE_PART_S:
                        os.remove(entry.path)
                elif entry.name.endswith(ENTRY_SUFFIX):
                    entries.append((stat.st_mtime, entry.path, stat.st_size))
                    total += stat.st_size
    for _, path, size in sorted(entries):
        if total <= max_bytes:
            break
        with contextlib.suppress(OSError):
            os.remove(path)
            total -= size
        with contextlib.suppress(OSError):  # JAX's access-time file, where JAX bounded this folder before
            os.remove(path[: -len(ENTRY_SUFFIX)] + '-atime')
    return total
