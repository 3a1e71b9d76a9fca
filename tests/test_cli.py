"""The drivers' command line as a newcomer meets it: `--help` lists every setting, every bad setting is refused in
one line before anything is loaded, and a paper task run with other settings than the paper's says so."""

import dataclasses
import glob
import os
import subprocess
import sys

import pytest
from helpers import ROOT, refusal_in_process, run_driver, subprocess_env

import main
import main_online
from agents import acfql, acrlpd, agents
from envs.ogbench_utils import MODEL_CACHE_ENV
from training import RunConfig, paper_settings
from training.config import SETTING_GROUPS, agent_key_comments, help_text
from utils.errors import UserError

TASK = 'cube-single-play-singletask-task2-v0'


def test_help_lists_every_run_setting_and_every_agent_key():
    fields = [f.name for f in dataclasses.fields(RunConfig) if f.metadata]
    assert sorted(n for names in SETTING_GROUPS.values() for n in names) == sorted(fields)  # each in one group
    for name in agents:  # every registered agent, each under the driver it is usually run with
        module = sys.modules[agents[name].__module__]
        preset, path = (main_online.PRESET if name == 'acrlpd' else main.PRESET), f'agents/{name}.py'
        text = help_text(preset, path, 'main.py', 'summary')
        shown = [n for n in fields if f'    --{n} ' in text or text.count(f'--{n}\n')]
        offline_only = {n for n in fields if RunConfig.__dataclass_fields__[n].metadata['phase'] == 'offline'}
        offline_only = offline_only if not preset.offline else set()
        assert {'offline_steps', 'fused_steps', 'balanced_sampling'} <= offline_only or preset.offline
        assert set(fields) - set(shown) == offline_only
        comments = agent_key_comments(module)
        for key, value in module.get_config().items():
            assert f'--agent.{key}' in text and comments.get(key), key  # every key, with its comment
            assert f'{comments[key]} [{value}]' in ' '.join(text.split()), key  # and its default
        assert set(module.get_config()) == set(module.CONFIG_RULES)  # and a rule
        assert f'${MODEL_CACHE_ENV} ' in text  # and the one environment variable of this project


def test_the_driver_prints_help_and_exits_0():
    proc = run_driver('main_online.py', ['--agent=agents/acrlpd.py', '--help'])
    assert proc.returncode == 0 and proc.stderr == ''
    assert 'Agent settings of agents/acrlpd.py' in proc.stdout and '--agent.bc_alpha' in proc.stdout
    assert '--start_training' in proc.stdout and 'absl' not in proc.stdout.split('\n')[0]
    assert len(proc.stdout.splitlines()) < 120  # short enough to read


def test_help_piped_into_a_reader_that_stops_early_exits_0_quietly():
    # `python main.py --help | head -3`, at its extreme: a reader that closes the pipe before the help is written.
    proc = subprocess.run(f'{sys.executable} main.py --help | true; exit "${{PIPESTATUS[0]}}"', shell=True,
                          executable='/bin/bash', cwd=ROOT, env=subprocess_env(), capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == '', proc.stderr


REFUSALS = [
    ('main.py', ['--agent.actor_typo=best-of-n'], 'unknown agent setting --agent.actor_typo (agents/acfql.py); '
     'did you mean --agent.actor_type?'),
    ('main_online.py', ['--agent.bc_alhpa=0.01'], 'did you mean --agent.bc_alpha?'),
    ('main.py', ['--agent=agents/nope.py'], '--agent=agents/nope.py: no such agent file'),
    ('main.py', ['--agent.batch_size=-4'], '--agent.batch_size must be a positive integer, got -4'),
    ('main.py', ['--agent.value_hidden_dims=(0,16)'], '--agent.value_hidden_dims must be a tuple of positive'),
    ('main.py', ['--agent.flow_steps=0'], '--agent.flow_steps must be a positive integer, got 0'),
    ('main.py', ['--agent.actor_type=nope'], "--agent.actor_type must be one of 'distill-ddpg', 'best-of-n'"),
    ('main_online.py', ['--agent.tau=1.5'], '--agent.tau must be a number in (0, 1], got 1.5'),
    ('main.py', ['--agent.batch_size=abc'], '--agent.batch_size=abc: invalid literal for int()'),
    ('main.py', ['--env_name=cube-single-play-singletask-task9-v0'],
     'cube-single has tasks 1-5 (e.g. cube-single-play-singletask-task1-v0)'),
    ('main.py', ['--envname=x'], "Unknown command line flag 'envname'. Did you mean: env_name ?"),
    ('main.py', ['sparse=True'], "unexpected argument 'sparse=True': settings are --name=value"),
    ('main_online.py', ['--', '--sparse=True'], "unexpected argument '--sparse=True': settings are --name=value"),
    ('main.py', ['--agent.encoder=impala_small'],
     f'--agent.encoder=impala_small is an image encoder, and {TASK} observes states'),
    ('main.py', ['--env_name=visual-cube-single-play-singletask-task1-v0'],
     'visual-cube-single-play-singletask-task1-v0 observes images, which the agent reads through an image encoder; '
     'give one: --agent.encoder=impala'),
    ('main_online.py', ['--env_name=visual-cube-single-play-singletask-task1-v0'],
     'acrlpd has no image encoder (no --agent.encoder setting)'),
    ('main.py', ['--p_aug=0.5'], f'--p_aug=0.5 crops images, and {TASK} observes states'),
    ('main.py', ['--agent=agents/qam.py', '--agent.inv_temp=-0.3'], '--agent.inv_temp must be a number >= 0, got -0.3'),
    ('main.py', ['--agent=agents/qam.py', '--agent.fql_alpha=10', '--agent.edit_scale=0.1'],
     '--agent.fql_alpha=10.0 and --agent.edit_scale=0.1 exclude each other'),
    ('main_online.py', ['--agent=agents/qam.py', '--agent.best_of_n=0'],
     '--agent.best_of_n must be a positive integer, got 0'),
]  # fmt: skip
IDS = ['key', 'key-online', 'file', 'batch', 'width', 'flow-steps', 'actor-type', 'tau', 'type', 'task', 'flag',
       'positional', 'after-dashes', 'encoder-on-states', 'pixels-without-encoder', 'pixels-online', 'crops-on-states',
       'qam-inv-temp', 'qam-both-variants', 'qam-best-of-n']


@pytest.mark.parametrize('driver, args, message', REFUSALS, ids=IDS)
def test_bad_settings_are_refused_in_one_line_before_loading(tmp_path, driver, args, message):
    empty = tmp_path / 'no_data'  # a dataset folder without the data: a refusal here comes before any loading
    empty.mkdir()
    argv = [f'--env_name={TASK}', f'--dataset_dir={empty}', f'--save_dir={tmp_path}', *args]
    code, stderr = refusal_in_process(driver, argv)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith('error: ') and message in lines[0], stderr


def test_a_model_cache_folder_that_cannot_be_made_is_refused_in_one_line_before_loading(tmp_path, monkeypatch):
    (tmp_path / 'a_file').write_text('')
    monkeypatch.setenv(MODEL_CACHE_ENV, str(tmp_path / 'a_file' / 'models'))
    empty = tmp_path / 'no_data'
    empty.mkdir()
    code, stderr = refusal_in_process('main.py', [f'--env_name={TASK}', f'--dataset_dir={empty}'])
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, stderr
    assert lines[0].startswith(f'error: ${MODEL_CACHE_ENV}=') and 'cannot make that folder' in lines[0], stderr


@pytest.mark.parametrize(
    'driver, args, message', [REFUSALS[0], REFUSALS[3], REFUSALS[-1]], ids=['key', 'value', 'flag']
)
def test_the_drivers_refuse_in_one_line_with_exit_2_and_write_nothing(tmp_path, driver, args, message):
    empty = tmp_path / 'no_data'
    empty.mkdir()
    proc = run_driver(driver, [f'--env_name={TASK}', f'--dataset_dir={empty}', f'--save_dir={tmp_path}', *args])
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: ') and message in lines[0], proc.stderr[-2000:]
    assert not glob.glob(os.path.join(tmp_path, '*', '*'))  # no run directory


def test_a_paper_task_with_other_settings_says_so():
    assert paper_settings.notes(TASK, False, acfql.get_config()) == []  # not a paper task
    config = dict(acfql.get_config(), actor_type='best-of-n', horizon_length=5)
    assert paper_settings.notes('puzzle-3x3-play-singletask-task4-v0', False, config) == [
        'note: the QC paper runs QC on puzzle-3x3 with --sparse=True (this run: False); training on',
        'note: the QC paper runs QC on puzzle-3x3 with --agent.actor_num_samples=64 (this run: 32); training on',
    ]
    assert paper_settings.notes('puzzle-3x3-play-singletask-task4-v0', True, dict(config, actor_num_samples=64)) == []
    fql = dict(acfql.get_config(), horizon_length=1)
    assert paper_settings.notes('lift-mh-low_dim', False, fql) == [
        'note: the QC paper runs FQL on lift with --agent.alpha=10000.0 (this run: 100.0); training on'
    ]
    rlpd = dict(acrlpd.get_config(), horizon_length=5, bc_alpha=0.01)
    assert paper_settings.method_of(rlpd) == 'QC-RLPD'
    assert len(paper_settings.notes('scene-play-singletask-task2-v0', False, rlpd)) == 1


def test_the_note_is_printed_and_the_run_goes_on(tmp_path):
    proc = run_driver('main.py', ['--env_name=cube-double-play-singletask-task1-v0', f'--dataset_dir={tmp_path}',
                                  f'--save_dir={tmp_path}'])  # fmt: skip
    # It trains on: here it goes on to look for the data, which is missing.
    assert proc.stdout.splitlines()[0] == ('note: the QC paper runs QC-FQL on cube-double with --agent.alpha=300.0 '
                                           '(this run: 100.0); training on')  # fmt: skip
    # Found while loading: one line that says how to generate the data, and no run directory.
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr[-2000:]
    assert lines[-1].startswith('error: OGBench dataset not found') and 'generate_ogbench' in lines[-1]
    assert not glob.glob(os.path.join(tmp_path, '*', '*'))


def test_agent_rules_apply_to_registered_agents_and_leave_others_to_their_classes():
    from training.config import check_agent_config

    with pytest.raises(UserError, match='--agent.num_qs must be a positive integer, got 0'):
        check_agent_config(dict(acrlpd.get_config(), num_qs=0))
    # An agent handed to `Trainer` directly (not in `agents.agents`): `create_agents` checks it against its classes.
    assert check_agent_config({'agent_name': 'my_agent', 'num_qs': 0}) is None
