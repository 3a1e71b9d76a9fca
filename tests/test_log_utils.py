import csv
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import types

import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from ml_collections import ConfigDict, config_flags

import log_utils
from analysis import plotting

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_rows(path):
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


# ---------------------------------------------------------------------------------------------------------------
# CSV


def test_csv_rows_survive_a_killed_process(tmp_path):
    path = tmp_path / 'eval.csv'
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {REPO_ROOT!r})
        import numpy as np
        import log_utils
        logger = log_utils.CsvLogger({str(path)!r})
        logger.log({{'success': np.float32(0.5)}}, step=1)
        logger.log({{'success': 1, 'return': np.int64(3)}}, step=2)
        os._exit(1)  # no close(), no interpreter cleanup
        """
    )
    result = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    header, rows = read_rows(path)
    assert header == ['step', 'success', 'return']
    assert rows == [
        {'step': '1', 'success': '0.5', 'return': ''},
        {'step': '2', 'success': '1.0', 'return': '3.0'},
    ]


def test_csv_header_extension_and_value_conversion(tmp_path):
    path = tmp_path / 'agent.csv'
    logger = log_utils.CsvLogger(str(path))
    logger.log({'a': 1, 'flag': True, 'vec': np.zeros(3), 'step': 999}, step=10)
    # Readable while the logger is still open: every row is flushed.
    assert read_rows(path) == (['step', 'a', 'flag'], [{'step': '10', 'a': '1.0', 'flag': '1.0'}])
    logger.log({'b': jnp.float32(2.5), 'a': np.float64(-1.0)}, step=20)
    logger.log({'a': jnp.array([7])}, step=30)
    header, rows = read_rows(path)
    assert header == ['step', 'a', 'flag', 'b']
    assert rows == [
        {'step': '10', 'a': '1.0', 'flag': '1.0', 'b': ''},
        {'step': '20', 'a': '-1.0', 'flag': '', 'b': '2.5'},
        {'step': '30', 'a': '7.0', 'flag': '', 'b': ''},
    ]
    assert not [p for p in os.listdir(tmp_path) if p.endswith('.tmp')]
    logger.close()
    with pytest.raises(RuntimeError, match='closed'):
        logger.log({'a': 1}, step=40)

    # Reopening the same file appends under the existing header instead of truncating it.
    resumed = log_utils.CsvLogger(str(path))
    resumed.log({'b': 4}, step=40)
    resumed.close()
    header, rows = read_rows(path)
    assert header == ['step', 'a', 'flag', 'b']
    assert [r['step'] for r in rows] == ['10', '20', '30', '40']
    assert rows[-1]['b'] == '4.0'


def test_loggers_one_csv_per_prefix_and_wandb_keys(tmp_path):
    class FakeRun:
        def __init__(self):
            self.logged = []

        def log(self, data, step=None):
            self.logged.append((data, step))

    run = FakeRun()
    with log_utils.Loggers(str(tmp_path / 'run'), wandb_run=run) as loggers:
        loggers.log('eval', {'eval/success': np.float32(1.0), 'return': 2}, step=5)
        loggers.log('offline_agent', {'critic/loss': 0.25}, step=5)
        loggers.log('eval', {'success': 0.0, 'return': 4}, step=10)
    header, rows = read_rows(tmp_path / 'run' / 'eval.csv')
    assert header == ['step', 'success', 'return']
    assert [r['success'] for r in rows] == ['1.0', '0.0']
    header, _ = read_rows(tmp_path / 'run' / 'offline_agent.csv')
    assert header == ['step', 'critic/loss']
    assert run.logged[0] == ({'eval/success': 1.0, 'eval/return': 2.0}, 5)
    assert run.logged[1] == ({'offline_agent/critic/loss': 0.25}, 5)
    assert all(isinstance(v, float) for data, _ in run.logged for v in data.values())


# ---------------------------------------------------------------------------------------------------------------
# names and flags


def test_exp_name_unique_and_filesystem_safe():
    names = {log_utils.get_exp_name(3, env_name='cube_double/play task 2', run_group='my group') for _ in range(20)}
    assert len(names) == 20
    for name in names:
        assert re.fullmatch(r'[A-Za-z0-9._-]+', name), name
        assert 'sd3' in name and name.startswith('my-group_cube_double-play-task-2_')
    assert re.fullmatch(r'sd0_\d{8}_\d{6}_[0-9a-f]{6}', log_utils.get_exp_name(0))


def test_flag_dict_and_atomic_save(tmp_path):
    fv = flags.FlagValues()
    flags.DEFINE_integer('seed', 3, 'seed', flag_values=fv)
    flags.DEFINE_string('env_name', 'cube-double-play', 'env', flag_values=fv)
    flags.DEFINE_multi_integer('sizes', [1, 2], 'sizes', flag_values=fv)
    agent = ConfigDict({'lr': 3e-4, 'horizon_length': 5, 'hidden_dims': (512, 512), 'sub': {'x': None}})
    config_flags.DEFINE_config_dict('agent', agent, flag_values=fv, sys_argv=['prog', '--agent.horizon_length=10'])
    fv(['prog', '--seed=7', '--agent.horizon_length=10'])

    flag_dict = log_utils.get_flag_dict(fv)
    assert flag_dict == {
        'seed': 7,
        'env_name': 'cube-double-play',
        'sizes': [1, 2],
        'agent': {'lr': 3e-4, 'horizon_length': 10, 'hidden_dims': [512, 512], 'sub': {'x': None}},
    }
    path = log_utils.save_flags(str(tmp_path / 'run'), flag_dict)
    assert path == str(tmp_path / 'run' / 'flags.json')
    with open(path) as f:
        assert json.load(f) == flag_dict
    assert os.listdir(tmp_path / 'run') == ['flags.json']  # the temp file was renamed, not left behind

    # Overwriting keeps a complete file: the new content replaces the old in one step.
    log_utils.save_flags(str(tmp_path / 'run'), {'seed': np.int64(1), 'obj': object})
    with open(path) as f:
        saved = json.load(f)
    assert saved['seed'] == 1 and isinstance(saved['obj'], str)


# ---------------------------------------------------------------------------------------------------------------
# wandb


@pytest.fixture
def clean_wandb_env(monkeypatch, tmp_path):
    for var in (
        'WANDB_API_KEY',
        'WANDB_MODE',
        'WANDB_DISABLED',
        'WANDB_BASE_URL',
        'WANDB_IDENTITY_TOKEN_FILE',
        'NETRC',
    ):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / 'home'
    home.mkdir()
    monkeypatch.setenv('HOME', str(home))
    monkeypatch.setattr(log_utils, '_warned', set())
    return home


@pytest.fixture
def fake_wandb(monkeypatch):
    module = types.ModuleType('wandb')
    module.init_calls = []
    module.fail_modes = set()

    class Settings:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            self.base_url = 'https://api.example-wandb.test'

    class Run:
        def __init__(self, mode):
            self.mode = mode
            self.logged = []

        def log(self, data, step=None):
            self.logged.append((data, step))

    class Video:
        def __init__(self, data, fps=4, format=None):
            self.data, self.format = data, format

    def init(mode=None, settings=None, **kwargs):
        module.init_calls.append(dict(mode=mode, settings=settings, **kwargs))
        if mode in module.fail_modes:
            raise TimeoutError('no network\nsecond line')
        return Run(mode)

    module.Settings, module.Video, module.init = Settings, Video, init
    monkeypatch.setitem(sys.modules, 'wandb', module)
    return module


def test_wandb_disabled_by_env_does_not_init(clean_wandb_env, fake_wandb, monkeypatch):
    monkeypatch.setenv('WANDB_MODE', 'disabled')
    assert log_utils.setup_wandb('proj', 'group', 'name', {'a': 1}) is None
    assert fake_wandb.init_calls == []


def test_wandb_without_credentials_goes_offline(clean_wandb_env, fake_wandb, tmp_path):
    run = log_utils.setup_wandb('proj', 'group', 'name', {'agent': ConfigDict({'lr': 1.0})}, dir=str(tmp_path / 'w'))
    assert run is not None and run.mode == 'offline'
    call = fake_wandb.init_calls[0]
    assert call['config'] == {'agent': {'lr': 1.0}}
    assert call['settings'].kwargs['init_timeout'] == 15
    assert (tmp_path / 'w').is_dir()

    # Asking for online without any key must not reach wandb's login prompt.
    run = log_utils.setup_wandb('proj', mode='online')
    assert run.mode == 'offline'
    with pytest.raises(ValueError, match='unknown wandb mode'):
        log_utils.setup_wandb('proj', mode='sometimes')


def test_wandb_credentials_select_online_and_failure_falls_back(clean_wandb_env, fake_wandb, monkeypatch, caplog):
    (clean_wandb_env / '.netrc').write_text('machine api.example-wandb.test\n  login user\n  password abc123\n')
    os.chmod(clean_wandb_env / '.netrc', 0o600)
    assert log_utils.wandb_api_key_available()
    assert log_utils.resolve_wandb_mode() == 'online'

    fake_wandb.fail_modes = {'online'}
    with caplog.at_level(logging.WARNING, logger='log_utils'):
        run = log_utils.setup_wandb('proj')
    assert [c['mode'] for c in fake_wandb.init_calls] == ['online', 'offline']
    assert run.mode == 'offline'
    assert 'TimeoutError: no network)' in caplog.text and 'second line' not in caplog.text

    fake_wandb.fail_modes = {'online', 'offline'}
    monkeypatch.setenv('WANDB_API_KEY', 'x' * 40)
    assert log_utils.setup_wandb('proj') is None


def test_wandb_missing_package_is_disabled_with_warning(clean_wandb_env, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, 'wandb', None)  # makes `import wandb` raise ImportError
    with caplog.at_level(logging.WARNING, logger='log_utils'):
        assert log_utils.setup_wandb('proj') is None
        assert log_utils.setup_wandb('proj') is None
    assert caplog.text.count('wandb is not installed') == 1


def test_real_wandb_offline_without_credentials(clean_wandb_env, tmp_path):
    pytest.importorskip('wandb')
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {REPO_ROOT!r})
        import log_utils
        run = log_utils.setup_wandb('qc-test', 'grp', 'name', {{'a': 1}}, dir={str(tmp_path / 'run')!r})
        run.log({{'eval/success': 1.0}}, step=1)
        print('MODE', run.settings.mode)
        run.finish()
        """
    )
    env = dict(os.environ, WANDB_SILENT='true')
    result = subprocess.run(
        [sys.executable, '-c', script], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'MODE offline' in result.stdout
    assert any(p.startswith('offline-run-') for p in os.listdir(tmp_path / 'run' / 'wandb'))


# ---------------------------------------------------------------------------------------------------------------
# videos


def test_save_video_writes_a_readable_file(tmp_path):
    frames = (np.arange(5 * 8 * 6 * 3) % 256).astype(np.uint8).reshape(5, 8, 6, 3)
    path = log_utils.save_video(frames, str(tmp_path / 'v' / 'eval_10.mp4'), fps=10)
    assert os.path.isfile(path) and os.path.getsize(path) > 0
    assert os.path.splitext(path)[1] in ('.mp4', '.gif', '.npz')
    if path.endswith('.npz'):
        np.testing.assert_array_equal(np.load(path)['frames'], frames)
    else:
        iio = pytest.importorskip('imageio.v3')
        assert iio.imread(path).shape[0] == 5


def test_save_video_without_imageio_saves_frames(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'imageio', None)
    monkeypatch.setitem(sys.modules, 'imageio.v3', None)
    frames = np.random.default_rng(0).integers(0, 255, (3, 4, 4, 3), dtype=np.uint8)
    path = log_utils.save_video(frames, str(tmp_path / 'clip.mp4'), fps=5)
    assert path == str(tmp_path / 'clip.npz')
    data = np.load(path)
    np.testing.assert_array_equal(data['frames'], frames)
    assert int(data['fps']) == 5


def test_log_video_concatenates_episodes_and_logs_to_wandb(tmp_path, fake_wandb):
    run = fake_wandb.init(mode='offline')
    loggers = log_utils.Loggers(str(tmp_path / 'run'), wandb_run=run)
    renders = [np.zeros((3, 4, 4, 3), np.uint8), np.full((2, 4, 4, 3), 255, np.uint8)]
    path = loggers.log_video('eval', renders, step=7)
    assert os.path.dirname(path) == str(tmp_path / 'run' / 'videos')
    assert os.path.basename(path).startswith('eval_7.')
    ((data, step),) = run.logged
    assert step == 7 and isinstance(data['eval/video'], fake_wandb.Video)
    assert loggers.log_video('eval', [], step=8) is None


# ---------------------------------------------------------------------------------------------------------------
# plotting


def write_eval_csv(run_dir, rows, prefix='', return_key='episode.return'):
    # `episode.return` is what evaluation logs (the reference's name); runs of earlier versions have `return`.
    loggers = log_utils.Loggers(str(run_dir))
    for step, success, ret in rows:
        loggers.log('eval', {f'{prefix}success': success, f'{prefix}{return_key}': ret}, step=step)
    loggers.close()


def write_prefixed_csv(run_dir, rows):
    # Some writers keep the `eval/` prefix in the column names; plotting must read those too.
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, 'eval.csv'), 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(['step', 'eval/success', 'eval/return'])
        writer.writerows(rows)


def test_plot_two_seeds_averaged_into_one_curve(tmp_path):
    group = tmp_path / 'exp' / 'qc' / 'cube-double'
    write_eval_csv(group / 'sd0', [(0, 0.0, 1.0), (100, 0.5, 3.0), (200, 1.0, 5.0)])
    write_prefixed_csv(str(group / 'sd1'), [(0, 0.2, 1.0), (100, 0.7, 5.0)])  # stopped early
    other = tmp_path / 'exp' / 'bfn' / 'cube-double' / 'sd0'
    write_eval_csv(other, [(0, 0.1, 0.0), (100, 0.1, 0.0)], return_key='return')

    curves = plotting.aggregate_curves(plotting.find_run_dirs([str(tmp_path / 'exp')]), 'success')
    by_label = {c['label']: c for c in curves}
    assert set(by_label) == {'qc/cube-double', 'bfn/cube-double'}
    qc = by_label['qc/cube-double']
    assert qc['num_runs'] == 2
    np.testing.assert_allclose(qc['steps'], [0, 100, 200])
    np.testing.assert_allclose(qc['mean'], [0.1, 0.6, 1.0])
    np.testing.assert_allclose(qc['min'], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(qc['max'], [0.2, 0.7, 1.0])
    # Returns under the reference's name (sd0), the `eval/` prefix (sd1) and the bare name of older runs (bfn).
    returns = {
        c['label']: c for c in plotting.aggregate_curves(plotting.find_run_dirs([str(tmp_path / 'exp')]), 'return')
    }
    np.testing.assert_allclose(returns['qc/cube-double']['mean'], [1.0, 4.0, 5.0])
    np.testing.assert_allclose(returns['bfn/cube-double']['mean'], [0.0, 0.0])

    out = tmp_path / 'plots' / 'curves.png'
    assert plotting.plot_runs([str(group / 'sd0'), str(group / 'sd1')], str(out)) == str(out)
    with open(out, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_plot_cli_single_run_and_missing_dir(tmp_path, capsys):
    run = tmp_path / 'g' / 'run0'
    write_eval_csv(run, [(0, 0.0, 1.0), (50, 1.0, 2.0)])
    out = tmp_path / 'single.png'
    assert plotting.main(['plot', str(run), '--out', str(out), '--band', 'minmax', '--metrics', 'success']) == 0
    assert out.stat().st_size > 0
    assert plotting.main(['plot', str(tmp_path / 'nothing'), '--out', str(tmp_path / 'x.png')]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith('error: no eval.csv') and '\n' not in err
    assert not (tmp_path / 'x.png').exists()


def test_log_utils_module_runs_the_plot_cli(tmp_path):
    # The README's command: `python -m log_utils plot ...` must keep working after plotting moved to analysis/.
    run = tmp_path / 'g' / 'run0'
    write_eval_csv(run, [(0, 0.0, 1.0), (50, 1.0, 2.0)])
    out = tmp_path / 'cli.png'
    cmd = [sys.executable, '-m', 'log_utils', 'plot', str(run), '--out', str(out)]
    result = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out) and out.stat().st_size > 0


def test_plot_groups_by_flags_ignoring_seed_and_paths(tmp_path):
    # main.py's layout: save_dir/run_group/exp_name, so different configs share a parent directory.
    configs = [(0, 5, 'cube'), (1, 5, 'cube'), (0, 1, 'cube'), (0, 5, 'puzzle')]
    for i, (seed, horizon, env_name) in enumerate(configs):
        run_dir = tmp_path / 'qc' / f'run{i}'
        write_eval_csv(run_dir, [(0, float(i), 0.0)])
        flag_dict = {'seed': seed, 'save_dir': str(run_dir), 'run_group': 'qc', 'env_name': env_name}
        log_utils.save_flags(str(run_dir), dict(flag_dict, agent={'horizon': horizon}))
    run_dirs = plotting.find_run_dirs([str(tmp_path)])
    assert len(run_dirs) == 4

    curves = {c['label']: c for c in plotting.aggregate_curves(run_dirs, 'success')}
    assert sorted(curves) == ['qc/cube [agent.horizon=1]', 'qc/cube [agent.horizon=5]', 'qc/puzzle [agent.horizon=5]']
    assert curves['qc/cube [agent.horizon=5]']['num_runs'] == 2
    np.testing.assert_allclose(curves['qc/cube [agent.horizon=5]']['mean'], [0.5])

    by_parent = plotting.aggregate_curves(run_dirs, 'success', group_by='parent')
    assert [c['num_runs'] for c in by_parent] == [4]
