"""The QAM paper's protocol next to the QC paper's: its released seeds (shipped data, intervals computed from them,
the permutation test), its per-domain settings and presets, a SPEC's protocol, and the sweep table's and plots'
QAM-protocol rows."""

import gzip
import hashlib
import json
import os
import re

import numpy as np
import pytest
from helpers import fake_run, parse_run

import main
from agents import acfql, acrlpd, qam
from analysis import paper, plotting, stats
from sweeps import presets, report, spec
from training import paper_settings
from utils.errors import UserError

M = 1_000_000
CUBE_DOUBLE = [f'cube-double-play-singletask-task{k}-v0' for k in range(1, 6)]
TASK1 = CUBE_DOUBLE[0]


def test_the_shipped_qam_csv_is_the_released_one():
    readme = open(os.path.join(paper.PUBLISHED_DIR, 'README.md')).read()
    recorded = re.search(r'SHA-256 of the uncompressed QAM file: `([0-9a-f]{64})`', readme).group(1)
    with gzip.open(paper.protocol('qam').path, 'rb') as f:
        assert hashlib.sha256(f.read()).hexdigest() == recorded
    points = paper.curve('cube-double-play-task1', 'QAM', 'qam')
    assert [p.step for p in points] == list(range(50_000, 3 * M // 2 + 1, 50_000))
    at_100k = paper.point_at(points, 100_000)
    # The early point (12 seeds): QAM 0.44; interval from the seeds, around the mean.
    assert len(at_100k.seeds) == 1 and len(at_100k.seeds[0]) == 12
    assert at_100k.mean == pytest.approx(0.44, abs=1e-9) and at_100k.low < at_100k.mean < at_100k.high
    # Headline values over the 50 tasks; a domain's mean is the mean of its tasks'; RLPD online only, 50K-500K.
    assert paper.point_at(paper.curve('all', 'QAM', 'qam'), M).mean == pytest.approx(0.44, abs=0.01)
    assert paper.point_at(paper.curve('all', 'QAM-E', 'qam'), 3 * M // 2).mean == pytest.approx(0.85, abs=0.01)
    domain = paper.point_at(paper.curve('cube-double', 'FQL', 'qam'), M)
    tasks = [paper.point_at(paper.curve(f'cube-double-play-task{k}', 'FQL', 'qam'), M).mean for k in range(1, 6)]
    assert domain.mean == pytest.approx(np.mean(tasks)) and len(domain.seeds) == 5
    assert [p.step for p in paper.curve('cube-double-play-task1', 'RLPD', 'qam')] == list(range(50_000, 500_001,
                                                                                                50_000))  # fmt: skip
    assert len(paper.aggregates('qam')['all']) == 50 and len(paper.aggregates('qam')['antmaze-large']) == 5


@pytest.mark.parametrize(
    'env, qc_task, qam_task',
    [
        (TASK1, 'cube-double-play-task1', 'cube-double-play-task1'),
        ('antmaze-large-navigate-singletask-task3-v0', None, 'antmaze-large-navigate-task3'),
        ('puzzle-4x4-play-singletask-task2-v0', None, 'puzzle-4x4-play-task2'),
        ('lift-mh-low_dim', 'lift', None),
    ],
)
def test_each_paper_has_its_own_tasks(env, qc_task, qam_task):
    assert paper.published_task(env, 'qc') == qc_task and paper.published_task(env, 'qam') == qam_task


def test_the_permutation_test_within_tasks():
    rng = np.random.default_rng(0)
    same = [0.2, 0.4, 0.6, 0.8]
    assert stats.stratified_permutation_p([same, same], [same, same], rng) == 1.0
    assert stats.stratified_permutation_p([[0.0] * 6, [0.1] * 6], [[1.0] * 6, [0.9] * 6], rng) < 0.01
    # One task: the plain two-group test, draw for draw.
    a, b = [0.1, 0.3, 0.2], [0.5, 0.4, 0.6, 0.7]
    assert stats.permutation_p(a, b, np.random.default_rng(1)) == stats.stratified_permutation_p(
        [a], [b], np.random.default_rng(1))
    # Opposite differences in two tasks cancel: the statistic is the difference of the means over tasks.
    assert stats.stratified_permutation_p([[0.0] * 5, [1.0] * 5], [[1.0] * 5, [0.0] * 5], rng) == 1.0
    with pytest.raises(ValueError, match='one group of seeds per task'):
        stats.stratified_permutation_p([a], [a, b], rng)


def test_qam_domain_settings():
    flags = paper_settings.domain_flags('QAM', TASK1, 'qam')
    assert flags == {'sparse': False, 'horizon_length': 5, 'agent.action_chunking': True, 'agent.num_qs': 10,
                     'agent.rho': 0.5, 'agent.discount': 0.99, 'agent.inv_temp': 1.0, 'agent.fql_alpha': 0.0,
                     'agent.edit_scale': 0.0}  # fmt: skip
    maze = paper_settings.domain_flags('FQL', 'humanoidmaze-medium-navigate-singletask-task1-v0', 'qam')
    assert maze['horizon_length'] == 1 and maze['agent.rho'] == 0.0 and maze['agent.discount'] == 0.995
    assert maze['agent.alpha'] == 30.0
    assert paper_settings.domain_flags('RLPD', 'scene-play-singletask-task2-v0', 'qam')['agent.bc_alpha'] == 0.3
    assert paper_settings.domain_flags('QAM-F', 'cube-triple-play-singletask-task1-v0', 'qam')['agent.fql_alpha'] == 300
    assert paper_settings.domain_flags('QAM-E', 'puzzle-4x4-play-singletask-task1-v0', 'qam')['sparse'] is True
    assert paper_settings.domain_flags('QAM', 'lift-mh-low_dim', 'qam') == {}  # not a domain of the QAM paper
    assert all(len(v) == len(paper_settings.QAM_DOMAINS) for v in paper_settings.QAM_SETTINGS.values())
    # Each agent names its variants in each paper.
    assert paper_settings.method_of(dict(acfql.get_config(), horizon_length=5), 'qam') == 'FQL'
    assert paper_settings.method_of(dict(acfql.get_config(), actor_type='best-of-n'), 'qam') is None
    assert paper_settings.method_of(dict(acrlpd.get_config(), horizon_length=5), 'qam') == 'RLPD'
    assert paper_settings.method_of(dict(qam.get_config(), edit_scale=0.1), 'qam') == 'QAM-E'
    assert paper_settings.method_of(qam.get_config(), 'qc') is None
    assert paper_settings.protocol_of(qam.get_config()) == 'qam'
    assert paper_settings.protocol_of(acfql.get_config()) == 'qc'


def test_a_qam_protocol_run_says_where_it_differs(capsys):
    config = dict(qam.get_config(), horizon_length=5)
    assert paper_settings.notes(TASK1, False, config, 'qam') == [
        'note: the QAM paper runs QAM on cube-double with --agent.inv_temp=1.0 (this run: 0.3); training on'
    ]
    fql = dict(acfql.get_config(), horizon_length=5, alpha=300.0, rho=0.5, num_qs=10, bc_mask='chunk')
    assert paper_settings.notes(TASK1, False, fql, 'qam') == []
    # Their RLPD's networks and BC weighting are settings of its own, noted like the per-domain ones.
    rlpd = dict(acrlpd.get_config(), horizon_length=5, rho=0.5, bc_alpha=0.1, bc_mask='chunk')
    assert paper_settings.notes(TASK1, False, rlpd, 'qam') == [
        'note: the QAM paper runs RLPD on cube-double with --agent.network_style=qam (this run: qc); training on'
    ]
    best_of_n = dict(acfql.get_config(), horizon_length=5, actor_type='best-of-n')
    assert 'has no method' in paper_settings.notes(TASK1, False, best_of_n, 'qam')[0]
    # The driver: auto picks the agent's paper; the record names the protocol and the paper's method.
    run = parse_run(main.PRESET, ['--agent=agents/qam.py', f'--env_name={TASK1}', '--agent.inv_temp=1.0'])
    assert run.protocol == 'qam' and run.flag_record['paper_method'] == 'QAM'
    assert capsys.readouterr().out == ''
    run = parse_run(main.PRESET, [f'--env_name={TASK1}', '--protocol=qam', '--agent.alpha=300', '--agent.rho=0.5',
                                   '--agent.num_qs=10', '--agent.bc_mask=chunk'])
    assert run.protocol == 'qam' and run.flag_record['paper_method'] == 'FQL' and capsys.readouterr().out == ''
    assert parse_run(main.PRESET, [f'--env_name={TASK1}']).flag_record['paper_method'] == 'QC-FQL'
    with pytest.raises(UserError, match='--protocol must be auto, qc or qam, got qa'):
        parse_run(main.PRESET, [f'--env_name={TASK1}', '--protocol=qa'])


def test_a_spec_follows_one_protocol():
    runs, _ = spec.expand(dict(protocol='qam', methods=['QAM', 'FQL', 'RLPD'], envs=[TASK1], seeds=1))
    assert {r.protocol for r in runs} == {'qam'}
    by = {r.method: r for r in runs}
    assert by['QAM'].flags['agent.inv_temp'] == 1.0 and by['QAM'].flags['online_steps'] == 500_000
    assert by['FQL'].flags['agent.alpha'] == 300.0 and by['FQL'].flags['agent.rho'] == 0.5
    assert by['RLPD'].driver == 'main_online.py' and by['RLPD'].flags['agent.bc_alpha'] == 0.1
    # Their RLPD's networks (GELU, layer norm after it), matched gradient by gradient in benchmarks/reference_grads.
    assert by['RLPD'].flags['agent.network_style'] == 'qam' and by['RLPD'].flags['agent.bc_mask'] == 'chunk'
    # The agent file comes first on the command line, before the --agent.* keys read against it.
    argv = spec.group_units([by['QAM']], 1)[0].argv('/tmp/sweep')
    assert argv[2] == '--agent=agents/qam.py' and '--protocol=qam' in argv
    # Prefixed names pick the paper; the same name in the other paper is another method.
    prefixed, _ = spec.expand(dict(methods=['qam:FQL'], envs=[TASK1], seeds=1))
    assert prefixed[0].protocol == 'qam' and prefixed[0].method == 'FQL'
    assert prefixed[0].flags == by['FQL'].flags
    qc_fql, _ = spec.expand(dict(methods=['FQL'], envs=[TASK1], seeds=1))
    assert qc_fql[0].protocol == 'qc' and qc_fql[0].flags['horizon_length'] == 1
    for body, message in (
        (dict(methods=['QC', 'qam:QAM']), 'unknown method preset .QC. of the qam protocol .a method of the qc'),
        (dict(methods=['qc:QC', 'qam:QAM']), 'mixes qam and qc'),
        (dict(protocol='qc', methods=['qam:QAM']), 'mixes qam and qc'),
        (dict(methods=['QAM']), 'unknown method preset .QAM. of the qc protocol .a method of the qam protocol: '
                                'write qam:QAM'),
        (dict(protocol='qcc', methods=['QC']), 'protocol must be one of qc, qam'),
    ):  # fmt: skip
        with pytest.raises(spec.SpecError, match=message) as e:
            spec.expand(dict(body, envs=[TASK1], seeds=1))
        assert '\n' not in str(e.value)


def test_every_qam_preset_and_the_example_spec_parse_as_their_drivers_would(tmp_path):
    runs, _ = spec.expand(dict(protocol='qam', methods=list(presets.QAM_METHODS), envs=[TASK1], seeds=1))
    spec.check_units(spec.group_units(runs, 1), str(tmp_path))
    example = os.path.join(os.path.dirname(presets.__file__), 'examples', 'qam_cube_double.yaml')
    runs, per_process = spec.expand(spec.load_spec(example))
    assert len(runs) == 4 * 5 * 12 and {r.protocol for r in runs} == {'qam'}
    spec.check_units(spec.group_units(runs, per_process), str(tmp_path))


def cell(text, label, method):
    row = next(line for line in text.splitlines() if line.startswith(f'| {label} | {method} |'))
    return [c.strip() for c in row.strip('|').split('|')]


def write_sweep(tmp_path, body, values):
    """A finished sweep of `body` whose runs succeed `values(run)` at each phase end."""
    runs, _ = spec.expand(body)
    with open(os.path.join(tmp_path, 'sweep.json'), 'w') as f:
        json.dump(dict(seeds_per_process=1, runs=[r.__dict__ for r in runs]), f)
    for r in runs:
        offline, online = values(r)
        steps = r.flags['offline_steps'] if r.driver == 'main.py' else 0
        if r.driver == 'main.py':
            fake_run(str(tmp_path), r.name, [steps, steps + 500_000], [offline, online], steps, 500_000,
                     flags=dict(protocol='qam'))  # fmt: skip
        else:
            fake_run(str(tmp_path), r.name, [500_000], [online], 0, 500_000, flags=dict(protocol='qam'))
    return runs


def test_the_table_faces_qam_runs_with_the_qam_papers_seeds(tmp_path):
    body = dict(protocol='qam', methods=['QAM', 'RLPD'], envs=CUBE_DOUBLE, seeds=4)
    write_sweep(tmp_path, body, lambda r: (0.0, 1.0) if r.method == 'QAM' else (None, 0.5))
    text = report.table_markdown(str(tmp_path))
    header = text.splitlines()[0]
    assert header == ('| task | method | seeds | offline end (%) | QAM paper (%) | p | online end (%) | QAM paper (%) '
                      '| p |')  # fmt: skip
    row = cell(text, TASK1, 'QAM')
    point = paper.point_at(paper.curve('cube-double-play-task1', 'QAM', 'qam'), M)
    assert row[4] == f'{100 * point.mean:.1f} [{100 * point.low:.1f}, {100 * point.high:.1f}]'
    # Our 4 seeds at 0 against their 12 near 0.6: far apart; online ours 1.0 against theirs at about 1.0.
    assert row[3].endswith(' !') and float(row[5]) < 0.01
    online = paper.point_at(paper.curve('cube-double-play-task1', 'QAM', 'qam'), 3 * M // 2)
    assert row[7] == f'{100 * online.mean:.1f} [{100 * online.low:.1f}, {100 * online.high:.1f}]'
    assert 0.0 < float(row[8]) <= 1.0
    # The domain row: the mean over its 5 tasks, against the paper's with a test within each task.
    domain = cell(text, 'cube-double (5 tasks, mean)', 'QAM')
    point = paper.point_at(paper.curve('cube-double', 'QAM', 'qam'), M)
    assert domain[3].startswith('0.0 [') and domain[4].startswith(f'{100 * point.mean:.1f} [')
    assert float(domain[5]) < 0.01
    # RLPD, online only: its 500K online steps face the published point at 500K.
    rlpd = cell(text, TASK1, 'RLPD')
    point = paper.point_at(paper.curve('cube-double-play-task1', 'RLPD', 'qam'), 500_000)
    assert rlpd[4] == rlpd[5] == '-' and rlpd[7].startswith(f'{100 * point.mean:.1f} [') and rlpd[8] != '-'
    assert 'p: two-sided permutation test' in text
    # The plots name the paper and draw its curve in each method's colour.
    methods = [(m, e) for (env, m), e in report.results(str(tmp_path)).items() if env == TASK1]
    ax = report.task_figure(TASK1, methods, np.random.default_rng(0)).axes[0]
    labels = {line.get_label() for line in ax.lines if line.get_linestyle() == '--'}
    assert {'QAM (QAM paper)', 'RLPD (QAM paper)'} <= labels


def test_a_100k_offline_qam_run_faces_the_published_point_at_100k(tmp_path):
    runs, _ = spec.expand(dict(protocol='qam', methods=['QAM'], envs=[TASK1], seeds=3,
                               flags=dict(offline_steps=100_000, online_steps=0)))  # fmt: skip
    with open(os.path.join(tmp_path, 'sweep.json'), 'w') as f:
        json.dump(dict(seeds_per_process=3, runs=[r.__dict__ for r in runs]), f)
    for r, value in zip(runs, (0.4, 0.5, 0.44), strict=True):
        fake_run(str(tmp_path), r.name, [100_000], [value], 100_000, 0, flags=dict(protocol='qam'))
    row = cell(report.table_markdown(str(tmp_path)), TASK1, 'QAM')
    assert row[4].startswith('44.0 [') and row[4].endswith('after 100,000 offline steps')
    assert float(row[5]) > 0.5 and row[6] == row[7] == '-'


def test_single_run_plots_use_the_recorded_protocol(tmp_path):
    run = parse_run(main.PRESET, ['--agent=agents/qam.py', f'--env_name={TASK1}', '--offline_steps=1000000',
                                  '--online_steps=500000'])  # fmt: skip
    run_dir = tmp_path / 'qam'
    import log_utils

    log_utils.save_flags(str(run_dir), run.flag_record)
    with open(run_dir / 'eval.csv', 'w') as f:
        f.write('step,return,success\n' + ''.join(f'{s},0,0.5\n' for s in range(0, 3 * M // 2 + 1, 500_000)))
    fig = plotting.draw_runs([str(tmp_path)], paper=True)
    line = next(line for line in fig.axes[0].lines if line.get_label() == 'QAM (QAM paper)')
    assert line.get_xdata()[0] == 50_000 and line.get_xdata()[-1] == 3 * M // 2
