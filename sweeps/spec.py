"""A SPEC file (methods x environments x seeds plus flag overrides) turned into runs and processes, validated.

A SPEC is YAML (`.yaml`/`.yml`), JSON, or a Python file that defines a dict named `SPEC`, with the keys:

    protocol: qc                   # whose presets and published curves: qc (default) or qam
    methods: [QC, QC-FQL]          # presets of sweeps/presets.py, or {name: QC-N8, preset: QC, flags: {...}}
    envs: [cube-triple-play-singletask-task2-v0]
    seeds: [0, 1, 2]               # or a count: 3 means seeds 0, 1, 2
    flags: {eval_episodes: 50}     # driver flags for every run (agent keys as agent.<key>)
    driver_flags:                  # flags for the runs of one driver only
      main.py: {offline_steps: 500000}
    seeds_per_process: 1           # > 1: that many seeds share one `--seeds` process

A method name is a preset of the SPEC's protocol; `qam:FQL` (or `qc:FQL`) names the paper itself. All the methods of a
SPEC follow one protocol: a SPEC that mixes them (`protocol: qc` with `qam:QAM`, or `QC` with `qam:QAM`) is refused.
The sweep owns `--seed(s)`, `--exp_name`, `--save_dir`, `--run_group` and `--resume`; a SPEC that sets them is
refused. Every run's name is deterministic (method, environment, a hash of its flags, seed), so a SPEC launched
again finds its runs.
"""

import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import re
import runpy
import sys

from sweeps.presets import PROTOCOLS
from training.paper_settings import domain_flags
from utils.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC_KEYS = ('protocol', 'methods', 'envs', 'seeds', 'flags', 'driver_flags', 'seeds_per_process')
DRIVERS = ('main.py', 'main_online.py')
OWNED_FLAGS = ('seed', 'seeds', 'exp_name', 'save_dir', 'run_group', 'resume')
RUNS_DIR = 'runs'  # Run directories live in <sweep dir>/runs/<run name>.


class SpecError(UserError):
    """A SPEC the sweep cannot run (one line naming the problem)."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run: a method on an environment with one seed, in `<sweep dir>/runs/<name>`."""

    name: str
    method: str
    env: str
    seed: int
    driver: str
    flags: dict  # Every flag the sweep passes besides the ones it owns (method, domain and SPEC flags).
    protocol: str = 'qc'  # The paper whose protocol the run follows (`analysis.paper.PROTOCOLS`).


@dataclasses.dataclass(frozen=True)
class Unit:
    """One driver process: one run, or several seeds of one setting trained together with `--seeds`."""

    name: str
    runs: tuple

    def argv(self, sweep_dir):
        """The driver command line (interpreter first), always with `--resume`: a new run starts from scratch,
        an interrupted one continues from its newest checkpoint."""
        first = self.runs[0]
        args = [sys.executable, os.path.join(ROOT, first.driver)]
        # The agent config file first: ml_collections reads --agent.* overrides against it.
        ordered = sorted(first.flags.items(), key=lambda item: item[0] != 'agent')
        args += [f'--{key}={format_value(value)}' for key, value in ordered]
        args += [f'--save_dir={os.path.abspath(sweep_dir)}', f'--run_group={RUNS_DIR}', '--resume']
        if len(self.runs) == 1:
            args += [f'--seed={first.seed}', f'--exp_name={first.name}']
        else:
            args += [f'--seeds={",".join(str(r.seed) for r in self.runs)}', f'--exp_name={base_name(first)}']
        return args


def format_value(value):
    """A flag value as absl and ml_collections parse it (sequences as tuples: `(256,256)`)."""
    if isinstance(value, (list, tuple)):
        return '(' + ','.join(format_value(v) for v in value) + ('', ',')[len(value) == 1] + ')'
    return str(value)


def flags_hash(flags):
    """Short hash of a run's flags: runs that differ in any flag get different names."""
    text = json.dumps({k: format_value(v) for k, v in flags.items()}, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _safe(part):
    return re.sub(r'[^A-Za-z0-9._-]+', '+', part)


def base_name(run):
    """`<method>.<env>.<flags hash>`: the name every seed of one setting shares."""
    return f'{_safe(run.method)}.{_safe(run.env)}.{flags_hash(run.flags)}'


def load_spec(path):
    """The SPEC dict of a YAML, JSON or Python file."""
    if not os.path.isfile(path):
        raise SpecError(f'SPEC {path} does not exist')
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext == '.py':
            spec = runpy.run_path(path).get('SPEC')
        elif ext in ('.yaml', '.yml'):
            import yaml

            with open(path) as f:
                spec = yaml.safe_load(f)
        elif ext == '.json':
            with open(path) as f:
                spec = json.load(f)
        else:
            raise SpecError(f'SPEC {path}: unknown file type {ext!r}; use .yaml, .yml, .json or .py')
    except SpecError:
        raise
    except Exception as e:
        raise SpecError(f'SPEC {path} cannot be read: {type(e).__name__}: {str(e).splitlines()[0]}') from e
    if not isinstance(spec, dict):
        raise SpecError(f'SPEC {path} must define a mapping (a Python SPEC file defines a dict named SPEC)')
    return spec


def split_method(name):
    """(protocol or None, preset name) of a method name: `qam:FQL` -> ('qam', 'FQL'), `QC` -> (None, 'QC')."""
    head, sep, tail = str(name).partition(':')
    return (head, tail) if sep and head in PROTOCOLS else (None, str(name))


def _protocol(spec, entries, where):
    """The one protocol of a SPEC: its `protocol` key, the prefix of its prefixed method names, else 'qc'; a SPEC
    whose key and prefixes name different papers is refused."""
    given = spec.get('protocol')
    if given is not None and given not in PROTOCOLS:
        raise SpecError(f'{where}: protocol must be one of {", ".join(PROTOCOLS)}; got {given!r}')
    named = {split_method(preset)[0] for _, preset in entries} - {None}
    chosen = {given} if given is not None else named
    if len(named | chosen) > 1:
        papers = ' and '.join(sorted(named | chosen))
        listed = ', '.join(p for _, p in entries)
        raise SpecError(f'{where}: a SPEC follows one paper\'s protocol, and this one mixes {papers} (protocol: '
                        f'{given}, methods: {listed}); make one sweep per protocol')  # fmt: skip
    return next(iter(chosen), 'qc')


def _methods(spec, where):
    """(protocol, [(name, Method preset, extra flags)] per entry of `methods`)."""
    entries = []
    for entry in spec.get('methods') or ():
        if isinstance(entry, str):
            entry = {'name': split_method(entry)[1], 'preset': entry}
        if not isinstance(entry, dict) or 'name' not in entry:
            raise SpecError(f'{where}: a method is a preset name or a mapping (name, preset, flags); got {entry!r}')
        unknown = set(entry) - {'name', 'preset', 'flags'}
        if unknown:
            raise SpecError(f'{where}: method {entry["name"]!r} has unknown keys {sorted(unknown)}')
        entries.append((entry, entry.get('preset', entry['name'])))
    protocol = _protocol(spec, entries, where)
    known = PROTOCOLS[protocol]
    out = []
    for entry, preset in entries:
        name = split_method(preset)[1]
        if name not in known:
            other = [p for p, methods in PROTOCOLS.items() if name in methods and p != protocol]
            hint = f' (a method of the {other[0]} protocol: write {other[0]}:{name})' if other else ''
            raise SpecError(f'{where}: unknown method preset {name!r} of the {protocol} protocol{hint}; known: '
                            f'{", ".join(known)}')
        out.append((entry['name'], known[name], dict(entry.get('flags') or {})))
    return protocol, out


def _seeds(spec, where):
    seeds = spec.get('seeds')
    if isinstance(seeds, bool) or seeds is None:
        return []
    if isinstance(seeds, int):
        return list(range(seeds))
    if not isinstance(seeds, (list, tuple)) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise SpecError(f'{where}: seeds must be a list of integers or a count; got {seeds!r}')
    if len(set(seeds)) != len(seeds):
        raise SpecError(f'{where}: seeds {seeds} repeat a seed')
    return list(seeds)


def expand(spec, where='SPEC'):
    """(runs, seeds_per_process) of a SPEC dict: every method x environment x seed; refuses bad keys, owned
    flags and an empty grid with one line."""
    unknown = set(spec) - set(SPEC_KEYS)
    if unknown:
        raise SpecError(f'{where}: unknown keys {sorted(unknown)}; a SPEC has {", ".join(SPEC_KEYS)}')
    protocol, methods = _methods(spec, where)
    envs = spec.get('envs') or []
    if isinstance(envs, str):
        envs = [envs]
    seeds = _seeds(spec, where)
    for key, values in (('methods', methods), ('envs', envs), ('seeds', seeds)):
        if not values:
            raise SpecError(f'{where}: empty grid: no {key} given')
    common = dict(spec.get('flags') or {})
    per_driver = dict(spec.get('driver_flags') or {})
    unknown = set(per_driver) - set(DRIVERS)
    if unknown:
        raise SpecError(f'{where}: driver_flags names unknown drivers {sorted(unknown)}; drivers: {", ".join(DRIVERS)}')
    for flags in [common, *per_driver.values()] + [extra for _, _, extra in methods]:
        owned = [k for k in flags if k.lstrip('-') in OWNED_FLAGS]
        if owned:
            raise SpecError(f'{where}: --{owned[0]} is set by the sweep itself (seeds come from `seeds`)')
    per_process = spec.get('seeds_per_process', 1)
    if not isinstance(per_process, int) or per_process < 1:
        raise SpecError(f'{where}: seeds_per_process must be a positive integer; got {per_process!r}')
    runs = []
    for name, method, extra in methods:
        for env in envs:
            # Later sources win: the method's preset, the paper's domain setting, the SPEC, the method entry.
            driver = dict(per_driver.get(method.driver) or {})
            paper = domain_flags(method.name, env, protocol)
            flags = {'env_name': env, **method.flags, **paper, **common, **driver, **extra}
            for seed in seeds:
                run = Run(name='', method=name, env=env, seed=seed, driver=method.driver, flags=flags,
                          protocol=protocol)  # fmt: skip
                runs.append(dataclasses.replace(run, name=f'{base_name(run)}_sd{seed}'))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise SpecError(f'{where}: two methods share a name; give each method entry its own name')
    return runs, per_process


def group_units(runs, seeds_per_process):
    """Processes of `runs`: consecutive seeds of one setting, `seeds_per_process` at a time."""
    units = []
    by_setting = {}
    for run in runs:
        by_setting.setdefault(base_name(run), []).append(run)
    for base, members in by_setting.items():
        for i in range(0, len(members), seeds_per_process):
            chunk = tuple(members[i : i + seeds_per_process])
            name = chunk[0].name if len(chunk) == 1 else f'{base}_seeds{"-".join(str(r.seed) for r in chunk)}'
            units.append(Unit(name, chunk))
    return units


@contextlib.contextmanager
def _in_repo_root():
    """The drivers' relative defaults (`--agent=agents/acfql.py`) resolve against the repository root."""
    previous = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(previous)


def check_unit(unit, sweep_dir):
    """Parses the unit's command line as its driver would (flags, agent keys, values, environment name), without
    loading data; raises `SpecError` naming the run and the problem."""
    from unittest import mock

    from absl import flags as absl_flags

    from envs.env_utils import get_env_family
    from training import define_flags, from_flags

    first = unit.runs[0]
    try:
        get_env_family(first.env)
    except UserError as e:
        raise SpecError(f'{first.method} on {first.env}: {e}') from e
    preset = importlib.import_module(os.path.splitext(first.driver)[0]).PRESET
    argv = ['prog', *unit.argv(sweep_dir)[2:]]
    values = absl_flags.FlagValues()
    try:
        # ml_collections reads `--agent.*` overrides from sys.argv, as in the drivers.
        with _in_repo_root(), mock.patch.object(sys, 'argv', argv):
            define_flags(preset, values)
            values(argv)
            from_flags(values, preset)
    except (absl_flags.Error, UserError, KeyError, ValueError, TypeError, AttributeError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecError(f'{first.method} on {first.env} ({first.driver}): {message}') from e


def check_units(units, sweep_dir):
    """`check_unit` for every distinct setting (seeds of one setting parse alike)."""
    seen = set()
    for unit in units:
        key = (base_name(unit.runs[0]), len(unit.runs) > 1)
        if key not in seen:
            seen.add(key)
            check_unit(unit, sweep_dir)
