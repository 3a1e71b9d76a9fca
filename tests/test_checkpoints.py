"""Checkpoint files, disk-space and non-finite checks, stop requests and the dataset/env shape check."""

import logging
import os
import signal
import time
from collections import namedtuple

import gymnasium
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.spaces import Box

from tests.helpers import tagged_dataset
from utils import checkpoints
from utils.checkpoints import HEADER, CheckpointError, CheckpointManager, CorruptCheckpointError, check_disk_space
from utils.errors import UserError
from utils.guards import (
    DatasetMismatchError,
    NonFiniteError,
    StopRequest,
    check_dataset_matches_env,
    check_finite,
    non_finite_values,
    tree_is_finite,
)

Usage = namedtuple('Usage', 'total used free')


def _state(seed=0):
    rng = np.random.default_rng(seed)
    rng.normal(size=7)  # Advance it so the saved state is not the freshly seeded one.
    return {
        'agent': {
            'params': {'w': rng.normal(size=(4, 3)).astype(np.float32), 'b': np.zeros(3, np.float32)},
            'step': 12,
        },
        'buffer': {
            'observations': np.asfortranarray(rng.normal(size=(5, 6))),
            'pixels': rng.integers(0, 255, size=(5, 2, 2, 3), dtype=np.uint8),
            'size': 5,
            'pointer': 0,
        },
        'rng': rng.bit_generator.state,
        'counters': [1, 2.5, None, ('a', b'b')],
        'on_device': jnp.arange(3.0),
    }, rng


def test_round_trip_of_nested_state_and_generator(tmp_path):
    state, rng = _state()
    manager = CheckpointManager(tmp_path / 'ckpt')
    path = manager.save(state, 1234)
    assert os.path.basename(path) == 'ckpt_000000001234.pkl'
    assert manager.steps() == [1234]

    loaded, step = CheckpointManager(tmp_path / 'ckpt').load_latest()
    assert step == 1234
    np.testing.assert_array_equal(loaded['agent']['params']['w'], state['agent']['params']['w'])
    assert loaded['agent']['params']['w'].dtype == np.float32
    np.testing.assert_array_equal(loaded['buffer']['observations'], state['buffer']['observations'])
    np.testing.assert_array_equal(loaded['buffer']['pixels'], state['buffer']['pixels'])
    assert loaded['agent']['step'] == 12 and loaded['buffer']['size'] == 5
    assert loaded['counters'] == [1, 2.5, None, ('a', b'b')]
    # JAX arrays come back as NumPy arrays, so loading needs no device.
    assert type(loaded['on_device']) is np.ndarray
    np.testing.assert_array_equal(loaded['on_device'], [0.0, 1.0, 2.0])

    restored = np.random.default_rng()
    restored.bit_generator.state = loaded['rng']
    np.testing.assert_array_equal(restored.normal(size=5), rng.normal(size=5))


def test_keep_prunes_oldest_and_header_matches_format(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (10, 20, 30, 40):
        manager.save({'x': np.full(3, step)}, step)
    assert manager.steps() == [30, 40]
    assert manager.last_path == manager.path(40)
    with open(manager.path(40), 'rb') as f:
        magic, length, _ = HEADER.unpack(f.read(HEADER.size))
    assert magic == checkpoints.MAGIC
    assert os.path.getsize(manager.path(40)) == HEADER.size + length
    np.testing.assert_array_equal(checkpoints.read_checkpoint_file(manager.path(30))['state']['x'], [30, 30, 30])


def test_truncated_latest_falls_back_with_warning(tmp_path, caplog):
    manager = CheckpointManager(tmp_path, keep=None)
    manager.save({'x': np.arange(100)}, 1)
    manager.save({'x': np.arange(100) * 2}, 2)
    size = os.path.getsize(manager.path(2))
    with open(manager.path(2), 'r+b') as f:
        f.truncate(size - 10)
    with caplog.at_level(logging.WARNING, logger='utils.checkpoints'):
        state, step = manager.load_latest()
    assert step == 1
    np.testing.assert_array_equal(state['x'], np.arange(100))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and manager.path(2) in warnings[0] and 'the header says' in warnings[0]
    assert '\n' not in warnings[0]


@pytest.mark.parametrize('where', ['payload', 'digest', 'magic'])
def test_flipped_bit_is_detected(tmp_path, where):
    manager = CheckpointManager(tmp_path)
    path = manager.save({'x': np.arange(1000, dtype=np.int64)}, 7)
    offset = {'payload': os.path.getsize(path) - 100, 'digest': 20, 'magic': 0}[where]
    with open(path, 'r+b') as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))
    with pytest.raises(CorruptCheckpointError, match='checksum mismatch' if where != 'magic' else 'bad magic'):
        checkpoints.read_checkpoint_file(manager.path(7))
    assert manager.load_latest() is None


def test_no_valid_checkpoint_gives_none(tmp_path):
    manager = CheckpointManager(tmp_path)
    assert manager.load_latest() is None and manager.steps() == []
    (tmp_path / 'ckpt_000000000005.pkl').write_bytes(b'')
    (tmp_path / 'ckpt_000000000009.pkl').write_bytes(b'not a checkpoint at all, just some bytes here....')
    (tmp_path / 'params_100.pkl').write_bytes(b'unrelated')
    assert manager.steps() == [5, 9]
    assert manager.load_latest() is None


def test_stale_temp_files_are_removed(tmp_path):
    stale = tmp_path / '.ckpt_000000000003.pkl.abc123.tmp'
    stale.write_bytes(b'x' * 100)
    other = tmp_path / '.keep.tmp'
    other.write_bytes(b'y')
    manager = CheckpointManager(tmp_path)
    assert stale.exists()  # nothing changes on disk before the manager is used
    assert manager.load_latest() is None
    assert not stale.exists() and other.exists()


def test_disk_space_check(tmp_path, monkeypatch):
    assert check_disk_space(tmp_path / 'not' / 'yet', 1, 'a test file') > 0
    monkeypatch.setattr(checkpoints.shutil, 'disk_usage', lambda path: Usage(10 * 2**30, 10 * 2**30 - 2**20, 2**20))
    with pytest.raises(CheckpointError, match=r'needs about 2\.0 TiB, only 1\.0 MiB free') as info:
        check_disk_space(tmp_path, 2 * 2**40, 'the replay buffer')
    assert 'the replay buffer' in str(info.value) and '\n' not in str(info.value)
    # A save refuses before writing anything rather than filling the disk.
    manager = CheckpointManager(tmp_path / 'ckpt')
    with pytest.raises(CheckpointError, match='the checkpoint of step 3'):
        manager.save({'x': np.zeros(10)}, 3)
    assert os.listdir(tmp_path / 'ckpt') == []


def test_non_finite_detection_and_message():
    info = {
        'critic/critic_loss': jnp.float32(jnp.nan),
        'actor/actor_loss': np.float32(1.5),
        'grad/max': float('inf'),
        'grad/min': -np.inf,
        'q': jnp.array([1.0, np.nan]),
        'count': 3,
        'name': 'text',
    }
    assert list(non_finite_values(info)) == ['critic/critic_loss', 'grad/max', 'grad/min', 'q']
    assert non_finite_values({'a': 1.0, 'b': jnp.zeros(3)}) == {}
    assert tree_is_finite({'w': jnp.ones((2, 2)), 'b': np.zeros(2), 'n': 1})
    assert not tree_is_finite({'w': jnp.ones((2, 2)).at[1, 0].set(jnp.inf), 'b': np.zeros(2)})
    assert not tree_is_finite({'w': jnp.ones(2), 'b': np.array([np.nan])})

    check_finite({'loss': 1.0}, step=1, params={'w': jnp.ones(2)})
    with pytest.raises(NonFiniteError) as err:
        check_finite({'critic/critic_loss': jnp.float32(jnp.nan), 'x': 0.0}, 1234, last_checkpoint='/runs/ckpt.pkl')
    assert (
        str(err.value)
        == 'non-finite values at step 1234: critic/critic_loss=nan; the last good checkpoint is /runs/ckpt.pkl'
    )
    assert err.value.keys == ['critic/critic_loss'] and err.value.step == 1234
    with pytest.raises(NonFiniteError, match=r'at step 5: grad/max=inf, the parameters contain NaN/inf; no checkpoint'):
        check_finite({'grad/max': np.inf}, 5, params={'w': jnp.array([np.nan])})


def test_stop_request_catches_sigterm_and_restores_handler():
    def sentinel(signum, frame):
        raise AssertionError('the previous handler must not run on the first signal')

    original = signal.signal(signal.SIGTERM, sentinel)
    try:
        with StopRequest() as stop:
            assert not stop.should_stop() and stop.reason == ''
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(200):  # The Python-level handler runs at the interpreter's next check.
                if stop.requested:
                    break
                time.sleep(0.005)
            assert stop.requested and stop.should_stop()
            assert stop.signal_name == 'SIGTERM' and stop.reason == 'received SIGTERM'
            assert signal.getsignal(signal.SIGTERM) is not sentinel
        assert signal.getsignal(signal.SIGTERM) is sentinel
    finally:
        signal.signal(signal.SIGTERM, original)


def test_second_sigint_interrupts_at_once():
    previous = signal.getsignal(signal.SIGINT)
    # Python's own Ctrl-C handler, whatever the parent left (a `nohup` or background shell leaves SIG_IGN).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = StopRequest(signals=(signal.SIGINT,))
    try:
        signal.raise_signal(signal.SIGINT)
        assert stop.requested and stop.signal_name == 'SIGINT'
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        stop.close()
        signal.signal(signal.SIGINT, previous)


def test_max_runtime_expiry():
    now = [100.0]
    stop = StopRequest(max_runtime=60, signals=(), clock=lambda: now[0])
    assert not stop.expired() and not stop.should_stop()
    now[0] = 159.9
    assert not stop.should_stop() and not stop.expired()
    now[0] = 160.0
    assert stop.expired() and stop.should_stop() and not stop.requested
    assert stop.reason == 'max_runtime of 60 s reached'
    stop.close()

    with StopRequest(max_runtime=0.01, signals=()) as real:
        time.sleep(0.02)
        assert real.should_stop()
    assert not StopRequest(signals=()).expired()
    with pytest.raises(ValueError):
        StopRequest(max_runtime=0)


class _BoxEnv(gymnasium.Env):
    def __init__(self, obs_shape, action_dim):
        self.observation_space = Box(-1.0, 1.0, shape=obs_shape, dtype=np.float32)
        self.action_space = Box(-1.0, 1.0, shape=(action_dim,), dtype=np.float32)


def test_dataset_env_mismatch():
    dataset = tagged_dataset([10, 10], obs_dim=3, action_dim=2)
    check_dataset_matches_env(dataset, _BoxEnv((3,), 2))
    with pytest.raises(DatasetMismatchError, match=r'observations are \(3,\) per step.*observes \(4,\)'):
        check_dataset_matches_env(dataset, _BoxEnv((4,), 2))
    with pytest.raises(DatasetMismatchError, match='actions have 2 dimensions, the environment takes 5'):
        check_dataset_matches_env(dataset, _BoxEnv((3,), 5))
    assert issubclass(DatasetMismatchError, UserError) and DatasetMismatchError.exit_code == 2

    # Frame stacking: the env may report the stacked observation; other sizes are still refused.
    stacked = tagged_dataset([10, 10], obs_dim=3, action_dim=2, frame_stack=3)
    check_dataset_matches_env(stacked, _BoxEnv((9,), 2))
    check_dataset_matches_env(stacked, _BoxEnv((3,), 2))
    with pytest.raises(DatasetMismatchError, match=r'3 stacked frames: \(9,\)'):
        check_dataset_matches_env(stacked, _BoxEnv((6,), 2))

    # Dict observation spaces have no shape to compare.
    env = _BoxEnv((3,), 2)
    env.observation_space = gymnasium.spaces.Dict({'a': Box(-1, 1, shape=(7,))})
    check_dataset_matches_env(dataset, env)
