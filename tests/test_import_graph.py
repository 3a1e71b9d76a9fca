"""The project's import graph, read with `ast`: no circle between modules, `utils/` stays foundation code, and
`analysis/` (run files, curves, plots, the published curves) stays below the run layer and `log_utils.py`."""

import ast
import os

from helpers import ROOT

SKIP_DIRS = {'.git', '.library', '__pycache__', 'exp', 'wandb', '.venv', 'venv'}
UPWARD_FROM_UTILS = ('envs', 'evaluation', 'log_utils', 'training', 'main', 'main_online', 'agents', 'sweep', 'sweeps')
UPWARD_FROM_ANALYSIS = UPWARD_FROM_UTILS  # analysis/ sits just above utils/: the same modules are above it
UPWARD_FROM_LOG_UTILS = ('training', 'sweeps')


def project_modules():
    """{module name: path} of every project Python file."""
    modules = {}
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith('.')]
        for name in filenames:
            if name.endswith('.py'):
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT)[: -len('.py')]
                module = rel.replace(os.sep, '.')
                modules[module[: -len('.__init__')] if module.endswith('.__init__') else module] = rel + '.py'
    return modules


def imports_of(path, modules):
    """Project modules imported anywhere in `path` (function-level imports count too)."""
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read(), filename=path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f'{node.module}.{alias.name}' for alias in node.names]
        else:
            continue
        for name in names:
            # The longest project module that `name` is or lies in.
            parts = name.split('.')
            for k in range(len(parts), 0, -1):
                candidate = '.'.join(parts[:k])
                if candidate in modules:
                    found.add(candidate)
                    break
    return found


def import_graph():
    modules = project_modules()
    graph = {m: imports_of(p, modules) - {m} for m, p in modules.items()}
    # A package's `__init__` importing its own submodules is not a circle through the package.
    for m in graph:
        graph[m] = {d for d in graph[m] if not (d.startswith(m + '.') and modules[m].endswith('__init__.py'))}
    return graph


def find_cycle(graph):
    """One import circle as a list of modules, or None."""
    state = {}
    stack = []

    def visit(m):
        state[m] = 'open'
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 'open':
                return stack[stack.index(d) :] + [d]
            if d not in state:
                cycle = visit(d)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = 'done'
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_import_graph_has_no_circle():
    graph = import_graph()
    assert 'training.trainer' in graph and 'envs.env_utils' in graph  # the walk found the project
    assert find_cycle(graph) is None, ' -> '.join(find_cycle(graph))


def upward_imports(graph, package, upward):
    """'module imports dependency' for every module of `package` (itself or below) importing a module of `upward`."""
    offenders = []
    for module, deps in graph.items():
        if module == package or module.startswith(package + '.'):
            offenders += [f'{module} imports {d}' for d in sorted(deps) if d.split('.')[0] in upward]
    return offenders


def test_utils_imports_only_foundation_modules():
    offenders = upward_imports(import_graph(), 'utils', UPWARD_FROM_UTILS)
    assert not offenders, offenders


def test_analysis_and_log_utils_sit_below_the_run_layer():
    graph = import_graph()
    assert {'analysis.run_files', 'analysis.plotting', 'analysis.paper', 'log_utils'} <= set(graph)
    offenders = upward_imports(graph, 'analysis', UPWARD_FROM_ANALYSIS)
    offenders += upward_imports(graph, 'log_utils', UPWARD_FROM_LOG_UTILS)
    assert not offenders, offenders
    assert 'analysis.plotting' in graph['log_utils']  # the `python -m log_utils plot` entry point


def test_cycle_finder_sees_a_circle():
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': set()}) is None


def test_only_envs_tells_worker_environments_from_local_ones():
    # Local and worker environments are stepped through the same calls (`envs.workers.steps_async`, `step_async`);
    # nothing outside `envs/` names the worker's handle class.
    modules = project_modules()
    users = []
    for module, path in modules.items():
        if module.split('.')[0] in ('envs', 'tests'):
            continue
        with open(os.path.join(ROOT, path)) as f:
            tree = ast.parse(f.read(), filename=path)
        names = {getattr(n, 'id', None) or getattr(n, 'attr', None) or getattr(n, 'name', None) for n in ast.walk(tree)}
        if 'RemoteEnv' in names:
            users.append(module)
    assert modules and not users, users
