"""The checkpoint file format and its manager, and the disk-space check before writing one.

Checkpoint files
----------------
`CheckpointManager` writes one file per saved step, `ckpt_<step:012d>.pkl` (zero-padded, so names sort by step),
into its directory. Each file is

    offset 0   8 bytes   magic b'QCCKPT01' (format version 1)
    offset 8   8 bytes   payload length in bytes, unsigned little-endian
    offset 16  32 bytes  SHA-256 digest of the payload
    offset 48  ...       payload: a pickle (protocol 5) of {'step': int, 'state': <the caller's dict>}

The payload is streamed straight into a temporary file while it is hashed (NumPy arrays go out as in-band pickle
buffers, so a multi-GB replay buffer is not copied in memory), then the header is filled in and the file is renamed
into place by `utils.io_utils.atomic_write` (fsync of the file and of the directory). A reader never sees a
partial file under the final name; a file damaged later (truncated copy, bad sector, flipped bit) fails the
length or digest check, which runs over the whole payload before a single byte of it is unpickled.

Loading reads the file twice (once to hash, once to unpickle) instead of holding the raw payload and the
unpickled arrays in memory at the same time. Pickle runs code from the file: only load checkpoints you wrote.

One process writes to a directory at a time: a new manager removes the temporary files (`.ckpt_*.tmp`) that a
killed writer left behind, since they can be as large as a full checkpoint.
"""

import errno
import hashlib
import logging
import os
import pickle
import re
import shutil
import struct
from collections.abc import Mapping

import jax
import numpy as np

from utils.errors import UserError
from utils.io_utils import atomic_write

logger = logging.getLogger(__name__)

MAGIC = b'QCCKPT01'
HEADER = struct.Struct('<8sQ32s')
PICKLE_PROTOCOL = 5
_NAME_RE = re.compile(r'^ckpt_(\d+)\.pkl$')
_READ_CHUNK = 8 * 2**20
# Room for the pickle opcodes and python objects around the arrays when estimating a checkpoint's size.
_SIZE_SLACK = 16 * 2**20


class CheckpointError(UserError):
    """A checkpoint cannot be written or read; the message is one actionable line."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is truncated, damaged or not a checkpoint at all."""


def _format_bytes(n):
    if n < 1024:
        return f'{int(n)} B'
    for unit in ('KiB', 'MiB', 'GiB', 'TiB'):
        n /= 1024
        if n < 1024 or unit == 'TiB':
            return f'{n:.1f} {unit}'


def check_disk_space(path, needed_bytes, what):
    """Raises `CheckpointError` when the filesystem holding `path` has less than `needed_bytes` free.

    `path` need not exist yet (the check walks up to the nearest existing parent); `what` names the thing about to
    be written, for the message. Returns the free bytes.
    """
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    free = shutil.disk_usage(probe).free
    if free < needed_bytes:
        raise CheckpointError(
            f'not enough disk space for {what}: needs about {_format_bytes(needed_bytes)}, only '
            f'{_format_bytes(free)} free on the filesystem of {probe}; free some space or choose another directory'
        )
    return free


def _leaf_nbytes(value):
    nbytes = getattr(value, 'nbytes', None)
    return int(nbytes) if isinstance(nbytes, (int, np.integer)) else 0


def _nbytes(tree):
    """Bytes held by the arrays of a nested dict/list/tuple (python objects count as nothing)."""
    if isinstance(tree, Mapping):
        return sum(_nbytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_nbytes(v) for v in tree)
    return _leaf_nbytes(tree)


def _to_host(tree):
    """The same nested structure with JAX arrays replaced by NumPy arrays; NumPy arrays are not copied."""
    if type(tree) is dict:
        return {k: _to_host(v) for k, v in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(_to_host(v) for v in tree)
    if isinstance(tree, jax.Array):
        return np.asarray(jax.device_get(tree))
    return tree


class _HashingWriter:
    """A write-only file wrapper that hashes and counts everything written through it."""

    def __init__(self, f):
        self._f = f
        self._hash = hashlib.sha256()
        self.length = 0

    def write(self, data):
        view = memoryview(data)
        if not view.c_contiguous:
            # A Fortran-ordered array arrives as its raw memory; `tobytes('A')` keeps that order for both sinks.
            view = memoryview(view.tobytes('A'))
        view = view.cast('B')
        self._hash.update(view)
        self._f.write(view)
        self.length += view.nbytes
        return view.nbytes

    def digest(self):
        return self._hash.digest()


def checkpoint_steps(directory):
    """Steps of the checkpoint files in `directory`, oldest first; [] when it does not exist (nothing is created)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for m in map(_NAME_RE.match, os.listdir(directory)) if m)


class CheckpointManager:
    """Saves and restores whole training states as checksummed files, keeping the newest `keep` of them.

    `keep=None` keeps every checkpoint. See the module docstring for the file format. Nothing on disk changes
    before the first `save` or `load_latest` (a run builds its managers before its start-up checks): the first of
    them creates the directory and removes the temporary files of writes that never finished.
    """

    def __init__(self, directory, keep=3):
        if keep is not None and keep < 1:
            raise ValueError(f'keep must be >= 1 or None, got {keep}')
        self.directory = os.path.abspath(directory)
        self.keep = keep
        self.last_path = None
        self._opened = False

    def _open(self):
        if self._opened:
            return
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):
            if name.startswith('.ckpt_') and name.endswith('.tmp'):
                try:
                    os.remove(os.path.join(self.directory, name))
                except OSError:
                    pass
        self._opened = True

    def path(self, step):
        """The file of the checkpoint at `step` (whether or not it exists)."""
        return os.path.join(self.directory, f'ckpt_{int(step):012d}.pkl')

    def steps(self):
        """Steps of the checkpoint files present, oldest first (unverified: a listed file may be corrupt)."""
        return checkpoint_steps(self.directory)

    def save(self, state, step, prune=True):
        """Writes `state` (nested dicts/lists of arrays and python values) as the checkpoint of `step`.

        JAX arrays are brought to the host first. Raises `CheckpointError` when the disk is too full. Older
        checkpoints beyond `keep` are deleted only once the new file is complete (`prune=False`: later, by
        `prune()`, as a multi-seed run does once every seed has saved). Returns the file's path.
        """
        step = int(step)
        if step < 0:
            raise ValueError(f'step must be >= 0, got {step}')
        self._open()
        payload = {'step': step, 'state': _to_host(state)}
        path = self.path(step)
        check_disk_space(self.directory, _nbytes(payload) + _SIZE_SLACK, f'the checkpoint of step {step}')

        def write(f):
            f.write(bytes(HEADER.size))
            writer = _HashingWriter(f)
            pickle.dump(payload, writer, protocol=PICKLE_PROTOCOL)
            f.seek(0)
            f.write(HEADER.pack(MAGIC, writer.length, writer.digest()))
            f.seek(0, os.SEEK_END)

        try:
            atomic_write(path, write, binary=True)
        except OSError as e:
            if e.errno in (errno.ENOSPC, getattr(errno, 'EDQUOT', errno.ENOSPC)):
                raise CheckpointError(
                    f'disk full while writing the checkpoint of step {step} to {self.directory}; free some space '
                    'or choose another directory (the previous checkpoints are intact)'
                ) from e
            raise
        self.last_path = path
        if prune:
            self.prune()
        return path

    def prune(self):
        """Deletes the checkpoints older than the newest `keep` (done by `save` unless told not to)."""
        if self.keep is None:
            return
        for old in self.steps()[: -self.keep]:
            try:
                os.remove(self.path(old))
            except FileNotFoundError:
                pass

    def load_latest(self, max_step=None):
        """(state, step) of the newest checkpoint that verifies (at most `max_step` when given), or None.

        A damaged newer file is skipped with a one-line warning naming it, and the previous one is tried. The
        damaged file is renamed to `<name>.corrupt`, out of the rotation, so later saves and pruning ignore it.
        """
        self._open()
        for step in reversed(self.steps()):
            if max_step is not None and step > max_step:
                continue
            path = self.path(step)
            try:
                payload = read_checkpoint_file(path)
            except (CheckpointError, OSError) as e:
                logger.warning('skipping unreadable checkpoint %s: %s', path, e)
                try:
                    os.replace(path, path + '.corrupt')
                except OSError:
                    pass
                continue
            self.last_path = path
            return payload['state'], payload['step']
        return None


def read_checkpoint_file(path):
    """The verified payload dict (`step`, `state`) of one checkpoint file; `CorruptCheckpointError` if damaged."""
    with open(path, 'rb') as f:
        header = f.read(HEADER.size)
        if len(header) < HEADER.size:
            raise CorruptCheckpointError(f'truncated header ({len(header)} of {HEADER.size} bytes)')
        magic, length, digest = HEADER.unpack(header)
        if magic != MAGIC:
            raise CorruptCheckpointError(f'bad magic {magic!r}, not a checkpoint of this format')
        actual = os.fstat(f.fileno()).st_size - HEADER.size
        if actual != length:
            raise CorruptCheckpointError(f'payload is {actual} bytes, the header says {length} (truncated file?)')
        hasher = hashlib.sha256()
        buffer = memoryview(bytearray(_READ_CHUNK))
        while True:
            n = f.readinto(buffer)
            if not n:
                break
            hasher.update(buffer[:n])
        if hasher.digest() != digest:
            raise CorruptCheckpointError('checksum mismatch (the file was damaged after it was written)')
        f.seek(HEADER.size)
        try:
            payload = pickle.load(f)
        except Exception as e:
            raise CorruptCheckpointError(f'cannot unpickle: {type(e).__name__}: {e}') from e
    if not isinstance(payload, dict) or 'state' not in payload or 'step' not in payload:
        raise CorruptCheckpointError('payload is not a checkpoint dict')
    return payload
