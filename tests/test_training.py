"""The run layer in-process: fused blocks, block boundaries, dataset processing, the chunk sampler, the online actor,
the run config from flags, and a whole (tiny) run of the trainer."""

import dataclasses
import os
import shutil

import gymnasium
import jax
import numpy as np
import pytest
from helpers import parse_run, random_dataset, read_csv, tagged_dataset, tiny_acfql_config

import main
import main_online
from agents import agents
from agents.acfql import ACFQLAgent
from training import StopTraining, Trainer
from training import hooks as hooks_module
from training.actor import OnlineActor, SeedActors, episode_row
from training.data import TRANSITION_KEYS, ChunkSampler, process_dataset
from training.schedule import block_end
from training.setup import create_agents
from utils import seeding
from utils.datasets import ReplayBuffer
from utils.errors import UsageError


def test_fused_blocks_equal_one_update_per_step():
    dataset_a = random_dataset(obs_dim=4, action_dim=2, seed=1)
    dataset_b = random_dataset(obs_dim=4, action_dim=2, seed=1)
    config = tiny_acfql_config(horizon_length=3, actor_type='best-of-n')
    agent = ACFQLAgent.create(0, dataset_a['observations'][:1], dataset_a['actions'][:1], config)

    per_step = agent
    for _ in range(6):
        per_step, info = per_step.update(dataset_a.sample_sequence(16, 3, 0.99))
    fused = agent
    for block in (4, 2):  # Blocks of different lengths, sampled in the same order from the same generator.
        batches = [dataset_b.sample_sequence(16, 3, 0.99) for _ in range(block)]
        fused, fused_info = fused.batch_update({k: np.stack([b[k] for b in batches]) for k in batches[0]})

    leaves = zip(jax.tree_util.tree_leaves(per_step.network), jax.tree_util.tree_leaves(fused.network))
    for a, b in leaves:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(jax.random.key_data(per_step.rng), jax.random.key_data(fused.rng))
    # The block reports the info of its last update, as the per-step loop logs the info of that step.
    np.testing.assert_allclose(fused_info['critic/critic_loss'], info['critic/critic_loss'], rtol=1e-4)


def _tiny_config(agent_name, **overrides):
    if agent_name == 'acfql':
        return tiny_acfql_config(horizon_length=3, **overrides)
    from agents.acrlpd import get_config

    config = get_config()
    config.update(dict(dict(horizon_length=3, actor_hidden_dims=(16, 16), value_hidden_dims=(16, 16), batch_size=16),
                       **overrides))
    return config


def test_train_states_share_equal_definitions_and_never_ones_with_array_fields():
    import flax.linen as nn

    from utils.flax_utils import TrainState, adam

    class Scaled(nn.Module):
        scale: np.ndarray  # compares element-wise: no single truth value

        @nn.compact
        def __call__(self, x):
            return nn.Dense(2)(x) * self.scale

    x = np.ones((1, 3), np.float32)
    states = []
    for module in (nn.Dense(2), nn.Dense(2), Scaled(np.ones(2)), Scaled(np.ones(2))):
        states.append(TrainState.create(module, module.init(jax.random.PRNGKey(0), x)['params'], tx=adam(1e-3)))
    assert states[1].model_def is states[0].model_def and states[1].tx is states[0].tx
    assert states[3].model_def is not states[2].model_def
    np.testing.assert_allclose(states[3](x), states[2](x))


@pytest.mark.parametrize('agent_name', ['acfql', 'acrlpd'])
def test_agents_built_alike_reuse_the_compiled_programs(agent_name):
    """A second group of the same agent class and config (a notebook's second run, the next in-process test) shares
    the first one's static parts, so its update traces nothing new; another config traces anew."""
    from training.seeds import SeedGroup

    dataset = random_dataset(obs_dim=4, action_dim=2, seed=1)
    ex = dataset['observations'][:1], dataset['actions'][:1]
    config = _tiny_config(agent_name)
    batch = dataset.sample_sequence(config.batch_size, 3, 0.99)
    first = SeedGroup.create(agents[agent_name], (0,), *ex, config)
    first.update([batch])
    update = type(first.agents).update
    traced = update._cache_size()
    second = SeedGroup.create(agents[agent_name], (1,), *ex, _tiny_config(agent_name))
    second.update([batch])
    assert second.agents.network.model_def is first.agents.network.model_def
    assert second.agents.network.tx is first.agents.network.tx
    assert update._cache_size() == traced  # served by the first group's program
    SeedGroup.create(agents[agent_name], (0,), *ex, _tiny_config(agent_name, value_hidden_dims=(8, 8))).update([batch])
    assert update._cache_size() == traced + 1


def test_a_kept_create_builds_from_the_config_it_was_kept_for():
    """The compiled `create` kept for a config value traces again for new example shapes; a caller that changed its
    config object since must not change what the kept one builds."""
    from training.seeds import _compiled_create

    config = _tiny_config('acfql')
    create = _compiled_create(agents['acfql'], config, False)
    create(np.int32(0), np.zeros((1, 4), np.float32), np.zeros((1, 2), np.float32))
    config['value_hidden_dims'] = (8, 8)  # the caller's object, after the fact
    again = _compiled_create(agents['acfql'], _tiny_config('acfql'), False)
    assert again is create
    agent = again(np.int32(0), np.zeros((1, 3), np.float32), np.zeros((1, 2), np.float32))  # new shapes: a new trace
    assert tuple(agent.config['value_hidden_dims']) == tuple(_tiny_config('acfql')['value_hidden_dims'])


@pytest.mark.parametrize(
    'step, max_steps, last, intervals, before, expected',
    [
        (0, 100, 1000, (5000,), (), 100),
        (0, 100, 30, (5000,), (), 30),  # never past the last step
        (90, 100, 1000, (5000, 95), (), 95),  # ends on a logging/eval step
        (95, 100, 1000, (95,), (), 190),
        (0, 100, 1000, (), (40,), 39),  # stops before a shard change...
        (39, 100, 1000, (), (40,), 79),  # ...which then starts the next block
        (7, 1, 1000, (3,), (4,), 8),
    ],
)
def test_block_end(step, max_steps, last, intervals, before, expected):
    assert block_end(step, max_steps, last, intervals, before) == expected


def test_process_dataset_proportion_sparse_and_compact():
    dataset = tagged_dataset((6, 4, 10))
    processed = process_dataset(dataset, dataset_proportion=0.5, sparse=True)
    assert processed.size == 10 and processed.compact
    np.testing.assert_array_equal(processed['observations'], dataset['observations'][:10])
    np.testing.assert_array_equal(processed['next_observations'], dataset['next_observations'][:10])
    np.testing.assert_array_equal(processed['rewards'], -1.0 * (dataset['rewards'][:10] != 0))


class CountingEnv(gymnasium.Env):
    """Observation = step index; ends (terminated) after 7 steps."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gymnasium.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t == 7, False, {}


class ChunkAgent:
    """Returns a chunk of 3 actions whose entries count the calls; records the chunk indices it was given."""

    def __init__(self):
        self.calls = 0
        self.indices = []

    def sample_chunks(self, observations, key_seeds, indices):
        self.calls += 1
        self.indices.extend(indices.tolist())
        return np.full((len(observations), 6), self.calls / 100.0, np.float32)


def test_online_actor_samples_a_chunk_only_when_the_queue_is_empty_and_clears_it_on_reset():
    actor = OnlineActor(CountingEnv(), action_dim=2, seed=0, reward_fn=lambda r: r - 1.0)
    agent = ChunkAgent()
    actors = SeedActors([actor], agent)
    transitions = []
    for _ in range(10):
        [(transition, _, done)] = actors.step()
        transitions.append((transition, done))
    # Steps 1-3 chunk 1, 4-6 chunk 2, step 7 chunk 3 then the episode ends and the queue is dropped.
    expected_calls = [1, 1, 1, 2, 2, 2, 3, 4, 4, 4]
    assert [round(t['actions'][0] * 100) for t, _ in transitions] == expected_calls
    done_steps = [i for i, (_, done) in enumerate(transitions) if done]
    assert done_steps == [6]
    t, _ = transitions[6]
    assert t['terminals'] == 1.0 and t['masks'] == 0.0 and t['rewards'] == 0.0
    assert transitions[7][0]['observations'][0] == 0.0  # the env was reset
    assert agent.indices == [0, 1, 2, 3] and actor.chunks == 4  # each chunk its own key index


def test_env_metrics_are_averaged_over_the_episodes_of_a_log_interval():
    rows = [{'return': 1.0, 'success': 0.0}, {'return': 3.0, 'success': 1.0}]
    assert episode_row(rows) == {'episode.return': 2.0, 'episode.success': 0.5, 'episodes': 2}


def test_chunk_sampler_mixes_sources_in_order_and_stacks_updates():
    data = tagged_dataset((30, 30), seed=1)
    replay = ReplayBuffer.create({k: data[k][0] for k in TRANSITION_KEYS}, size=50, seed=2)
    for t in range(20):
        replay.add_transition(
            {k: np.asarray(data[k][t]) + (1000 if 'observations' in k else 0) for k in TRANSITION_KEYS}
        )
    sampler = ChunkSampler([('data', data, 3), ('replay', replay, 5), ('unused', data, 0)], 4, 0.9)
    assert sampler.batch_size == 8 and [name for name, _, _ in sampler.sources] == ['data', 'replay']
    batch = sampler.sample(num_updates=2)
    assert batch['observations'].shape == (2, 8, 3) and batch['actions'].shape == (2, 8, 4, 2)
    assert batch['next_observations'].shape == (2, 8, 4, 3)
    # The first 3 chunks of every update come from the data, the other 5 from the replay buffer.
    assert (batch['observations'][:, :3] < 1000).all() and (batch['observations'][:, 3:] >= 1000).all()
    # Every chunk is contiguous: observation t is followed by the next observations of t, t+1, ...
    starts = batch['observations'][..., 0] % 1000  # (U, B)
    steps = batch['next_observations'][..., 0] % 1000 - 0.5  # (U, B, H)
    valid = batch['valid'].astype(bool)
    np.testing.assert_array_equal(np.where(valid, steps, 0), np.where(valid, starts[..., None] + np.arange(4), 0))

    # One update at a time draws the same chunks as a loop of single draws from an identically seeded source.
    twin = tagged_dataset((30, 30), seed=1)
    block = ChunkSampler([('data', data, 3)], 4, 0.9)
    twin.rng.bit_generator.state = data.rng.bit_generator.state
    drawn = block.sample_block(3)
    for u in range(3):
        np.testing.assert_array_equal(drawn['observations'][u], twin.sample_sequence(3, 4, 0.9)['observations'])
    block.set_source('data', twin)
    assert block.sources[0][1] is twin


@pytest.mark.parametrize('given', ['--horizon_length=7', '--agent.horizon_length=7'])
def test_agent_horizon_flag_alone_behaves_like_the_driver_flag(given):
    for preset in (main.PRESET, main_online.PRESET):
        run = parse_run(preset, [given, '--start_training=7'])
        assert run.horizon_length == 7 == run.agent['horizon_length']
        assert run.flag_record['agent']['horizon_length'] == 7
    with pytest.raises(UsageError, match=r'--start_training \(6\) must be >= the horizon length \(7\)'):
        parse_run(main_online.PRESET, [given, '--start_training=6'])
    with pytest.raises(UsageError, match='disagree'):
        parse_run(main.PRESET, ['--horizon_length=5', '--agent.horizon_length=7'])


def test_run_config_is_frozen_and_validated():
    run = parse_run(main.PRESET, [])
    assert run.offline_steps == 1000000 and run.random_steps == 0
    online = parse_run(main_online.PRESET, [])
    # Random actions while step <= start_training, as the reference's main_online.py.
    assert online.offline_steps == 0 and online.random_steps == online.start_training == 5000
    # main.py --balanced_sampling (the QAM reference's flag) takes main_online.py's online sources.
    balanced = parse_run(main.PRESET, ['--balanced_sampling'])
    assert balanced.random_steps == 5000 and balanced.preset.online_data_fraction == 0.5
    assert not balanced.preset.replay_starts_with_data and balanced.offline_steps == 1000000
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.utd_ratio = 3
    for change, message in [
        (dict(utd_ratio=0), '--utd_ratio must be >= 1'),
        (dict(dataset_proportion=0.0), '--dataset_proportion must be in'),
        (dict(resume=True), '--resume needs --exp_name'),
        (dict(frame_stack=0), '--frame_stack must be >= 1'),
        (dict(p_aug=1.5), '--p_aug must be in'),
    ]:
        with pytest.raises(UsageError, match=message):
            run.replace(**change)


def test_trainer_runs_in_process(cube_dir, tmp_path):
    argv = [
        '--env_name=cube-single-play-singletask-task2-v0', f'--dataset_dir={cube_dir}', f'--save_dir={tmp_path}',
        '--agent.actor_hidden_dims=(16,16)', '--agent.value_hidden_dims=(16,16)', '--agent.batch_size=8',
        '--agent.flow_steps=2', '--agent.actor_num_samples=2', '--eval_episodes=1', '--eval_envs=1',
        '--offline_steps=6', '--online_steps=4', '--start_training=2', '--log_interval=3', '--eval_interval=0',
        '--horizon_length=2', '--buffer_size=100', '--exp_name=inproc',
    ]  # fmt: skip
    trainer = Trainer(parse_run(main.PRESET, argv), agents)
    trainer.train()
    run_dir = os.path.join(str(tmp_path), 'Debug', 'inproc')
    assert [r['step'] for r in read_csv(os.path.join(run_dir, 'offline_agent.csv'))] == ['3', '6']
    assert [r['step'] for r in read_csv(os.path.join(run_dir, 'online_agent.csv'))] == ['9']
    assert [r['step'] for r in read_csv(os.path.join(run_dir, 'eval.csv'))] == ['6', '10']
    # The replay buffer the trainer owns started as the data and holds the 4 online transitions after it.
    lane = trainer.lanes[0]
    assert lane.replay.size == lane.dataset.size + 4 and lane.replay.max_size == 100
    assert int(trainer.agents.agent(0).network.step) == 1 + 6 + 3
    assert set(trainer.startup.stages) >= {'envs and data', 'agent', 'first update'}
    assert trainer.startup.line().startswith('start-up: ')


TINY_RUN = [
    '--env_name=cube-single-play-singletask-task2-v0', '--agent.actor_hidden_dims=(16,16)',
    '--agent.value_hidden_dims=(16,16)', '--agent.batch_size=8', '--eval_episodes=1', '--eval_envs=1',
    '--horizon_length=2', '--log_interval=1',
]  # fmt: skip


def test_evaluations_draw_fresh_starts_that_a_resume_draws_again(cube_dir, tmp_path, monkeypatch):
    seeds = []
    real_run_lockstep = hooks_module.run_lockstep

    def recording_run_lockstep(sample_chunks, env_sets, action_dim, base_seeds, *args):
        seeds.extend(base_seeds)
        return real_run_lockstep(sample_chunks, env_sets, action_dim, base_seeds, *args)

    monkeypatch.setattr(hooks_module, 'run_lockstep', recording_run_lockstep)
    base = TINY_RUN + [
        f'--dataset_dir={cube_dir}', f'--save_dir={tmp_path}', '--agent.flow_steps=2', '--agent.actor_num_samples=2',
        '--offline_steps=6', '--online_steps=0', '--eval_interval=2', '--save_interval=2', '--seed=3',
    ]  # fmt: skip
    Trainer(parse_run(main.PRESET, base + ['--exp_name=whole']), agents).train()
    # Three evaluations (steps 2, 4, 6), three different draws from the seed's own evaluation stream.
    whole = list(seeds)
    stream = seeding.generator(3, 'evaluation')
    assert whole == [int(stream.integers(0, 2**31 - 1)) for _ in range(3)] and len(set(whole)) == 3

    seeds.clear()
    cut = Trainer(parse_run(main.PRESET, base + ['--exp_name=cut']), agents)
    cut.stop.should_stop = lambda: cut.log_step >= 2  # as if SIGTERM came during step 2
    with pytest.raises(StopTraining):
        cut.train()
    assert seeds == whole[:1]
    Trainer(parse_run(main.PRESET, base + ['--exp_name=cut', '--resume']), agents).train()
    assert seeds == whole  # the resumed run goes on with the second and third starts


def test_main_online_warm_up_and_shard_cycling_keep_the_episode(cube_dir, tmp_path, monkeypatch):
    shard_dir = tmp_path / 'shards'
    shard_dir.mkdir()
    for i in range(3):
        shutil.copy(os.path.join(cube_dir, 'cube-single-play-v0.npz'), shard_dir / f'cube-single-play-v0-{i:03d}.npz')
    argv = TINY_RUN + [
        f'--save_dir={tmp_path}', '--agent.num_qs=2', '--online_steps=7', '--start_training=3', '--eval_interval=0',
        f'--ogbench_dataset_dir={shard_dir}', '--dataset_replace_interval=2', '--exp_name=online',
    ]  # fmt: skip
    trainer = Trainer(parse_run(main_online.PRESET, argv), agents)
    random_steps, shard_steps, resets, sources = [], [], [], []
    shards = trainer.lanes[0].shards
    real_random, real_next, real_set_source = OnlineActor.random_action, shards.next, ChunkSampler.set_source
    env_reset = trainer.lanes[0].env.reset

    def random_action(actor):
        random_steps.append(trainer.log_step)
        return real_random(actor)

    def next_shard():
        shard_steps.append(trainer.log_step)
        return real_next()

    def reset(**kwargs):
        resets.append(trainer.log_step)
        return env_reset(**kwargs)

    def set_source(sampler, name, source):
        sources.append((name, source))  # kept alive, so identities stay distinct
        return real_set_source(sampler, name, source)

    monkeypatch.setattr(OnlineActor, 'random_action', random_action)
    monkeypatch.setattr(shards, 'next', next_shard)
    monkeypatch.setattr(trainer.lanes[0].env, 'reset', reset)
    monkeypatch.setattr(ChunkSampler, 'set_source', set_source)
    first_dataset = trainer.lanes[0].dataset
    trainer.train()
    # Random actions on steps 1..start_training, the first update on step start_training (the reference's loop).
    assert random_steps == [1, 2, 3]
    rows = read_csv(os.path.join(str(tmp_path), 'Debug', 'online', 'online_agent.csv'))
    assert [int(r['step']) for r in rows] == [3, 4, 5, 6, 7]
    # A new shard after every 2 steps feeds the data half of the batches; the training episode goes on (the only
    # reset is the actor's first one).
    assert shard_steps == [2, 4, 6] and shards.index == 0 and shards.loads == 4
    # Each change hands the data source a new dataset: not the first shard's, not one used before.
    datasets = [first_dataset] + [source for _, source in sources]
    assert [name for name, _ in sources] == ['data'] * 3 and len({id(d) for d in datasets}) == 4
    assert resets == [0]


@pytest.mark.parametrize(
    'preset, keys',
    [(main.PRESET, {'normalize_q_loss': 'True'}), (main_online.PRESET, {'alpha': '0.2', 'actor_layer_norm': 'True'})],
    ids=['acfql', 'acrlpd'],
)
def test_reference_keys_without_effect_are_accepted_with_a_warning(preset, keys, capsys):
    tiny = ['--agent.actor_hidden_dims=(8,)', '--agent.value_hidden_dims=(8,)', '--agent.num_qs=2']
    dataset = random_dataset(obs_dim=4, action_dim=2)
    create_agents(agents, parse_run(preset, tiny).agent, (0,), dataset)
    assert capsys.readouterr().out == ''  # unset: nothing to say
    run = parse_run(preset, tiny + [f'--agent.{k}={v}' for k, v in keys.items()])
    create_agents(agents, run.agent, (0,), dataset)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(keys)
    for line, key in zip(lines, keys, strict=True):
        assert line.startswith(f'warning: --agent.{key}=') and 'has no effect' in line
