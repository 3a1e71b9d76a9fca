"""The settings the paper adds per domain (its appendix, "Experiment Details"), by method: the tables "Behavior
regularization coefficient (alpha)" for QC-FQL, FQL-n and FQL and "Number of actions sampled for the expected-max Q
operator (N)" for QC, BFN-n and BFN, and sparse rewards on scene and puzzle-3x3. `sweeps/presets.py` applies them
to its method presets; a driver run on a paper task that differs from them says so (`notes`).
"""

from agents import agent_module

# Domains whose rewards the paper sparsifies (-1 until success, then 0); the reference README: "For `scene` and
# `puzzle-3x3` domains, use `--sparse=True`".
SPARSE_DOMAINS = ('scene', 'puzzle-3x3')

# Per-domain values of the appendix tables, by method and flag. Domains are name prefixes (OGBench) or RoboMimic
# task names; `cube-quadruple` is the paper's cube-quadruple-100M (pass the shards with --ogbench_dataset_dir).
DOMAINS = ('scene', 'puzzle-3x3', 'cube-double', 'cube-triple', 'cube-quadruple', 'lift', 'can', 'square')
PAPER_SETTINGS = {
    ('QC-FQL', 'agent.alpha'): (300.0, 300.0, 300.0, 100.0, 100.0, 10000.0, 10000.0, 10000.0),
    ('FQL-n', 'agent.alpha'): (100.0, 100.0, 100.0, 100.0, 100.0, 10000.0, 10000.0, 10000.0),
    ('FQL', 'agent.alpha'): (300.0, 100.0, 300.0, 300.0, 300.0, 10000.0, 10000.0, 10000.0),
    ('QC', 'agent.actor_num_samples'): (32, 64, 32, 32, 32, 16, 16, 16),
    ('BFN-n', 'agent.actor_num_samples'): (4,) * 8,
    ('BFN', 'agent.actor_num_samples'): (4,) * 8,
}


def paper_domain(env_name):
    """The paper's domain of `env_name` (one of `DOMAINS`), or None for environments the paper does not use."""
    name = env_name.removeprefix('visual-')
    for domain in DOMAINS:
        if name.startswith(domain + '-'):
            return domain
    return None


def domain_flags(method, env_name):
    """Flags the paper sets for `method` (a preset name) on the domain of `env_name`, on top of the method's."""
    domain = paper_domain(env_name)
    if domain is None:
        return {}
    flags = {'sparse': True} if domain in SPARSE_DOMAINS else {}
    for (name, flag), values in PAPER_SETTINGS.items():
        if name == method:
            flags[flag] = values[DOMAINS.index(domain)]
    return flags


def method_of(config):
    """The paper's method name of an agent config (`QC`, `QC-FQL`, `BFN-n`, ...; `RLPD`, `RLPD-AC`, `QC-RLPD`; `QAM`,
    `QAM-F`, `QAM-E`): each agent file names its own variants (`paper_method(config)`)."""
    module = agent_module(config)
    return module.paper_method(config) if module is not None else None


def notes(env_name, sparse, config):
    """One line per setting of a run (`sparse` and its agent config) that differs from what the paper uses for its
    method on the domain of `env_name`; none off the paper's domains."""
    domain = paper_domain(env_name)
    if domain is None:
        return []
    method = method_of(config)
    lines = []
    for flag, value in domain_flags(method, env_name).items():
        ours = sparse if flag == 'sparse' else config.get(flag.removeprefix('agent.'))
        if ours != value:
            lines.append(f'note: the paper runs {method} on {domain} with --{flag}={value} (this run: {ours}); '
                         'training on')  # fmt: skip
    return lines
