"""Building blocks for runs that survive: checksummed checkpoints, disk-space and non-finite checks, stop requests.

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
import signal
import struct
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from utils.io_utils import atomic_write

logger = logging.getLogger(__name__)

MAGIC = b'QCCKPT01'
HEADER = struct.Struct('<8sQ32s')
PICKLE_PROTOCOL = 5
_NAME_RE = re.compile(r'^ckpt_(\d+)\.pkl$')
_READ_CHUNK = 8 * 2**20
# Room for the pickle opcodes and python objects around the arrays when estimating a checkpoint's size.
_SIZE_SLACK = 16 * 2**20


class CheckpointError(Exception):
    """A checkpoint cannot be written or read; the message is one actionable line."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is truncated, damaged or not a checkpoint at all."""


class NonFiniteError(Exception):
    """Training produced NaN/inf; names the step, the offending keys and the last good checkpoint."""

    def __init__(self, step, keys, values=None, params_finite=True, last_checkpoint=None):
        self.step = step
        self.keys = list(keys)
        self.params_finite = params_finite
        self.last_checkpoint = last_checkpoint
        values = values or {}
        parts = [f'{k}={values.get(k, "non-finite")}' for k in self.keys]
        if not params_finite:
            parts.append('the parameters contain NaN/inf')
        where = (
            f'the last good checkpoint is {last_checkpoint}' if last_checkpoint else 'no checkpoint was saved before it'
        )
        super().__init__(f'non-finite values at step {step}: {", ".join(parts)}; {where}')


class DatasetMismatchError(ValueError):
    """The dataset's observation or action shapes do not fit the environment."""


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

    `keep=None` keeps every checkpoint. See the module docstring for the file format.
    """

    def __init__(self, directory, keep=3):
        if keep is not None and keep < 1:
            raise ValueError(f'keep must be >= 1 or None, got {keep}')
        self.directory = os.path.abspath(directory)
        self.keep = keep
        self.last_path = None
        os.makedirs(self.directory, exist_ok=True)
        self._remove_stale_temp_files()

    def _remove_stale_temp_files(self):
        for name in os.listdir(self.directory):
            if name.startswith('.ckpt_') and name.endswith('.tmp'):
                try:
                    os.remove(os.path.join(self.directory, name))
                except OSError:
                    pass

    def path(self, step):
        """The file of the checkpoint at `step` (whether or not it exists)."""
        return os.path.join(self.directory, f'ckpt_{int(step):012d}.pkl')

    def steps(self):
        """Steps of the checkpoint files present, oldest first (unverified: a listed file may be corrupt)."""
        return checkpoint_steps(self.directory)

    def latest_step(self):
        """Step of the newest checkpoint file, or None when there is none (unverified)."""
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, state, step):
        """Writes `state` (nested dicts/lists of arrays and python values) as the checkpoint of `step`.

        JAX arrays are brought to the host first. Raises `CheckpointError` when the disk is too full. Older
        checkpoints beyond `keep` are deleted only once the new file is complete. Returns the file's path.
        """
        step = int(step)
        if step < 0:
            raise ValueError(f'step must be >= 0, got {step}')
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
        self._prune()
        return path

    def _prune(self):
        if self.keep is None:
            return
        for old in self.steps()[: -self.keep]:
            try:
                os.remove(self.path(old))
            except FileNotFoundError:
                pass

    def load(self, step):
        """Verifies and loads the checkpoint of `step`; raises `CorruptCheckpointError` when it is damaged."""
        payload = read_checkpoint_file(self.path(step))
        return payload['state']

    def load_latest(self):
        """(state, step) of the newest checkpoint that verifies, or None when none does.

        A damaged newer file is skipped with a one-line warning naming it, and the previous one is tried. The
        damaged file is renamed to `<name>.corrupt`, out of the rotation, so later saves and pruning ignore it.
        """
        for step in reversed(self.steps()):
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


def _non_finite_text(arr):
    if np.isnan(arr).any():
        return 'nan'
    if np.isposinf(arr).any() and not np.isneginf(arr).any():
        return 'inf'
    if np.isneginf(arr).any() and not np.isposinf(arr).any():
        return '-inf'
    return 'inf'


def _find_non_finite(info, prefix, found):
    for key, value in info.items():
        name = f'{prefix}{key}'
        if isinstance(value, Mapping):
            _find_non_finite(value, f'{name}/', found)
            continue
        try:
            arr = np.asarray(value)
        except Exception:
            continue
        if arr.dtype.kind in 'fc' and not np.isfinite(arr).all():
            found[name] = _non_finite_text(arr)


def non_finite_values(info):
    """{key: 'nan' | 'inf' | '-inf'} for the entries of `info` (nested dicts give 'a/b' keys) that are not finite."""
    found = {}
    _find_non_finite(jax.device_get(dict(info)), '', found)
    return found


@jax.jit
def _all_finite(leaves):
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def tree_is_finite(tree):
    """True when every floating-point leaf of the pytree `tree` is finite (one device round trip for JAX leaves)."""
    device_leaves = []
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array):
            if jnp.issubdtype(leaf.dtype, jnp.inexact):
                device_leaves.append(leaf)
            continue
        try:
            arr = np.asarray(leaf)
        except Exception:
            continue
        if arr.dtype.kind in 'fc' and not np.isfinite(arr).all():
            return False
    return bool(_all_finite(device_leaves)) if device_leaves else True


def check_finite(info, step, params=None, last_checkpoint=None):
    """Raises `NonFiniteError` when a value of `info`, or a leaf of `params` when given, is NaN or infinite."""
    values = non_finite_values(info)
    params_finite = params is None or tree_is_finite(params)
    if values or not params_finite:
        raise NonFiniteError(
            step, list(values), values=values, params_finite=params_finite, last_checkpoint=last_checkpoint
        )


class StopRequest:
    """Turns SIGTERM/SIGINT and an optional wall-clock budget into a flag the training loop polls.

    The first signal only sets `requested` (and `signal_name`), so the loop can save a checkpoint and exit
    cleanly; a second one of the same kind is handed to the handler that was installed before, so pressing Ctrl-C
    twice still interrupts at once. `should_stop()` costs one attribute read, plus one `clock()` call when
    `max_runtime` (seconds from construction) is set. The previous handlers come back on `close()` or at the end
    of a `with` block. Signal handlers can only be installed from the main thread; elsewhere only the deadline
    works (with a warning).
    """

    def __init__(self, max_runtime=None, signals=(signal.SIGTERM, signal.SIGINT), clock=time.monotonic):
        if max_runtime is not None and max_runtime <= 0:
            raise ValueError(f'max_runtime must be positive seconds or None, got {max_runtime}')
        self.requested = False
        self.signal_name = None
        self.max_runtime = max_runtime
        self._clock = clock
        self._start = clock()
        self._deadline = None if max_runtime is None else self._start + max_runtime
        self._previous = {}
        for signum in signals:
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:
                logger.warning('StopRequest: not in the main thread, %s is not caught', signal.Signals(signum).name)

    def _handle(self, signum, frame):
        if not self.requested:
            self.requested = True
            self.signal_name = signal.Signals(signum).name
            return
        previous = self._previous.get(signum)
        self.close()
        if callable(previous):
            previous(signum, frame)
        elif signum == signal.SIGINT and previous != signal.SIG_IGN:
            raise KeyboardInterrupt
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)

    def expired(self):
        """True once `max_runtime` seconds have passed since construction (never without a deadline)."""
        return self._deadline is not None and self._clock() >= self._deadline

    def should_stop(self):
        """True after a caught signal or once the deadline has passed."""
        return self.requested or (self._deadline is not None and self._clock() >= self._deadline)

    def elapsed(self):
        """Seconds since construction."""
        return self._clock() - self._start

    @property
    def reason(self):
        """Why the loop should stop, for a log line ('' while it should not)."""
        if self.requested:
            return f'received {self.signal_name}'
        if self.expired():
            return f'max_runtime of {self.max_runtime:g} s reached'
        return ''

    def close(self):
        """Puts back the handlers that were installed before (idempotent)."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            # None means a handler installed outside Python, which cannot be reinstalled; the default is closest.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _space_shape(space):
    shape = getattr(space, 'shape', None)
    return None if shape is None else tuple(shape)


def check_dataset_matches_env(dataset, env, frame_stack=None):
    """Raises `DatasetMismatchError` when the dataset's per-step observation or action shape does not fit `env`.

    Observation spaces without a shape (Dict spaces) are not compared. With frame stacking (`frame_stack`, or the
    dataset's own `frame_stack`), the environment may report either one frame or `frame_stack` frames concatenated
    on the last axis, as `FrameStackWrapper` does.
    """
    name = getattr(getattr(env, 'spec', None), 'id', None) or type(getattr(env, 'unwrapped', env)).__name__
    if frame_stack is None:
        frame_stack = getattr(dataset, 'frame_stack', None)
    obs_shape = tuple(np.shape(dataset['observations'])[1:])
    env_obs_shape = _space_shape(env.observation_space)
    if env_obs_shape is not None:
        accepted = [obs_shape]
        if frame_stack and frame_stack > 1 and obs_shape:
            accepted.append((*obs_shape[:-1], obs_shape[-1] * frame_stack))
        if env_obs_shape not in accepted:
            stacked = f' ({frame_stack} stacked frames: {accepted[-1]})' if len(accepted) > 1 else ''
            raise DatasetMismatchError(
                f'the dataset does not fit environment {name}: dataset observations are {obs_shape} per step'
                f'{stacked}, the environment observes {env_obs_shape}; check the env name and the dataset path'
            )
    action_shape = tuple(np.shape(dataset['actions']))
    env_action_shape = _space_shape(env.action_space)
    if env_action_shape and len(action_shape) >= 2 and action_shape[-1] != env_action_shape[-1]:
        raise DatasetMismatchError(
            f'the dataset does not fit environment {name}: dataset actions have {action_shape[-1]} dimensions, '
            f'the environment takes {env_action_shape[-1]}; check the env name and the dataset path'
        )
