"""The paper's nine methods as driver + flags presets, and the per-domain settings the paper adds.

Source of every setting: the "Reproducing paper results" commands of the reference repository's README
(github.com/ColinQiyangLi/qc), which lists one command per method of the paper; the same table is in this
repository's README. Agent defaults not named here (networks, learning rates, batch size, discount) are the
`get_config()` defaults of `agents/acfql.py` and `agents/acrlpd.py`, which follow the reference's.
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
        # distill-ddpg methods; it is also the agent's default.
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


def domain_flags(env_name):
    """Flags the paper sets for the domain of `env_name` (on top of the method's)."""
    name = env_name.removeprefix('visual-')
    if any(name.startswith(domain + '-') for domain in SPARSE_DOMAINS):
        return {'sparse': True}
    return {}
