"""`scripts/paper_check.sh`: the budget plan, the refusals, and the whole chain on a CPU with `--tiny`."""

import json
import os
import subprocess

import pytest
from helpers import ROOT, subprocess_env

from sweeps import paper_check
from utils.errors import UserError

MINUTE = 60.0


def test_the_plan_gives_qc_fql_its_8_seeds_first_then_qc_what_is_left():
    plan = paper_check.make_plan(paper_check.PAPER, 20 * MINUTE, generate=True, cores=16)
    assert plan.steps == 100_000 and plan.seeds['QC-FQL'] == 8 and plan.seeds['QC'] >= 1
    used = plan.seconds['data'] + plan.seconds['QC-FQL'] + plan.seconds['QC']
    assert used <= 20 * MINUTE
    # Less time: fewer QC-FQL seeds, and no QC; the data already there frees its share.
    small = paper_check.make_plan(paper_check.PAPER, 10 * MINUTE, generate=True, cores=16)
    assert 1 <= small.seeds['QC-FQL'] < 8 and small.seeds['QC'] == 0
    assert paper_check.make_plan(paper_check.PAPER, 12 * MINUTE, generate=False, cores=16).seeds['QC-FQL'] == 8
    # Much more time: the next published point (200k or later), still a multiple of the 100k spacing.
    large = paper_check.make_plan(paper_check.PAPER, 90 * MINUTE, generate=True, cores=16)
    assert large.steps > 100_000 and large.steps % 100_000 == 0 and large.seeds['QC-FQL'] == 8
    with pytest.raises(UserError, match='cannot fit one seed of QC-FQL'):
        paper_check.make_plan(paper_check.PAPER, 2 * MINUTE, generate=True, cores=16)


def test_the_plan_is_printed_with_its_choices():
    plan = paper_check.make_plan(paper_check.PAPER, 10 * MINUTE, generate=True, cores=16)
    text = '\n'.join(plan.lines(10 * MINUTE, paper_check.PAPER))
    assert 'generate cube-double-play-v0 on all cores' in text
    assert f'QC-FQL: {plan.seeds["QC-FQL"]} seeds in one process, 100,000 offline steps, 50 evaluation' in text
    assert 'QC: not run (one seed takes' in text and 'of 10 min' in text


def test_a_cpu_without_tiny_is_refused_in_one_line(tmp_path):
    env = dict(subprocess_env(), JAX_PLATFORMS='cpu')
    proc = subprocess.run(['bash', 'scripts/paper_check.sh', f'--out={tmp_path}'], cwd=ROOT, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith('error: no GPU is visible to JAX') and len(proc.stderr.splitlines()) == 1
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_the_tiny_check_runs_the_whole_chain(tmp_path):
    out = tmp_path / 'check'
    proc = subprocess.run(['bash', 'scripts/paper_check.sh', '--tiny', f'--out={out}'], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / 'data' / 'cube-double-play-v0.npz').exists()  # generated: it was missing
    assert 'QC-FQL: 2 seeds in one process, 200 offline steps' in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith('| cube-double-play-singletask-task1-v0')]
    assert [r.split('|')[2].strip() for r in rows] == ['QC-FQL', 'QC']
    for row in rows:  # the paper column says the run is shorter than any published point
        assert "| shorter than the paper's protocol | - | - |" in row
    assert (out / 'results.md').read_text().count('shorter than the paper') == 2
    assert (out / 'plots' / 'cube-double-play-singletask-task1-v0.png').stat().st_size > 0
    # QC-FQL's two seeds ran in one process; each has its own finished run directory.
    runs = sorted(os.listdir(out / 'sweep' / 'runs'))
    assert len(runs) == 3 and all((out / 'sweep' / 'runs' / r / 'finished.json').exists() for r in runs)


def test_the_qam_plan_runs_qam_first_then_qam_f():
    plan = paper_check.make_plan(paper_check.PAPER, 20 * MINUTE, generate=False, cores=16, name='qam')
    assert list(plan.seeds) == ['QAM', 'QAM-F'] and plan.steps % 50_000 == 0 and plan.steps >= 100_000
    text = '\n'.join(plan.lines(20 * MINUTE, paper_check.PAPER))
    assert 'no GPU has measured it' in text and "QAM-F on this domain is QAM's setting" in text
    assert not paper_check.make_plan(paper_check.PAPER, 20 * MINUTE, generate=False, cores=16).notes  # QC != QC-FQL
    # Slower than QC-FQL by the CPU ratio, so fewer seeds fit the same budget than QC-FQL gets.
    qc = paper_check.make_plan(paper_check.PAPER, 20 * MINUTE, generate=False, cores=16)
    assert plan.seconds['QAM'] / plan.seeds['QAM'] > qc.seconds['QC-FQL'] / qc.seeds['QC-FQL']


@pytest.mark.slow
def test_the_tiny_qam_check_runs_the_whole_chain(tmp_path):
    out = tmp_path / 'check'
    proc = subprocess.run(['bash', 'scripts/paper_check.sh', '--paper=qam', '--tiny', f'--out={out}'], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'QAM: 2 seeds in one process, 200 offline steps' in proc.stdout
    lines = proc.stdout.splitlines()
    assert '| task | method | seeds | offline end (%) | QAM paper (%) | p |' in '\n'.join(lines)
    rows = [line for line in lines if line.startswith('| cube-double-play-singletask-task1-v0')]
    assert [r.split('|')[2].strip() for r in rows] == ['QAM', 'QAM-F']
    for row in rows:
        assert "| shorter than the paper's protocol | - |" in row
    flags = json.loads(next((out / 'sweep' / 'runs').glob('QAM-F.*/flags.json')).read_text())
    assert flags['protocol'] == 'qam' and flags['paper_method'] == 'QAM' and flags['agent']['num_qs'] == 2
    assert (out / 'plots' / 'cube-double-play-singletask-task1-v0.png').stat().st_size > 0
