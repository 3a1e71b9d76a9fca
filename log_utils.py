"""Run bookkeeping: CSV metric logs, optional wandb, flags, videos, and learning-curve plots.

Everything here works without wandb or imageio installed; those packages only add features when present.

Plot evaluation curves of finished (or running) runs:

    python -m log_utils plot RUN_DIR [RUN_DIR ...] --out curves.png
"""

import argparse
import csv
import json
import logging
import math
import netrc
import os
import re
import secrets
import sys
import time
from collections import OrderedDict
from numbers import Number
from urllib.parse import urlparse

import numpy as np

from utils.io_utils import atomic_write

logger = logging.getLogger(__name__)

WANDB_MODES = ('online', 'offline', 'disabled')
_warned = set()


def _warn_once(message):
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


def to_scalar(value):
    """Python float for a numeric scalar (python, numpy, JAX, size-1 array); None when it is not one."""
    if isinstance(value, Number):
        return float(value)
    try:
        arr = np.asarray(value)
    except Exception:
        return None
    if arr.size == 1 and (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        return float(arr.reshape(()))
    return None


def _csv_value(value):
    if isinstance(value, str):
        return value
    return to_scalar(value)


class CsvLogger:
    """Appends one row per `log` call to a CSV file whose first column is `step`.

    The header is the union of the keys seen so far; a row with new keys rewrites the file with the extended header
    (old rows get empty cells). Every row is flushed, so a killed run keeps what it logged. An existing file is
    appended to (its header is reused), so resuming into the same directory does not lose rows.
    """

    def __init__(self, path):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fields = ['step']
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path, newline='') as f:
                header = next(csv.reader(f), None)
            if header:
                self._fields = list(header)
            self._file = open(path, 'a', newline='')
        else:
            self._file = open(path, 'w', newline='')
            csv.writer(self._file).writerow(self._fields)
            self._file.flush()

    @property
    def fieldnames(self):
        return list(self._fields)

    def log(self, row, step):
        """Appends `row` (metric name -> scalar) at `step`; non-scalar values are skipped."""
        if self._file is None:
            raise RuntimeError(f'CsvLogger for {self.path} is closed')
        values = {}
        for key, value in row.items():
            key = str(key)
            if key == 'step':
                continue
            value = _csv_value(value)
            if value is not None:
                values[key] = value
        new_keys = [k for k in values if k not in self._fields]
        if new_keys:
            self._extend_header(new_keys)
        values['step'] = int(step)
        csv.DictWriter(self._file, fieldnames=self._fields, restval='').writerow(values)
        self._file.flush()

    def _extend_header(self, new_keys):
        self._file.close()
        with open(self.path, newline='') as f:
            rows = list(csv.DictReader(f))
        self._fields = self._fields + new_keys

        def write(f):
            writer = csv.DictWriter(f, fieldnames=self._fields, restval='')
            writer.writeheader()
            writer.writerows(rows)

        atomic_write(self.path, write, newline='')
        self._file = open(self.path, 'a', newline='')

    def close(self):
        """Closes the file; later `log` calls raise."""
        if self._file is not None:
            self._file.close()
            self._file = None


def drop_rows_after(path, step):
    """Rewrites a CSV log without its rows after `step` (those a resumed run logs again); no-op if absent."""
    if not os.path.exists(path):
        return
    with open(path, newline='') as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    header, body = rows[0], rows[1:]
    kept = [row for row in body if row and float(row[0]) <= step]
    if len(kept) == len(body):
        return

    def write(f):
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(kept)

    atomic_write(path, write, newline='')


class Loggers:
    """One `CsvLogger` per prefix (`run_dir/eval.csv`, ...), mirrored to wandb as `prefix/key` when a run is given.

    CSV columns are the bare metric names; a key already starting with `prefix/` is stripped so both spellings end
    up in the same column.
    """

    def __init__(self, run_dir, wandb_run=None):
        self.run_dir = run_dir
        self.wandb_run = wandb_run
        self._csv = {}
        os.makedirs(run_dir, exist_ok=True)

    def csv_logger(self, prefix):
        """The CSV logger of `prefix`, created on first use."""
        if prefix not in self._csv:
            self._csv[prefix] = CsvLogger(os.path.join(self.run_dir, f'{prefix}.csv'))
        return self._csv[prefix]

    def log(self, prefix, metrics, step):
        """Logs `metrics` under `prefix` at `step` to CSV and, if enabled, wandb."""
        strip = prefix + '/'
        row = {(k[len(strip) :] if str(k).startswith(strip) else str(k)): v for k, v in metrics.items()}
        self.csv_logger(prefix).log(row, step)
        if self.wandb_run is not None:
            payload = {}
            for key, value in row.items():
                scalar = to_scalar(value)
                payload[f'{prefix}/{key}'] = scalar if scalar is not None else value
            self.wandb_run.log(payload, step=int(step))

    def log_video(self, prefix, renders, step, fps=15):
        """Saves the episodes in `renders` (list of (T, H, W, C) uint8 arrays) back to back as one video.

        Returns the written path (see `save_video`), or None when there is nothing to save.
        """
        if renders is None or len(renders) == 0:
            return None
        frames = np.concatenate([np.asarray(r) for r in renders], axis=0)
        path = save_video(frames, os.path.join(self.run_dir, 'videos', f'{prefix}_{int(step)}.mp4'), fps=fps)
        if self.wandb_run is not None:
            video = wandb_video(path, frames, fps=fps)
            if video is not None:
                self.wandb_run.log({f'{prefix}/video': video}, step=int(step))
        return path

    def close(self):
        """Closes all CSV files (wandb is left to the caller)."""
        for csv_logger in self._csv.values():
            csv_logger.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _sanitize(part):
    return re.sub(r'[^A-Za-z0-9._-]+', '-', str(part)).strip('-._')


def get_exp_name(seed, env_name=None, run_group=None):
    """Unique, filesystem-safe run name: `[group_][env_]sd{seed}_{YYYYmmdd_HHMMSS}_{random hex}`."""
    parts = [run_group, env_name, f'sd{seed}', time.strftime('%Y%m%d_%H%M%S'), secrets.token_hex(3)]
    parts = [_sanitize(p) for p in parts if p not in (None, '')]
    return '_'.join(p for p in parts if p)


def _jsonable(value):
    if hasattr(value, 'to_dict') and callable(value.to_dict):  # ml_collections ConfigDict / FrozenConfigDict
        value = value.to_dict()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | bool | int | float):
        return value
    scalar = to_scalar(value)
    if scalar is not None:
        return int(scalar) if isinstance(value, np.integer) else scalar
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def get_flag_dict(flag_values=None):
    """The program's absl flags as a JSON-serializable dict (config-dict flags become nested dicts).

    Flags defined by absl itself (logging verbosity, ...) and the per-field override flags of config-dict flags
    (`agent.lr`, already inside `agent`) are left out. Works before parsing too (defaults are reported).
    """
    if flag_values is None:
        from absl import flags

        flag_values = flags.FLAGS
    module_flags = flag_values.flags_by_module_dict()
    skipped = {f.name for module, fl in module_flags.items() if module.startswith('absl.') for f in fl}
    names = [name for name in flag_values if name not in skipped]
    result = {}
    for name in sorted(names):
        head = name.split('.', 1)[0]
        if '.' in name and head in names:
            continue
        result[name] = _jsonable(flag_values[name].value)
    return result


def save_flags(run_dir, flag_dict, filename='flags.json'):
    """Writes `flag_dict` to `run_dir/flags.json` atomically; returns the path."""
    path = os.path.join(run_dir, filename)
    atomic_write(path, lambda f: json.dump(_jsonable(flag_dict), f, indent=2, sort_keys=True))
    return path


# ---------------------------------------------------------------------------------------------------------------
# wandb


def _import_wandb():
    try:
        import wandb
    except ImportError:
        _warn_once('wandb is not installed; wandb logging disabled (pip install wandb to enable it).')
        return None
    return wandb


def _wandb_hosts():
    hosts = {'api.wandb.ai'}
    urls = [os.environ.get('WANDB_BASE_URL')]
    wandb = sys.modules.get('wandb')
    if wandb is not None:
        # Recent wandb releases default to a different server; ask the installed package rather than guess.
        try:
            urls.append(wandb.Settings().base_url)
        except Exception:
            pass
    for url in urls:
        if url and urlparse(url).hostname:
            hosts.add(urlparse(url).hostname)
    return hosts


def wandb_api_key_available():
    """True if wandb credentials exist (env key or token file, or a netrc entry for a wandb host); never prompts."""
    if os.environ.get('WANDB_API_KEY') or os.environ.get('WANDB_IDENTITY_TOKEN_FILE'):
        return True
    netrc_path = os.environ.get('NETRC') or os.path.join(os.path.expanduser('~'), '.netrc')
    if not os.path.isfile(netrc_path):
        return False
    try:
        entries = netrc.netrc(netrc_path)
    except (OSError, netrc.NetrcParseError):
        return False
    for host in _wandb_hosts():
        auth = entries.authenticators(host)
        if auth and auth[2]:
            return True
    return False


def resolve_wandb_mode(mode=None):
    """The wandb mode to use: explicit `mode`, else `WANDB_MODE`, else online with credentials and offline without.

    Online without credentials would make wandb prompt for a key, so it is downgraded to offline with a warning.
    """
    if mode is None:
        if os.environ.get('WANDB_DISABLED', '').lower() in ('1', 'true', 'yes'):
            return 'disabled'
        mode = os.environ.get('WANDB_MODE') or None
    if mode is not None:
        mode = {'dryrun': 'offline', 'run': 'online', 'off': 'disabled'}.get(str(mode).lower(), str(mode).lower())
        if mode not in WANDB_MODES:
            raise ValueError(f'unknown wandb mode {mode!r}; use one of {", ".join(WANDB_MODES)}')
    has_key = wandb_api_key_available()
    if mode is None:
        return 'online' if has_key else 'offline'
    if mode == 'online' and not has_key:
        _warn_once('wandb: no API key (WANDB_API_KEY or ~/.netrc); logging offline, upload later with `wandb sync`.')
        return 'offline'
    return mode


def setup_wandb(
    project,
    group=None,
    name=None,
    config=None,
    mode=None,
    dir=None,
    entity=None,
    tags=None,
    init_timeout=15,
    run_id=None,
):
    """Starts a wandb run without ever prompting; returns the run, or None when wandb is disabled or unavailable.

    The mode is chosen by `resolve_wandb_mode`. An online start that fails (e.g. no network within `init_timeout`
    seconds) is retried offline; if that fails too, logging continues with CSV only. With `run_id` (a resumed
    run) the same wandb run is continued.
    """
    if resolve_wandb_mode(mode) == 'disabled':
        return None
    wandb = _import_wandb()
    if wandb is None:
        return None
    # Resolved again now that wandb is imported, so its own default server counts when looking for credentials.
    mode = resolve_wandb_mode(mode)
    if dir is not None:
        os.makedirs(dir, exist_ok=True)
    kwargs = dict(
        project=project, group=group, name=name, config=_jsonable(config or {}), dir=dir, entity=entity, tags=tags
    )
    if run_id is not None:
        kwargs.update(id=run_id, resume='allow')
    for attempt in [mode, 'offline'] if mode == 'online' else [mode]:
        try:
            settings = wandb.Settings(init_timeout=init_timeout)
            return wandb.init(mode=attempt, settings=settings, **kwargs)
        except Exception as e:  # wandb raises several unrelated types (CommError, UsageError, timeouts...)
            first_line = (str(e).strip().splitlines() or [''])[0]
            logger.warning('wandb %s start failed (%s: %s)', attempt, type(e).__name__, first_line)
    logger.warning('wandb unavailable; logging to CSV only.')
    return None


def wandb_video(path, frames=None, fps=15):
    """A `wandb.Video` for a saved video file (or raw frames as a fallback), or None if wandb cannot make one."""
    wandb = _import_wandb()
    if wandb is None:
        return None
    ext = os.path.splitext(path)[1].lstrip('.').lower() if path else ''
    try:
        if ext in ('mp4', 'gif', 'webm', 'ogg'):
            return wandb.Video(path, format=ext)
        if frames is not None:
            # wandb wants (T, C, H, W); encoding raw frames needs moviepy, hence the try.
            return wandb.Video(np.transpose(np.asarray(frames), (0, 3, 1, 2)), fps=fps, format='gif')
    except Exception as e:
        _warn_once(f'wandb video logging failed ({type(e).__name__}: {e}); videos stay on disk only.')
    return None


# ---------------------------------------------------------------------------------------------------------------
# videos


def save_video(frames, path, fps=15):
    """Writes frames (T, H, W, C) uint8 to `path` (.mp4 or .gif) and returns the path actually written.

    mp4 needs imageio with an ffmpeg/pyav backend; without one a .gif is written next to it, and without imageio
    the frames are kept as a .npz (keys `frames`, `fps`).
    """
    frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        frames = np.clip(frames, 0, 255).astype(np.uint8)
    if frames.ndim == 3:  # grayscale
        frames = frames[..., None]
    if frames.ndim != 4:
        raise ValueError(f'video frames must be (T, H, W, C), got shape {frames.shape}')
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    stem, ext = os.path.splitext(path)
    ext = ext.lower()
    try:
        import imageio.v3 as iio
    except ImportError:
        iio = None
        _warn_once('imageio is not installed; videos are saved as .npz frame arrays (pip install imageio).')
    if iio is not None:
        if ext not in ('.gif',):
            try:
                iio.imwrite(path, frames, fps=fps)
                return path
            except Exception as e:
                _warn_once(
                    f'cannot write {ext or "extensionless"} video ({type(e).__name__}); writing .gif instead '
                    '(pip install imageio-ffmpeg for mp4).'
                )
                if os.path.exists(path) and os.path.getsize(path) == 0:
                    os.remove(path)
        gif_path = stem + '.gif'
        try:
            rgb = frames if frames.shape[-1] in (3, 4) else np.repeat(frames[..., :1], 3, axis=-1)
            iio.imwrite(gif_path, rgb, extension='.gif', duration=1000.0 / fps, loop=0)
            return gif_path
        except Exception as e:
            _warn_once(f'cannot write gif ({type(e).__name__}: {e}); saving .npz frames instead.')
    npz_path = stem + '.npz'
    np.savez_compressed(npz_path, frames=frames, fps=fps)
    return npz_path


# ---------------------------------------------------------------------------------------------------------------
# plotting


def read_csv(path):
    """Columns of a CSV log as float arrays (empty or non-numeric cells become NaN)."""
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    columns = OrderedDict()
    for row in rows:
        for key in row:
            columns.setdefault(key, [])
    for key in columns:
        for row in rows:
            try:
                columns[key].append(float(row.get(key) or 'nan'))
            except ValueError:
                columns[key].append(math.nan)
    return {k: np.asarray(v, dtype=np.float64) for k, v in columns.items()}


def _metric_column(columns, metric):
    for candidate in (metric, f'eval/{metric}', f'episode.{metric}', f'eval/episode.{metric}'):
        if candidate in columns:
            return columns[candidate]
    return None


def find_run_dirs(paths, csv_name='eval.csv'):
    """Run directories among `paths`: a path holding `csv_name` is a run; other directories are searched below."""
    runs = []
    for path in paths:
        if os.path.isfile(os.path.join(path, csv_name)):
            runs.append(path)
        elif os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs.sort()
                if csv_name in files:
                    runs.append(root)
    return runs


def _is_group_flag(name):
    # Flags that differ between seeds of one experiment (or only say where to write) must not split a group.
    return not (name == 'seed' or name == 'exp_name' or name.startswith('wandb') or name.endswith('_dir'))


def _flatten(d, prefix=''):
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(_flatten(v, f'{prefix}{k}.'))
        else:
            flat[f'{prefix}{k}'] = v
    return flat


def _group_of(run_dir, group_by):
    """(group key, default label, flattened grouping flags or None) of a run."""
    run_dir = os.path.abspath(run_dir)
    parent = os.path.dirname(run_dir)
    label = os.path.join(os.path.basename(os.path.dirname(parent)), os.path.basename(parent))
    flags_path = os.path.join(run_dir, 'flags.json')
    if group_by in ('flags', 'auto') and os.path.isfile(flags_path):
        with open(flags_path) as f:
            flag_dict = json.load(f)
        kept = {k: v for k, v in _flatten(flag_dict).items() if _is_group_flag(k)}
        label = '/'.join(str(flag_dict[k]) for k in ('run_group', 'env_name') if flag_dict.get(k)) or label
        return json.dumps(kept, sort_keys=True, default=str), label, kept
    return parent, label, None


def _distinguishing_labels(groups):
    """Labels naming the flags that differ between groups, when every group has flags and defaults collide."""
    labels = [label for label, _, _ in groups]
    flag_sets = [kept for _, _, kept in groups]
    if len(set(labels)) == len(labels) or any(kept is None for kept in flag_sets):
        return [label if labels.count(label) == 1 else f'{label} #{i + 1}' for i, label in enumerate(labels)]
    keys = sorted(set().union(*flag_sets))
    differing = [k for k in keys if len({json.dumps(kept.get(k), default=str) for kept in flag_sets}) > 1]
    result = []
    for label, kept in zip(labels, flag_sets):
        extra = ', '.join(f'{k}={kept.get(k)}' for k in differing if k not in ('run_group', 'env_name'))
        result.append(f'{label} [{extra}]' if extra else label)
    return result


def aggregate_curves(run_dirs, metric, group_by='auto'):
    """Per group: dict(label, steps, mean, std, min, max, num_runs), averaging the runs of a group at each step.

    `group_by`: 'flags' groups runs whose flags.json agree on everything but the seed and paths, 'parent' groups
    runs sharing a parent directory, 'auto' uses flags.json where present and the parent otherwise. A step is
    aggregated over the runs that reached it, so a run that stopped early still contributes its rows.
    """
    groups = OrderedDict()
    for run_dir in run_dirs:
        columns = read_csv(os.path.join(run_dir, 'eval.csv'))
        values = _metric_column(columns, metric)
        if values is None or 'step' not in columns:
            continue
        key, label, kept = _group_of(run_dir, group_by)
        steps = columns['step']
        keep = ~np.isnan(values) & ~np.isnan(steps)
        groups.setdefault(key, (label, [], kept))[1].append(dict(zip(steps[keep].tolist(), values[keep].tolist())))
    labels = _distinguishing_labels(list(groups.values()))
    curves = []
    for label, (_, runs, _) in zip(labels, groups.values()):
        steps = np.array(sorted(set().union(*runs)), dtype=np.float64)
        stacked = np.array([[run.get(s, np.nan) for s in steps] for run in runs])
        curves.append(
            dict(
                label=label,
                steps=steps,
                mean=np.nanmean(stacked, axis=0),
                std=np.nanstd(stacked, axis=0),
                min=np.nanmin(stacked, axis=0),
                max=np.nanmax(stacked, axis=0),
                num_runs=len(runs),
            )
        )
    return curves


def plot_runs(run_dirs, out_path, metrics=('success', 'return'), group_by='auto', band='std'):
    """Plots eval curves of `run_dirs` into a PNG, one subplot per metric; returns `out_path`.

    Runs that differ only by seed form one group (see `aggregate_curves` for `group_by`); each group is drawn as its
    mean over runs with a std (or `band='minmax'`) band.
    """
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    run_dirs = find_run_dirs(run_dirs)
    if not run_dirs:
        raise FileNotFoundError('no eval.csv found in the given run directories')
    metrics = list(metrics)
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        curves = aggregate_curves(run_dirs, metric, group_by=group_by)
        for curve in curves:
            label = f'{curve["label"]} (n={curve["num_runs"]})'
            line = ax.plot(curve['steps'], curve['mean'], label=label)[0]
            if band == 'minmax':
                low, high = curve['min'], curve['max']
            else:
                low, high = curve['mean'] - curve['std'], curve['mean'] + curve['std']
            ax.fill_between(curve['steps'], low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        if not curves:
            ax.text(0.5, 0.5, f'no {metric} column', ha='center', va='center', transform=ax.transAxes)
        else:
            ax.legend(fontsize='small')
        ax.set_xlabel('step')
        ax.set_ylabel(metric)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m log_utils', description='Run log utilities.')
    sub = parser.add_subparsers(dest='command', required=True)
    plot = sub.add_parser('plot', help='plot eval curves (mean and band over seeds) of run directories')
    plot.add_argument('run_dirs', nargs='+', help='run directories, or directories searched for eval.csv')
    plot.add_argument('--out', default='curves.png', help='output PNG path')
    plot.add_argument('--metrics', nargs='+', default=['success', 'return'], help='eval.csv columns to plot')
    plot.add_argument(
        '--group-by',
        choices=('auto', 'flags', 'parent'),
        default='auto',
        help='average runs whose flags.json match up to seed and paths (auto: falls back to the parent directory)',
    )
    plot.add_argument('--band', choices=('std', 'minmax'), default='std', help='shaded band around the mean')
    args = parser.parse_args(argv)
    try:
        out = plot_runs(args.run_dirs, args.out, metrics=args.metrics, group_by=args.group_by, band=args.band)
    except FileNotFoundError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
