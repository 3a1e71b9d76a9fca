"""Environments in worker processes (`envs.workers`): the same results as here, answers matched to their requests
in any order of collection, and errors that reach the driver as themselves."""

import functools
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT

from envs.common import EnvError
from envs.env_state import get_env_state
from envs.env_utils import seed_env_list
from envs.workers import EnvWorkerError, WorkerPool, step_async, steps_async

ENV = 'cube-single-play-singletask-task2-v0'


def steps(env, actions):
    """Sends every step of `actions` (one per env) first, then collects them in reverse order."""
    results = [step_async(e, a) for e, a in zip(env, actions, strict=True)]
    return [r() for r in reversed(results)][::-1]


def test_worker_environments_step_as_local_ones(cube_dir):
    build = functools.partial(seed_env_list, ENV, 3, num_eval_envs=2, dataset_dir=cube_dir)
    local = build()
    pool = WorkerPool([build, functools.partial(seed_env_list, ENV, 4, dataset_dir=cube_dir)], 1, counts=[3, 2])
    try:
        pool.wait_ready()
        lists = pool.env_lists()
        assert [len(envs) for envs in lists] == [3, 2]  # per builder, in order, though one worker built both
        remote = lists[0]
        assert all(e.worker is pool.workers[0] for e in lists[0] + lists[1])
        for a, b in zip(local, remote, strict=True):
            np.testing.assert_array_equal(a.reset(seed=7)[0], b.reset(seed=7)[0])
        rng = np.random.default_rng(0)
        for _ in range(5):
            actions = rng.uniform(-1, 1, size=(3, local[0].action_space.shape[0])).astype(np.float32)
            # The worker answers in the order it was asked; results collected in another order still match.
            for (oa, ra, *_), (ob, rb, *_) in zip(steps(local, actions), steps(remote, actions), strict=True):
                np.testing.assert_array_equal(oa, ob)
                assert ra == rb
        # A chunk sent ahead, with the simulator state after each step: the same as stepping here.
        chunk = rng.uniform(-1, 1, size=(3, local[0].action_space.shape[0])).astype(np.float32)
        here = [r() for r in steps_async(local[0], chunk, get_env_state)]
        there = [r() for r in steps_async(remote[0], chunk, get_env_state)]
        for (step_a, state_a, _), (step_b, state_b, _) in zip(here, there, strict=True):
            np.testing.assert_array_equal(step_a[0], step_b[0])
            np.testing.assert_array_equal(state_a['qpos'], state_b['qpos'])
    finally:
        pool.close()
    assert pool.workers[0].process.poll() is not None


def test_the_handles_come_before_the_build_and_requests_wait_for_it(cube_dir):
    """`env_lists()` returns while the worker still builds (the driver makes its agents meanwhile); a request sent
    then is answered after the build, and `wait_ready` checks the counts."""
    build = functools.partial(seed_env_list, ENV, 3, num_eval_envs=1, dataset_dir=cube_dir)
    pool = WorkerPool([build], num_workers=1, counts=[2])
    try:
        [[env, eval_env]] = pool.env_lists()
        assert not pool.workers[0]._built  # nothing was read from the worker yet
        reset = eval_env.reset(seed=7)[0]  # sent while it builds; answered after the build's own answer
        np.testing.assert_array_equal(reset, build()[1].reset(seed=7)[0])
        pool.wait_ready()
    finally:
        pool.close()
    wrong = WorkerPool([build], num_workers=1, counts=[3])
    try:
        with pytest.raises(EnvWorkerError, match=r'the builders made \[2\] environments, not \[3\]'):
            wrong.wait_ready()
    finally:
        wrong.close()


def test_a_build_error_in_a_worker_reaches_the_driver_as_itself():
    pool = WorkerPool([functools.partial(seed_env_list, 'no-such-env-v0', 0)], num_workers=1, counts=[2])
    try:
        with pytest.raises(EnvError, match="unknown environment 'no-such-env-v0'"):
            pool.wait_ready()
    finally:
        pool.close()


def test_a_dead_worker_is_named(cube_dir):
    pool = WorkerPool([functools.partial(seed_env_list, ENV, 0, dataset_dir=cube_dir)], num_workers=1, counts=[2])
    try:
        env = pool.env_lists()[0][0]
        action = np.zeros(5, dtype=np.float32)
        env.reset()
        step_async(env, action)()
        pool.workers[0].process.kill()
        with pytest.raises(EnvWorkerError, match=r'an environment worker process exited \(status -9\)'):
            step_async(env, action)()
    finally:
        pool.close()


def test_a_worker_imports_no_jax():
    # A worker imports `envs` and builds environments: without JAX it starts in a fraction of a second.
    code = 'import sys, envs.workers, envs.env_utils; print(sorted(m for m in ("jax", "flax") if m in sys.modules))'
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == '[]'
