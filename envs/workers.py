"""Environments held by worker processes, so that environments step while the driver trains, and side by side.

An `EnvWorker` is a child Python process (it imports `envs`, neither JAX nor the driver) that builds its
environments from picklable builders and serves `step`, `steps`, `reset` and `render` requests over a
socket, in the order they arrive. Its environments are reached through `RemoteEnv` handles. Stepping is split in
two: `step_async(env, action)` and `steps_async(env, actions)` send the work (or, for an environment of this
process, defer it) and return the functions that deliver the results, so that a caller sends first and collects
later: the workers simulate meanwhile. `steps_async` sends a whole open-loop action chunk, which the worker runs
ahead of the caller up to an episode end.

A worker ignores SIGINT and SIGTERM (the driver stops on them and writes its checkpoint first, and the workers must
still answer until then) and exits when its socket closes, which also happens when the driver dies.
"""

import contextlib
import functools
import itertools
import os
import pickle
import signal
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection, Pipe

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # The project root, for the child's imports.


class EnvWorkerError(RuntimeError):
    """A worker process died, or an error inside it could not be sent back as itself."""


class EnvWorker:
    """One child process holding the environments that `builders` build (each returns a list of environments,
    `counts[i]` of them for builder i). The `RemoteEnv` handles exist at once: requests may be sent while the worker
    still builds (it answers them after); `wait_ready` waits for the build and checks the counts."""

    def __init__(self, builders, counts):
        ours, theirs = Pipe(duplex=True)
        # The project root goes first on the child's path (the working directory stays: datasets may be relative).
        code = f'import sys; sys.path.insert(0, {_ROOT!r}); import envs.workers; envs.workers.serve(int(sys.argv[1]))'
        self.process = subprocess.Popen([sys.executable, '-c', code, str(theirs.fileno())], pass_fds=[theirs.fileno()])
        theirs.close()
        self.conn = ours
        self.conn.send(list(builders))
        handles = itertools.count()
        self.envs = [[RemoteEnv(self, next(handles)) for _ in range(n)] for n in counts]  # Per builder.
        self._built = False  # Whether the build's answer was read (it comes before every other answer).
        self._sent = self._received = 0  # Requests sent and answers read (the build's answer is not counted).
        self._answers = {}  # Answers read before their `result` call, by ticket.

    def wait_ready(self):
        """Waits until the environments are built: raises the error of a builder that failed, or counts other than
        the ones given."""
        if not self._built:
            counts = self._unpack(self._read())
            self._built = True
            if [len(group) for group in self.envs] != counts:
                raise EnvWorkerError(f'the builders made {counts} environments, not {[len(g) for g in self.envs]}')

    def request(self, command, index, argument=None, answers=1):
        """Sends a request the worker answers `answers` times; returns the ticket of its first answer for `result`
        (the others follow it)."""
        try:
            self.conn.send((command, index, argument))
        except OSError as e:  # BrokenPipeError, ConnectionResetError: the process is gone
            raise self._died() from e
        self._sent += answers
        return self._sent - answers

    def result(self, ticket):
        """The answer to request `ticket` (raises the worker's error). The worker answers in the order it was asked;
        answers to other requests read on the way are kept for their own `result` call."""
        self.wait_ready()
        while ticket not in self._answers:
            self._answers[self._received] = self._read()
            self._received += 1
        return self._unpack(self._answers.pop(ticket))

    def _read(self):
        try:
            return self.conn.recv()
        except (EOFError, OSError) as e:
            raise self._died() from e

    def _died(self):
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return EnvWorkerError(f'an environment worker process exited (status {code}); its output above may say why')

    @staticmethod
    def _unpack(answer):
        ok, value = answer
        if not ok:
            raise value
        return value

    def close(self):
        """Ends the process (it exits when its socket closes)."""
        if self.conn.closed:
            return
        self.conn.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class RemoteEnv:
    """Environment `index` of a worker: `step_async`, `steps_async`, `reset` and `render`."""

    def __init__(self, worker, index):
        self.worker, self.index = worker, index

    def _call(self, command, argument=None):
        return self.worker.result(self.worker.request(command, self.index, argument))

    def step_async(self, action):
        """Sends the step; returns the function that returns its result."""
        return functools.partial(self.worker.result, self.worker.request('step', self.index, action))

    def steps_async(self, actions, state_fn=None):
        """Sends `step_and_reset` for each of `actions`, run in turn up to the first episode end; returns one function
        per action that returns its result (None after the end)."""
        first = self.worker.request('steps', self.index, (actions, state_fn), answers=len(actions))
        return [functools.partial(self.worker.result, first + i) for i in range(len(actions))]

    def reset(self, **kwargs):
        return self._call('reset', kwargs)

    def render(self):
        return self._call('render')


def step_async(env, action):
    """Starts `env.step(action)`; returns the function that returns its result. A worker's environment starts at
    once; an environment of this process steps when the function is called, after the workers' steps were sent."""
    if isinstance(env, RemoteEnv):
        return env.step_async(action)
    return functools.partial(env.step, action)


def step_and_reset(env, action, state_fn=None):
    """One step of a training episode: `env.step(action)`, then `state_fn(env)` (None without it), then the first
    observation of the next episode when this step ended one (else None). Returns the three."""
    result = env.step(action)
    state = None if state_fn is None else state_fn(env)
    ended = bool(result[2]) or bool(result[3])
    return result, state, env.reset()[0] if ended else None


def run_ahead(env, actions, state_fn=None):
    """Yields `step_and_reset` with each of `actions` in turn, up to the step that ends an episode, then None for
    each action after it (those never run): an open-loop chunk stepped ahead of its caller."""
    ended = False
    for action in actions:
        if ended:
            yield None
            continue
        out = step_and_reset(env, action, state_fn)
        ended = out[2] is not None
        yield out


def steps_async(env, actions, state_fn=None):
    """Starts `run_ahead` with `actions`; returns one function per action that returns its result, to be called in
    order. A worker's environment runs them all at once, ahead of the caller (the actions of an open-loop chunk are
    known when it is sampled); an environment of this process takes each step when its function is called."""
    if isinstance(env, RemoteEnv):
        return env.steps_async(actions, state_fn)
    results = run_ahead(env, actions, state_fn)
    return [functools.partial(next, results)] * len(actions)


class WorkerPool:
    """`builders` dealt round-robin to `num_workers` worker processes (fewer when there are fewer builders), which
    build at the same time; `counts[i]` is the number of environments builder i returns. `env_lists()` returns their
    handles at once and `wait_ready()` waits for the builds (the caller does other work meanwhile)."""

    def __init__(self, builders, num_workers, counts):
        count = min(num_workers, len(builders))
        self.workers = [EnvWorker(builders[w::count], counts[w::count]) for w in range(count)]

    def env_lists(self):
        """Per builder, in the order given, the `RemoteEnv` handles of the environments it builds."""
        count = len(self.workers)
        return [self.workers[i % count].envs[i // count] for i in range(sum(len(w.envs) for w in self.workers))]

    def wait_ready(self):
        """Waits until every worker built its environments; raises the first error of a builder."""
        for worker in self.workers:
            worker.wait_ready()

    def close(self):
        for worker in self.workers:
            worker.close()

    def abort(self):
        """Kills the workers at once (a run refused before it started: nothing they hold is needed)."""
        for worker in self.workers:
            worker.process.kill()
            worker.process.wait()
            worker.conn.close()


@contextlib.contextmanager
def aborted_on_error(pool):
    """Within: an exception kills the workers of `pool` (None: there are none) before it propagates, so that a run
    refused while it is set up leaves no worker process behind."""
    try:
        yield
    except BaseException:
        if pool is not None:
            pool.abort()
        raise


def _answer(envs, command, index, argument):
    env = envs[index]
    if command == 'step':
        return env.step(argument)
    if command == 'reset':
        return env.reset(**argument)
    if command == 'render':
        return env.render()
    raise ValueError(f'unknown request {command!r}')


def _send_error(conn, error):
    try:
        conn.send((False, error))
    except (pickle.PicklingError, TypeError, AttributeError):
        text = ''.join(traceback.format_exception(error))
        conn.send((False, EnvWorkerError(f'in an environment worker: {text}')))


def serve(fd):
    """The worker process's main loop, on the socket `fd` its driver passed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        _serve_requests(Connection(fd))
    except (EOFError, OSError):  # The driver is gone (it stopped on an error of its own, or was killed): end quietly.
        return


def _serve_requests(conn):
    builders = conn.recv()
    try:
        built = [list(build()) for build in builders]
    except Exception as e:  # Reported to the driver, which raises it (a missing dataset file is a `UserError`).
        _send_error(conn, e)
        return
    envs = [env for group in built for env in group]
    conn.send((True, [len(group) for group in built]))
    while True:
        command, index, argument = conn.recv()
        if command == 'steps':
            _run_steps(conn, envs[index], *argument)
            continue
        try:
            conn.send((True, _answer(envs, command, index, argument)))
        except Exception as e:
            _send_error(conn, e)


def _run_steps(conn, env, actions, state_fn):
    """Answers a `steps` request: one answer per action (`run_ahead`'s; None after an error)."""
    results = run_ahead(env, actions, state_fn)
    for _ in actions:
        try:
            answer = (True, next(results, None))  # A generator that raised is exhausted: None from then on.
        except Exception as e:
            _send_error(conn, e)
            continue
        conn.send(answer)
