"""One writer per run directory: a lock file that a run holds from before its first write until it ends.

    lock = RunLock.acquire(run_dir)   # refuses (`RunDirLocked`) while another live process holds it
    ...                               # the run writes its files
    lock.release()

What a hold relies on, in order:
- an `flock` on `<run_dir>/lock`, which the kernel drops the moment the holder dies, however it dies (SIGKILL
  included). Local disks have it; NFSv4 (and NFSv3 with its lock daemon) gives it across nodes, and a node that is
  lost gives its locks up when its NFS lease runs out (90 s by default);
- the holder's record in that file (host, pid, since, heartbeat), rewritten in place every `HEARTBEAT_S` seconds by a
  thread of the holder. Where the file system takes the `flock` but does not share it between nodes (Lustre's
  `localflock`), or refuses locks (`ENOLCK`, `ENOSYS`), a holder on another host counts as alive while its heartbeat
  is under `STALE_S` seconds old; on the same host, while its pid lives.
A run that ends, or stops with a checkpoint, empties the file before it lets go; a killed one leaves its record, which
the next start reads as a dead holder's.
"""

import errno
import fcntl
import json
import os
import socket
import threading
import time

from utils.errors import UsageError

LOCK_FILE = 'lock'
HEARTBEAT_S = 15.0  # Seconds between the holder's heartbeats.
STALE_S = 120.0  # A heartbeat older than this is a dead holder's (another host, where locks are not shared).
# What `flock` raises where the file system has no locks: the record and its heartbeat decide alone.
NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class RunDirLocked(UsageError):
    """Another live process holds the run directory."""


def lock_path(run_dir):
    return os.path.join(run_dir, LOCK_FILE)


def read_holder(run_dir):
    """The record in a run directory's lock file (dict: host, pid, since, heartbeat), or None (no file, emptied
    by a holder that let go, or unreadable)."""
    try:
        with open(lock_path(run_dir)) as f:
            record = json.loads(f.read() or 'null')
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and {'host', 'pid', 'since', 'heartbeat'} <= set(record) else None


def pid_alive(pid):
    """Whether a process `pid` runs on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder_alive(record, locks_work):
    """Whether the holder of `record` may still be running although its `flock` was taken (`locks_work`) or the
    file system has none: on this host only without locks, while its pid lives (with locks, the kernel has said
    it is gone); on another host while its heartbeat is fresh (the lock may not be shared between hosts)."""
    if record is None:
        return False
    if record['host'] == socket.gethostname():
        return not locks_work and pid_alive(record['pid'])
    return time.time() - record['heartbeat'] < STALE_S


def describe(run_dir, record):
    """One line: who holds `run_dir` and what to do."""
    if record is None:
        return f'{run_dir} is in use by another process (its lock file {lock_path(run_dir)} holds no record yet)'
    since = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record['since']))
    age = max(0.0, time.time() - record['heartbeat'])
    return (
        f'{run_dir} is in use by pid {record["pid"]} on {record["host"]} (since {since}, last heartbeat {age:.0f} s '
        'ago); wait for it to end, stop it, or pick another --exp_name'
    )


def _try_flock(fd):
    """True when the `flock` was taken, False when another holds it, None where the file system has no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in NO_LOCKS:
            return None
        raise
    return True


def _refuse_if_held(run_dir, fd):
    """Takes the `flock` of the open lock file `fd` where the file system has locks; refuses while a live process
    holds the directory (see the module docstring)."""
    taken = _try_flock(fd)
    record = read_holder(run_dir)
    if taken is False or holder_alive(record, locks_work=taken is True):
        raise RunDirLocked(describe(run_dir, record))


def check_free(run_dir):
    """Refuses (`RunDirLocked`) a run directory that a live process holds; writes nothing, creates nothing."""
    try:
        fd = os.open(lock_path(run_dir), os.O_RDWR)  # NFS takes an exclusive lock only on a file open for writing
    except OSError:  # no lock file (never held), or not writable (refused as such where the run writes)
        return
    try:
        _refuse_if_held(run_dir, fd)
    finally:
        os.close(fd)  # drops the probe's own lock too


class RunLock:
    """The hold of one run directory (see the module docstring)."""

    def __init__(self, run_dir, fd):
        self.run_dir = run_dir
        self._fd = fd
        self._stop = threading.Event()
        self._record = dict(host=socket.gethostname(), pid=os.getpid(), since=time.time(), heartbeat=time.time())
        self._write()
        self._thread = threading.Thread(target=self._beat, name=f'heartbeat {run_dir}', daemon=True)
        self._thread.start()

    @classmethod
    def acquire(cls, run_dir):
        """The hold of the existing directory `run_dir`, or `RunDirLocked` naming the live holder."""
        fd = os.open(lock_path(run_dir), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _refuse_if_held(run_dir, fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(run_dir, fd)

    def _write(self):
        data = json.dumps(self._record).encode()
        os.lseek(self._fd, 0, os.SEEK_SET)
        os.write(self._fd, data)  # in place: the `flock` belongs to this file, a replaced one would lose it
        os.ftruncate(self._fd, len(data))

    def _beat(self):
        while not self._stop.wait(HEARTBEAT_S):
            self._record['heartbeat'] = time.time()
            try:
                self._write()
            except OSError:  # a file system hiccup: the next beat tries again
                pass

    def release(self):
        """Empties the lock file and lets go (idempotent)."""
        if self._fd is None:
            return
        self._stop.set()
        self._thread.join()
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        os.close(self._fd)  # drops the `flock`
        self._fd = None
