"""Guards a run polls while it trains: non-finite losses and parameters, stop requests (signals, a wall-clock
budget), and a dataset that does not fit its environment. The checkpoint file format lives in `utils.checkpoints`.
"""

import logging
import signal
import time
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from utils.errors import UserError

logger = logging.getLogger(__name__)


class NonFiniteError(UserError):
    """Training produced NaN/inf; names the step, the offending keys and the last good checkpoint. Exits 1."""

    exit_code = 1

    def __init__(self, step, keys, values=None, params_finite=True, last_checkpoint=None, seed=None):
        self.step = step
        self.seed = seed
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
        who = '' if seed is None else f'seed {seed}: '
        super().__init__(f'{who}non-finite values at step {step}: {", ".join(parts)}; {where}')


class DatasetMismatchError(UserError):
    """The dataset's observation or action shapes do not fit the environment."""


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


def non_finite_fields(transition):
    """Names of the float fields of one environment transition that hold NaN/inf (images are never checked)."""
    bad = []
    for key, value in transition.items():
        value = np.asarray(value)
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            bad.append(key)
    return bad


def check_finite(info, step, params=None, last_checkpoint=None, seed=None):
    """Raises `NonFiniteError` when a value of `info`, or a leaf of `params` when given, is NaN or infinite;
    `seed` (a multi-seed run) is named in the message."""
    values = non_finite_values(info)
    params_finite = params is None or tree_is_finite(params)
    if values or not params_finite:
        raise NonFiniteError(
            step, list(values), values=values, params_finite=params_finite, last_checkpoint=last_checkpoint,
            seed=seed,
        )  # fmt: skip


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
        self._deadline = None if max_runtime is None else clock() + max_runtime
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
    source = getattr(dataset, 'source', None)
    what = f'the dataset {source}' if source else 'the dataset'
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
                f'{what} does not fit environment {name}: dataset observations are {obs_shape} per step'
                f'{stacked}, the environment observes {env_obs_shape}; check the env name and the dataset path'
            )
    action_shape = tuple(np.shape(dataset['actions']))
    env_action_shape = _space_shape(env.action_space)
    if env_action_shape and len(action_shape) >= 2 and action_shape[-1] != env_action_shape[-1]:
        raise DatasetMismatchError(
            f'{what} does not fit environment {name}: dataset actions have {action_shape[-1]} dimensions, '
            f'the environment takes {env_action_shape[-1]}; check the env name and the dataset path'
        )
