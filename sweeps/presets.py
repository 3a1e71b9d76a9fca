"""The paper's nine methods as driver + flags presets.

Sources: each method's flags are the "Reproducing paper results" command of the reference repository's README
(github.com/ColinQiyangLi/qc), written there for cube-triple; a sweep adds what the paper's appendix sets per
domain (`training.paper_settings.domain_flags`: alpha, N, sparse rewards). Agent defaults not named here
(networks, learning rates, batch size, discount, ensemble sizes) are the `get_config()` defaults of
`agents/acfql.py` and `agents/acrlpd.py`, which equal the reference's and the appendix's "Common hyperparameters"
table.
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
