"""What a user sees: the OpenGL backend chosen without MUJOCO_GL, quiet driver output ending in a summary, MP4
videos, videos turned off (before any update) where nothing renders, and plots that name and split the phases."""

import os
import re
import subprocess
import sys

import imageio.v3 as iio
import numpy as np
import pytest
from helpers import ROOT, parse_run, subprocess_env

import log_utils
from analysis import plotting
from envs import gl_backend
from evaluation import evaluate
from sweeps.presets import METHODS

ENV = 'cube-single-play-singletask-task2-v0'
TINY = [
    f'--env_name={ENV}',
    '--agent.actor_hidden_dims=(16,16)',
    '--agent.value_hidden_dims=(16,16)',
    '--agent.batch_size=8',
    '--agent.flow_steps=2',
    '--eval_episodes=1',
]
# What third-party noise looked like: Python warnings, absl-formatted log lines, GLFW, JAX's TPU probe.
NOISE = re.compile(r'Warning|WARN|^[IWEF]\d{4} |GLFW|Unable to initialize backend|OpenGL_accelerate')
PROGRESS = re.compile(r'^(offline|online):\s+\d+%\|')


@pytest.fixture
def fresh_choice(monkeypatch):
    monkeypatch.setattr(gl_backend, '_choice', {})


def test_a_backend_the_user_set_is_kept(fresh_choice):
    environ = {'MUJOCO_GL': 'glfw'}
    assert gl_backend.choose_gl_backend(environ) == 'glfw' and environ == {'MUJOCO_GL': 'glfw'}


def test_without_mujoco_gl_the_first_backend_that_renders_is_chosen(fresh_choice):
    environ = {}
    backend = gl_backend.choose_gl_backend(environ)
    assert backend in gl_backend.CANDIDATES, 'neither EGL nor OSMesa renders here (install libosmesa6)'
    assert environ == {'MUJOCO_GL': backend, 'PYOPENGL_PLATFORM': backend}
    assert gl_backend.rendering_disabled_reason(environ) is None


def test_no_backend_that_renders_turns_rendering_off_with_the_reason(fresh_choice, monkeypatch):
    monkeypatch.setattr(gl_backend, 'CANDIDATES', ('no-such-gl',))
    environ = {}
    assert gl_backend.choose_gl_backend(environ) == gl_backend.DISABLED
    reason = gl_backend.rendering_disabled_reason(environ)
    assert 'no-such-gl' in reason and 'MUJOCO_GL=osmesa' in reason


def test_driver_output_is_quiet_and_ends_with_a_summary(data_dir, tmp_path):
    env = subprocess_env()
    env.pop('MUJOCO_GL')  # A fresh user's shell.
    env.pop('PYOPENGL_PLATFORM', None)
    args = [f'--dataset_dir={data_dir}', f'--save_dir={tmp_path}', '--exp_name=quiet', *TINY, '--offline_steps=10',
            '--online_steps=10', '--start_training=3', '--eval_interval=0', '--log_interval=5']  # fmt: skip
    proc = subprocess.run([sys.executable, 'main.py', *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stderr = [line.strip() for line in proc.stderr.replace('\r', '\n').splitlines() if line.strip()]
    assert [line for line in stderr if not PROGRESS.match(line)] == []  # Only progress bars on stderr.
    assert not [line for line in proc.stdout.splitlines() if NOISE.search(line)], proc.stdout
    run_dir = os.path.join(str(tmp_path), 'Debug', 'quiet')
    lines = proc.stdout.splitlines()
    # What was compiled and what came from the persistent compilation cache (the suite's, shared with drivers).
    assert [line for line in lines if re.fullmatch(r'compiles: \d+ programs in [\d.]+ s: \d+ compiled, \d+ loaded '
                                                    r'from the cache in \S+', line)], lines  # fmt: skip
    start = lines.index(f'Summary of {run_dir}')
    offline, online = lines[start + 1], lines[start + 2]
    assert re.fullmatch(r'  offline 10 steps, 10 updates in \d+ s \([\d.]+ updates/s\); eval at step 10: '
                        r'success [\d.]+, return -?[\d.]+', offline), offline  # fmt: skip
    assert re.fullmatch(r'  online  10 steps, 8 updates in \d+ s \([\d.]+ updates/s\); eval at step 20: '
                        r'success [\d.]+, return -?[\d.]+', online), online  # fmt: skip


class RandomChunks:
    """An agent stand-in: uniform random single actions."""

    def __init__(self, action_dim):
        self.rng = np.random.default_rng(0)
        self.action_dim = action_dim

    def sample_actions(self, observations, rng=None):
        return self.rng.uniform(-1, 1, size=self.action_dim).astype(np.float32)


@pytest.mark.slow
def test_evaluation_video_is_an_mp4_with_every_frame(tmp_path):
    assert gl_backend.choose_gl_backend(environ={}) in gl_backend.CANDIDATES, 'nothing renders here'
    # A fresh interpreter renders with the backend chosen here (this one may hold robosuite's MUJOCO_GL).
    code = f"""
import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
from test_output import render_two_episodes
render_two_episodes({str(tmp_path)!r})
"""
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path, expected = proc.stdout.split()[-2:]
    assert path.endswith('.mp4'), path  # Not the GIF fallback: imageio-ffmpeg is installed.
    frames = iio.imread(path)
    assert frames.shape[0] == int(expected) and frames.shape[1] % 16 == 0 and frames.shape[2] % 16 == 0
    assert frames.std() > 0  # A picture, not a blank frame.


def render_two_episodes(out_dir):
    """Renders two random-action episodes of cube-single, cut to 30 steps, into `out_dir`; prints the video path and
    frame count."""
    import gymnasium

    from envs.env_utils import make_seed_envs

    env = gymnasium.wrappers.TimeLimit(make_seed_envs(ENV, 0)[1][0], max_episode_steps=30)
    action_dim = env.action_space.shape[0]
    _, _, renders = evaluate(RandomChunks(action_dim), env, action_dim, num_eval_episodes=0, num_video_episodes=2)
    assert len(renders) == 2
    path = log_utils.Loggers(out_dir).log_video('eval', renders, step=0)
    print(path, sum(len(r) for r in renders))


def test_videos_are_turned_off_before_training_where_nothing_renders(data_dir, tmp_path, monkeypatch, capsys):
    from agents import agents
    from training import Trainer

    monkeypatch.setenv('MUJOCO_GL', 'disable')
    monkeypatch.setattr(gl_backend, '_choice', {'backend': 'disable', 'reason': 'no OpenGL backend renders here'})
    argv = [f'--dataset_dir={data_dir}', f'--save_dir={tmp_path}', *TINY, '--offline_steps=2', '--online_steps=0',
            '--video_episodes=2']  # fmt: skip
    run = parse_run(__import__('main').PRESET, argv)
    trainer = Trainer(run, agents)  # Nothing has been updated yet.
    out = capsys.readouterr().out
    assert 'warning: videos are off (no OpenGL backend renders here)' in out
    assert trainer.run.video_episodes == 0 and 'first update' not in trainer.startup.stages
    trainer.finish(quiet=True)


def test_plots_name_the_run_mark_the_phases_and_keep_success_in_0_1(tmp_path):
    for seed in (0, 1):
        argv = ['--horizon_length=5', '--agent.actor_type=best-of-n', f'--seed={seed}', '--offline_steps=100',
                '--online_steps=100']  # fmt: skip
        run = parse_run(__import__('main').PRESET, argv)
        run_dir = tmp_path / f'qc_sd{seed}'
        log_utils.save_flags(str(run_dir), run.flag_record)
        with open(run_dir / 'eval.csv', 'w') as f:
            f.write('step,return,success\n50,-10,0.2\n100,-8,0.4\n150,-5,0.6\n200,-4,0.8\n')
    curves = plotting.aggregate_curves(plotting.find_run_dirs([str(tmp_path)]), 'success')
    assert len(curves) == 1 and curves[0]['num_runs'] == 2 and curves[0]['label'] == 'QC'
    title = plotting.plot_title(curves)
    assert title == f'{run.env_name} - QC (H=5), offline 100 + online 100 steps'

    fig = plotting.draw_runs([str(tmp_path)])
    success_ax = fig.axes[0]
    assert success_ax.get_ylim() == (-0.02, 1.02)
    assert [line.get_xdata()[0] for line in success_ax.lines if line.get_linestyle() == '--'] == [100]
    assert success_ax.lines[0].get_marker() == 'o'
    assert fig._suptitle.get_text() == title
    assert plotting.plot_runs([str(tmp_path)], str(tmp_path / 'curves.png')) == str(tmp_path / 'curves.png')


@pytest.mark.parametrize('name', list(METHODS))
def test_paper_method_names_runs_of_every_preset(name):
    method = METHODS[name]
    preset = __import__(os.path.splitext(method.driver)[0]).PRESET
    run = parse_run(preset, [f'--{k}={v}' for k, v in method.flags.items()])
    assert plotting.paper_method(plotting._flatten(run.flag_record)) == name
