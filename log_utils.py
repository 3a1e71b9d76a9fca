"""Run bookkeeping: CSV metric logs, optional wandb, flags and videos.

Everything here works without wandb or imageio installed; those packages only add features when present.
Learning-curve plots live in `analysis/plotting.py`; `python -m log_utils plot RUN_DIR ... --out curves.png` runs them.
"""

import csv
import json
import logging
import netrc
import os
import re
import secrets
import sys
import time
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


def jsonable(value):
    """`value` with config dicts, tuples, sets and NumPy values turned into what JSON holds (anything else: its
    `str`)."""
    if hasattr(value, 'to_dict') and callable(value.to_dict):  # ml_collections ConfigDict / FrozenConfigDict
        value = value.to_dict()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
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
        result[name] = jsonable(flag_values[name].value)
    return result


def save_flags(run_dir, flag_dict, filename='flags.json'):
    """Writes `flag_dict` to `run_dir/flags.json` atomically; returns the path."""
    path = os.path.join(run_dir, filename)
    atomic_write(path, lambda f: json.dump(jsonable(flag_dict), f, indent=2, sort_keys=True))
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
    several=False,
):
    """Starts a wandb run without ever prompting; returns the run, or None when wandb is disabled or unavailable.

    The mode is chosen by `resolve_wandb_mode`. An online start that fails (e.g. no network within `init_timeout`
    seconds) is retried offline; if that fails too, logging continues with CSV only. With `run_id` (a resumed
    run) the same wandb run is continued. With `several`, more runs of this process may be open at once (one per
    seed of a multi-seed run).
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
        project=project, group=group, name=name, config=jsonable(config or {}), dir=dir, entity=entity, tags=tags
    )
    if run_id is not None:
        kwargs.update(id=run_id, resume='allow')
    if several:
        kwargs.update(reinit='create_new')
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


MP4_BLOCK = 16  # H.264 encoders and players want frame sides that are multiples of 16.


def pad_to_multiple(frames, block):
    """(T, H, W, C) frames padded with black at the bottom and right to sides that are multiples of `block`
    (instead of ffmpeg's resize, which blurs and warns)."""
    pad_h, pad_w = (-frames.shape[1]) % block, (-frames.shape[2]) % block
    if not pad_h and not pad_w:
        return frames
    return np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))


def save_video(frames, path, fps=15):
    """Writes frames (T, H, W, C) uint8 to `path` (.mp4 or .gif) and returns the path actually written.

    mp4 (H.264, through imageio-ffmpeg's own ffmpeg; frames padded to multiples of 16 pixels) falls back to a .gif
    next to it when no ffmpeg backend is installed, and without imageio the frames are kept as a .npz (keys
    `frames`, `fps`).
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
                iio.imwrite(path, pad_to_multiple(frames, MP4_BLOCK) if ext == '.mp4' else frames, fps=fps)
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


if __name__ == '__main__':
    from analysis.plotting import main

    sys.exit(main())
