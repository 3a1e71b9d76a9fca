"""The paper's nine methods as driver + flags presets, and the per-domain settings the paper adds.

Sources: each method's flags are the "Reproducing paper results" command of the reference repository's README
(github.com/ColinQiyangLi/qc), written there for cube-triple; `domain_flags` adds what the paper's appendix sets per
domain ("Experiment Details"): the tables "Behavior regularization coefficient (alpha)" for QC-FQL, FQL-n and FQL
and "Number of actions sampled for the expected-max Q operator (N)" for QC, BFN-n and BFN, and sparse rewards on
scene and puzzle-3x3. Agent defaults not named here (networks, learning rates, batch size, discount, ensemble sizes)
are the `get_config()` defaults of `agents/acfql.py` and `agents/acrlpd.py`, which equal the reference's and the
appendix's "Common hyperparameters" table.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Method:
    """A method of the paper: the driver that runs it and the flags that select it."""

    name: str
    driver: str  # 'main.py' (offline-to-online) or 'main_online.py' (online with prior data).
    flags: dict
    summary: str


METHODS = {
    m.name: m
    for m in (
        # Offline-to-online methods (main.py, ACFQL agent). The reference README passes --agent.alpha=100 to the
        # distill-ddpg methods (the agent's default); on the paper's domains `domain_flags` replaces alpha and N.
        Method('QC', 'main.py', {'horizon_length': 5, 'agent.actor_type': 'best-of-n', 'agent.actor_num_samples': 32},
               'chunked critic, best-of-32 samples of the flow BC policy'),
        Method('BFN-n', 'main.py',
               {'horizon_length': 5, 'agent.actor_type': 'best-of-n', 'agent.actor_num_samples': 4,
                'agent.action_chunking': False},
               'best-of-4 on single actions, 5-step returns'),
        Method('BFN', 'main.py', {'horizon_length': 1, 'agent.actor_type': 'best-of-n', 'agent.actor_num_samples': 4},
               'best-of-4 on single actions, 1-step returns'),
        Method('QC-FQL', 'main.py', {'horizon_length': 5, 'agent.actor_type': 'distill-ddpg', 'agent.alpha': 100.0},
               'chunked critic, one-step policy distilled from the flow'),
        Method('FQL-n', 'main.py',
               {'horizon_length': 5, 'agent.actor_type': 'distill-ddpg', 'agent.alpha': 100.0,
                'agent.action_chunking': False},
               'FQL on single actions, 5-step returns'),
        Method('FQL', 'main.py', {'horizon_length': 1, 'agent.actor_type': 'distill-ddpg', 'agent.alpha': 100.0},
               'FQL, 1-step returns'),
        # Online methods with prior data (main_online.py, ACRLPD agent; batches half dataset, half replay).
        Method('RLPD', 'main_online.py', {'horizon_length': 1}, 'RLPD on single actions'),
        Method('RLPD-AC', 'main_online.py', {'horizon_length': 5}, 'RLPD on action chunks'),
        Method('QC-RLPD', 'main_online.py', {'horizon_length': 5, 'agent.bc_alpha': 0.01},
               'RLPD on action chunks with a BC term'),
    )
}  # fmt: skip

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
