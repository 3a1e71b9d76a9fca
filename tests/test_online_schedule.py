"""The online phase at the device's speed: fused chunk updates equal one update call per step, and a steady online
step waits on the device only for the actions of a policy query, with one compiled call per chunk."""

import logging
import re

import jax
import numpy as np
import pytest
from helpers import parse_run, read_csv

import main
import main_online
from agents import agents
from analysis import run_files
from training import Trainer, device_replay, seeds
from training.seeds import SeedGroup

TOL = dict(rtol=1e-5, atol=1e-6)
TINY = [
    '--env_name=cube-single-play-singletask-task2-v0', '--agent.actor_hidden_dims=(16,16)',
    '--agent.value_hidden_dims=(16,16)', '--agent.batch_size=8', '--eval_episodes=1',
    '--eval_envs=1', '--horizon_length=3', '--buffer_size=200',
]  # fmt: skip


pytestmark = pytest.mark.usefixtures('no_wandb')


def counting(monkeypatch, name):
    """Counts the calls of `SeedGroup.<name>` (returns the list of call counts so far)."""
    calls = []
    real = getattr(SeedGroup, name)

    def counted(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SeedGroup, name, counted)
    return calls


@pytest.mark.parametrize(
    'preset, extra',
    [
        (main.PRESET, ['--offline_steps=2', '--start_training=1', '--agent.actor_num_samples=2',
                       '--agent.flow_steps=2']),
        (main_online.PRESET, ['--start_training=4', '--utd_ratio=2', '--agent.num_qs=2']),
    ],
    ids=['main', 'main_online'],
)
@pytest.mark.slow
def test_fused_online_updates_and_device_replay_equal_one_update_call_per_step(cube_dir, tmp_path, monkeypatch, preset,
                                                                               extra):
    base = [*TINY, *extra, f'--dataset_dir={cube_dir}', f'--save_dir={tmp_path}', '--online_steps=14',
            '--log_interval=7', '--eval_interval=0']  # fmt: skip
    results = {}
    # The reference's schedule (a host batch per step, one call each), then the device replay one step per call
    # (pipelined), then fused by chunk.
    for fused, device in ((False, False), (False, True), (True, True)):
        argv = [*base, f'--exp_name=f{fused}d{device}', f'--fuse_online_updates={fused}', f'--device_replay={device}']
        trainer = Trainer(parse_run(preset, argv), agents)
        trainer.train()
        assert (trainer.agents.replay is not None) == device
        run_dir = trainer.lanes[0].run_dir
        rows = read_csv(run_files.csv_path(run_dir, run_files.agent_log('online')))
        results[fused, device] = (trainer.agents.updates, rows, trainer.agents.agent(0).network.params)
    reference_calls, reference_rows, reference_params = results.pop((False, False))
    assert results[False, True][0] == reference_calls > results[True, True][0]  # the schedules differ...
    for _, rows, params in results.values():  # ...and train the same agent
        assert [r['step'] for r in rows] == [r['step'] for r in reference_rows] and len(rows) == 2
        for a, b in zip(rows, reference_rows, strict=True):
            for key in a:
                if key != 'time/total':
                    np.testing.assert_allclose(float(a[key]), float(b[key]), **TOL, err_msg=key)
        jax.tree_util.tree_map(lambda x, y: np.testing.assert_allclose(x, y, **TOL), params, reference_params)


class CompiledNames(logging.Handler):
    """Collects the names of the programs JAX compiles while `jax.log_compiles` is on (every eager op is one)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def emit(self, record):
        found = re.match(r'Compiling jit\((.+?)\)', record.getMessage())
        if found:
            self.names.append(found.group(1))


@pytest.mark.parametrize('fused', [True, False], ids=['fused', 'pipelined'])
def test_steady_online_steps_move_only_indices_and_wait_only_for_actions(cube_dir, tmp_path, monkeypatch, fused):
    argv = [*TINY, '--agent.actor_num_samples=2', '--agent.flow_steps=2', f'--dataset_dir={cube_dir}',
            f'--save_dir={tmp_path}', f'--fuse_online_updates={fused}',
            '--offline_steps=0', '--online_steps=30', '--start_training=1', '--log_interval=1000', '--eval_interval=0',
            '--eval_episodes=0', '--exp_name=steady']  # fmt: skip
    trainer = Trainer(parse_run(main.PRESET, argv), agents)
    samples, updates = counting(monkeypatch, 'sample_chunks'), counting(monkeypatch, '_replay_steps')
    moved = []  # The bytes of every explicit host-to-device transfer, in order.

    def to_device(tree):
        moved.append(sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)))
        return jax.device_put(tree)

    monkeypatch.setattr(seeds, 'to_device', to_device)
    monkeypatch.setattr(device_replay, 'to_device', to_device)
    compiled = CompiledNames()
    logging.getLogger('jax').addHandler(compiled)
    jax.clear_caches()  # so that every program the loop runs, an eager op too, is compiled (and named) again
    try:
        # Every transfer other than the explicit ones (`to_device`) and the actions of a policy query raises.
        with jax.transfer_guard_device_to_host('disallow'), jax.transfer_guard_host_to_device('disallow'):
            with jax.log_compiles(True):
                trainer.train()
    finally:
        logging.getLogger('jax').removeHandler(compiled)
    assert trainer.log_step == 30
    # No episode ends in 30 steps: a chunk every 3 steps, and the updates of its 3 steps in one call (fused), or
    # each step's in its own call as soon as its batch exists (pipelined).
    steps_per_call = 3 if fused else 1
    assert len(samples) == 10 and len(updates) == 30 // steps_per_call
    # The loop runs the two compiled calls and no eager JAX op (keys, stacking and bookkeeping are NumPy).
    assert set(compiled.names) == {'replay_steps', '_sample_chunk'}, compiled.names
    # Moved: the buffers once (the first update), then per chunk the policy's inputs and its packed steps, a few
    # kilobytes where the host batches of 3 steps would be (the observations, actions, next observations of 8 chunks).
    obs_dim = trainer.lanes[0].dataset['observations'].shape[-1]
    layout = trainer.agents.replay.layout
    policy_inputs = trainer.lanes[0].actor.observation.nbytes + 8  # the observation, its key seed and index
    packed = steps_per_call * layout.size() * 4  # int32
    assert moved[0] == policy_inputs  # the first chunk's policy call; then the upload (the first update)
    chunk = [packed] * (3 // steps_per_call) + [policy_inputs]  # then per chunk: its updates, the next policy call
    assert moved[2:] == (chunk * 10)[:-1]
    host_batches = 3 * 8 * (obs_dim + 3 * (obs_dim + 5 + 3)) * 4
    assert 3 * layout.size() * 4 < host_batches / 3


@pytest.mark.parametrize(
    'preset, extra, counts',
    [
        # Both seeds in one worker: an evaluation copy resets while another's step is pending there (3 episodes on
        # 2 copies).
        (main.PRESET, ['--seeds=0,1', '--start_training=200', '--agent.actor_num_samples=2', '--agent.flow_steps=2',
                       '--offline_steps=0', '--eval_envs=2', '--eval_episodes=3'], (0, 1)),
        # One seed: uniform random actions (one step sent at a time), then chunks sent ahead to the worker; its
        # evaluation copies stay in the driver, so it does not evaluate.
        (main_online.PRESET, ['--seed=0', '--start_training=195', '--agent.num_qs=2', '--eval_episodes=0'], (0, 1)),
    ],
    ids=['seeds', 'one_seed'],
)
@pytest.mark.slow
def test_environments_in_worker_processes_give_the_serial_results(cube_dir, tmp_path, preset, extra, counts):
    # 210 online steps: every training episode (200 steps) ends and resets (inside a chunk, H = 3, where chunks run).
    base = [*TINY, f'--dataset_dir={cube_dir}', f'--save_dir={tmp_path}', '--online_steps=210', '--log_interval=105',
            '--eval_interval=0', '--save_all_online_states=True', '--buffer_size=1000', *extra]  # fmt: skip
    runs = {}
    for workers in counts:
        run = parse_run(preset, [*base, f'--exp_name=workers{workers}', f'--env_workers={workers}'])
        trainer = Trainer(run, agents)
        assert (trainer.workers is None) == (workers == 0)
        assert ('worker envs' in trainer.startup.stages) == (workers > 0)  # waited for after the agents were made
        trainer.train()
        runs[workers] = trainer
    serial = runs.pop(0)
    for trainer in runs.values():
        assert all(worker.process.poll() is not None for worker in trainer.workers.workers)  # closed at the end
        for a, b in zip(serial.lanes, trainer.lanes, strict=True):
            assert a.replay.size == b.replay.size and len(a.states['qpos']) == 210
            for key in ('observations', 'actions', 'rewards', 'terminals', 'next_observations'):
                np.testing.assert_array_equal(a.replay[key][: a.replay.size], b.replay[key][: b.replay.size])
            for key in ('qpos', 'qvel'):
                np.testing.assert_array_equal(np.stack(a.states[key]), np.stack(b.states[key]))
            logs = [run_files.ENV_LOG, run_files.agent_log('online')] + [run_files.EVAL_LOG] * (preset is main.PRESET)
            for log in logs:
                rows_a, rows_b = (read_csv(run_files.csv_path(lane.run_dir, log)) for lane in (a, b))
                assert len(rows_a) == len(rows_b) > 0
                for ra, rb in zip(rows_a, rows_b, strict=True):
                    assert {k: v for k, v in ra.items() if 'time' not in k and 'duration' not in k} == {
                        k: v for k, v in rb.items() if 'time' not in k and 'duration' not in k}
