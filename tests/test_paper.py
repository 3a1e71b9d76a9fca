"""The paper's published curves next to our results: the shipped data, the name mapping, the sweep table's paper
columns (known rows, a domain's aggregate row, the non-overlap mark, rows the paper lacks or runs too short), and
the dashed overlays of the sweep plots and of `python -m log_utils plot --paper`."""

import hashlib
import json
import os
import re

import numpy as np
import pytest
from helpers import fake_run, parse_run

import log_utils
import main
from analysis import paper, plotting
from sweeps import report, spec

TASK2 = 'cube-triple-play-singletask-task2-v0'
CUBE_TRIPLE = [f'cube-triple-play-singletask-task{k}-v0' for k in range(1, 6)]
M = 1_000_000


def test_the_shipped_csv_is_the_released_one():
    # analysis/published/README.md records the SHA-256 of the shared file the copy was made from.
    readme = open(os.path.join(os.path.dirname(paper.PUBLISHED_CSV), 'README.md')).read()
    recorded = re.search(r'SHA-256 of the file: `([0-9a-f]{64})`', readme).group(1)
    assert hashlib.sha256(open(paper.PUBLISHED_CSV, 'rb').read()).hexdigest() == recorded
    points = paper.curve('cube-triple-play-task2', 'QC')
    assert [p.step for p in points] == list(range(0, 2 * M + 1, 100_000))
    assert all(0.0 <= p.low <= p.mean <= p.high <= 1.0 for p in points)
    assert paper.curve('all', 'QC')[-1].mean == pytest.approx(0.86, abs=0.01)  # the README's headline value
    # Online-only methods: their 1M online steps sit at published steps 1M to 2M, like everyone's online phase.
    assert [p.step for p in paper.curve('cube-triple-play-task2', 'RLPD')] == list(range(M, 2 * M + 1, 100_000))


@pytest.mark.parametrize(
    'env, task',
    [
        (TASK2, 'cube-triple-play-task2'),
        ('scene-play-singletask-task5-v0', 'scene-play-task5'),
        ('lift-mh-low_dim', 'lift'),
        ('cube-single-play-singletask-task2-v0', None),  # not a task of the paper
        ('visual-cube-triple-play-singletask-task2-v0', None),
        ('lift-ph-low_dim', None),
    ],
)
def test_our_environment_names_map_to_published_tasks(env, task):
    assert paper.published_task(env) == task


def cell(text, label, method):
    """The cells of the table row of `label` and `method`."""
    row = next(line for line in text.splitlines() if line.startswith(f'| {label} | {method} |'))
    return [c.strip() for c in row.strip('|').split('|')]


def published(task, method, step):
    point = paper.point_at(paper.curve(task, method), step)
    return f'{100 * point.mean:.1f} [{100 * point.low:.1f}, {100 * point.high:.1f}]'


@pytest.fixture
def sweep_dir(tmp_path):
    """A finished sweep: QC on the 5 cube-triple tasks (2 seeds, the paper's 1M + 1M) and on cube-single; RLPD on
    task2 for 300k online steps; BFN on task2 for 50k + 50k steps (no published point: the curves step by 100k)."""
    body = dict(methods=['QC', 'RLPD', 'BFN'], envs=[*CUBE_TRIPLE, 'cube-single-play-singletask-task2-v0'], seeds=2)
    runs, _ = spec.expand(body)
    with open(os.path.join(tmp_path, 'sweep.json'), 'w') as f:
        json.dump(dict(seeds_per_process=1, runs=[r.__dict__ for r in runs]), f)
    for r in runs:
        if r.method == 'QC':
            # Task 2: success 1.0 at both ends, far above the paper's offline value; the others 0.5.
            value = 1.0 if r.env == TASK2 else 0.5
            fake_run(str(tmp_path), r.name, [M // 2, M, 3 * M // 2, 2 * M], [0.0, value, 0.0, value], M, M)
        elif r.method == 'RLPD' and r.env == TASK2:
            fake_run(str(tmp_path), r.name, [100_000, 300_000], [0.1, 0.2], 0, 300_000)
        elif r.method == 'BFN' and r.env == TASK2:
            fake_run(str(tmp_path), r.name, [50_000, 100_000], [0.1, 0.2], 50_000, 50_000)
    return str(tmp_path)


def test_the_table_shows_the_paper_next_to_ours(sweep_dir):
    text = report.table_markdown(sweep_dir)
    # A known row at the paper's protocol: ours, then the published value at 1M (offline end) and 2M (online end).
    qc2 = cell(text, TASK2, 'QC')
    assert qc2[3] == '100.0 [100.0, 100.0] !' and qc2[4] == published('cube-triple-play-task2', 'QC', M)
    assert qc2[6] == published('cube-triple-play-task2', 'QC', 2 * M)
    # Non-overlap marked only where the intervals are apart (the paper's offline QC value there is far below 100).
    assert paper.point_at(paper.curve('cube-triple-play-task2', 'QC'), M).high < 1.0
    assert qc2[5].endswith(' !') == (paper.point_at(paper.curve('cube-triple-play-task2', 'QC'), 2 * M).high < 1.0)
    assert "!: our interval and the paper's do not overlap." in text
    # The domain row: all 5 tasks ran, so the mean over tasks (0.6) sits next to the paper's cube-triple row.
    domain = cell(text, 'cube-triple (5 tasks, mean)', 'QC')
    assert domain[2] == '2' and domain[3].startswith('60.0 [')
    assert domain[4] == published('cube-triple', 'QC', M)
    assert domain[6] == published('cube-triple', 'QC', 2 * M)
    # A task the paper lacks, an online-only run shorter than the paper's 1M (compared at its own step), and one
    # whose steps the curve does not have.
    assert cell(text, 'cube-single-play-singletask-task2-v0', 'QC')[4] == 'no published row'
    rlpd = cell(text, TASK2, 'RLPD')
    assert rlpd[4] == '-'
    assert rlpd[6] == published('cube-triple-play-task2', 'RLPD', M + 300_000) + ' after 300,000 online steps'
    bfn = cell(text, TASK2, 'BFN')
    assert bfn[4] == bfn[6] == "shorter than the paper's protocol"
    # No aggregate row for a method that did not run every task of the domain.
    assert 'cube-triple (5 tasks, mean) | RLPD' not in text


def test_the_sweep_plot_draws_the_published_curve(sweep_dir):
    methods = [(m, e) for (env, m), e in report.results(sweep_dir).items() if env == TASK2 and e['curves']]
    fig = report.task_figure(TASK2, methods, np.random.default_rng(0))
    ax = fig.axes[0]
    dashed = {line.get_label(): line for line in ax.lines if line.get_linestyle() == '--'}
    assert {'QC (QC paper)', 'RLPD (QC paper)'} <= set(dashed)
    ours = next(line for line in ax.lines if line.get_label().startswith('QC ('))
    assert dashed['QC (QC paper)'].get_color() == ours.get_color()
    # x counts from the start of the online phase: the paper's offline end (1M) at 0, within our runs' range.
    xs = dashed['QC (QC paper)'].get_xdata()
    assert xs.min() == -M // 2 and xs.max() == M and 0 in xs
    np.testing.assert_allclose(dashed['QC (QC paper)'].get_ydata()[list(xs).index(0)],
                               paper.point_at(paper.curve('cube-triple-play-task2', 'QC'), M).mean)  # fmt: skip
    assert len(ax.collections) >= 4  # our bands and the published ones
    # BFN ran 50k + 50k steps: the published offline points up to 50k steps (only step 0) from our offline start,
    # and of the online phase only the point at the phase boundary, in the same colour.
    assert list(dashed['BFN (QC paper)'].get_xdata()) == [-50_000]
    colour = dashed['BFN (QC paper)'].get_color()
    boundary = [line for line in ax.lines if line.get_linestyle() == '--' and line.get_color() == colour]
    assert sorted(list(line.get_xdata()) for line in boundary) == [[-50_000], [0]]


def test_an_offline_run_of_100k_steps_faces_the_published_point_at_100k(tmp_path):
    """The paper check's runs: offline only, 100k steps, evaluated at the end."""
    env = 'cube-double-play-singletask-task1-v0'
    runs, _ = spec.expand(dict(methods=['QC-FQL'], envs=[env], seeds=2))
    with open(os.path.join(tmp_path, 'sweep.json'), 'w') as f:
        json.dump(dict(seeds_per_process=2, runs=[r.__dict__ for r in runs]), f)
    for r, value in zip(runs, (0.2, 0.3), strict=True):
        fake_run(str(tmp_path), r.name, [100_000], [value], 100_000, 0)
    row = cell(report.table_markdown(str(tmp_path)), env, 'QC-FQL')
    expected = published('cube-double-play-task1', 'QC-FQL', 100_000) + ' after 100,000 offline steps'
    assert row[3].startswith('25.0 [') and row[4] == expected and row[5] == row[6] == '-'
    methods = [(m, e) for (_, m), e in report.results(str(tmp_path)).items()]
    ax = report.task_figure(env, methods, np.random.default_rng(0)).axes[0]
    line = next(line for line in ax.lines if line.get_label() == 'QC-FQL (QC paper)')
    # Drawn from our start (published step 0) to our end (published step 100k), which is x = 0.
    assert list(line.get_xdata()) == [-100_000, 0]
    point = paper.point_at(paper.curve('cube-double-play-task1', 'QC-FQL'), 100_000)
    assert line.get_ydata()[-1] == point.mean


def test_single_run_plots_overlay_the_paper_with_a_flag(tmp_path):
    argv = [f'--env_name={TASK2}', '--horizon_length=5', '--agent.actor_type=best-of-n', f'--offline_steps={M}',
            f'--online_steps={M}']  # fmt: skip
    run = parse_run(main.PRESET, argv)
    run_dir = tmp_path / 'qc'
    log_utils.save_flags(str(run_dir), run.flag_record)
    with open(run_dir / 'eval.csv', 'w') as f:
        f.write('step,return,success\n' + ''.join(f'{s},0,0.5\n' for s in range(0, 2 * M + 1, 500_000)))
    plain = plotting.draw_runs([str(tmp_path)])
    assert not any(line.get_label() == 'QC (QC paper)' for line in plain.axes[0].lines)
    fig = plotting.draw_runs([str(tmp_path)], paper=True)
    line = next(line for line in fig.axes[0].lines if line.get_label() == 'QC (QC paper)')
    # Absolute steps here: the paper's offline end lands on our boundary at 1M.
    assert line.get_linestyle() == '--' and line.get_xdata()[0] == 0 and line.get_xdata()[-1] == 2 * M
    assert not any(line.get_label() == 'QC (QC paper)' for line in fig.axes[1].lines)  # success axes only
    out = tmp_path / 'curves.png'
    assert plotting.main(['plot', str(tmp_path), '--paper', '--out', str(out)]) == 0 and out.stat().st_size > 0
