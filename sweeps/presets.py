"""Both papers' methods as driver + flags presets, one table per protocol (`PROTOCOLS`).

QC paper (`qc`, the default): each method's flags are the "Reproducing paper results" command of the reference
repository's README (github.com/ColinQiyangLi/qc), written there for cube-triple; a sweep adds what the paper's
appendix sets per domain (`training.paper_settings.domain_flags`: alpha, N, sparse rewards). Agent defaults not
named here (networks, learning rates, batch size, discount, ensemble sizes) are the `get_config()` defaults of
`agents/acfql.py` and `agents/acrlpd.py`, which equal the reference's and the appendix's "Common hyperparameters"
table.

QAM paper (`qam`): the methods of its `experiments/reproduce.py` and `reproduce_rlpd.py` (github
ColinQiyangLi/qam) that this project has, with its protocol (1M offline + 500K online steps, an evaluation every 50K;
RLPD 500K online steps); a sweep adds the protocol's per-domain settings and each method's per-domain values
(`training.paper_settings.QAM_SETTINGS`). Every run of a QAM preset passes `--protocol=qam`.
"""

import dataclasses

from training.paper_settings import QAM_METHOD_FLAGS


@dataclasses.dataclass(frozen=True)
class Method:
    """A method of a paper: the driver that runs it and the flags that select it."""

    name: str
    driver: str  # 'main.py' (offline-to-online) or 'main_online.py' (online with prior data).
    flags: dict
    summary: str
    protocol: str = 'qc'  # The paper whose protocol and published curves the method's runs follow.


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

# The QAM protocol's lengths, and what its scripts pass to every method (networks and batch are the agents'
# defaults: 4x512, 256).
QAM_STEPS = {'offline_steps': 1_000_000, 'online_steps': 500_000, 'eval_interval': 50_000, 'protocol': 'qam'}
QAM_METHODS = {
    m.name: m
    for m in (
        Method('QAM', 'main.py', {'agent': 'agents/qam.py', **QAM_STEPS},
               'flow policy fine-tuned by adjoint matching toward pi_beta exp(inv_temp Q)', 'qam'),
        Method('QAM-F', 'main.py', {'agent': 'agents/qam.py', **QAM_STEPS},
               "QAM plus a one-step policy distilled from QAM's flow while maximising Q (fql_alpha)", 'qam'),
        Method('QAM-E', 'main.py', {'agent': 'agents/qam.py', **QAM_STEPS},
               'QAM plus a TanhNormal edit of its actions maximising Q (edit_scale)', 'qam'),
        Method('FEdit', 'main.py', {'agent': 'agents/fedit.py', **QAM_STEPS},
               'BC flow chunks refined by an edit policy that maximises Q (EXPO)', 'qam'),
        Method('QSM', 'main.py', {'agent': 'agents/dcgql.py', **QAM_METHOD_FLAGS['QSM'], **QAM_STEPS},
               "a diffusion policy whose noise prediction matches the critic's action gradient (Q-score matching)",
               'qam'),
        Method('DAC', 'main.py', {'agent': 'agents/dcgql.py', **QAM_METHOD_FLAGS['DAC'], **QAM_STEPS},
               "a diffusion policy pushed along the critic's action gradient (diffusion actor-critic)", 'qam'),
        Method('ReBRAC', 'main.py', {'agent': 'agents/rebrac.py', **QAM_STEPS},
               'TD3+BC with layer norm and separate actor and critic penalties', 'qam'),
        Method('DSRL', 'main.py', {'agent': 'agents/dsrl.py', **QAM_STEPS},
               "SAC in a BC flow's noise space, on a critic distilled into that space", 'qam'),
        Method('CGQL', 'main.py', {'agent': 'agents/cgql.py', **QAM_METHOD_FLAGS['CGQL'], **QAM_STEPS},
               "a BC flow guided by the critic's action gradient at t = 1 (classifier guidance)", 'qam'),
        Method('CGQL-M', 'main.py', {'agent': 'agents/cgql.py', **QAM_METHOD_FLAGS['CGQL-M'], **QAM_STEPS},
               'CGQL with a time-conditioned critic distilled by squared error', 'qam'),
        Method('CGQL-L', 'main.py', {'agent': 'agents/cgql.py', **QAM_METHOD_FLAGS['CGQL-L'], **QAM_STEPS},
               'CGQL with a time-conditioned critic distilled by the linex loss', 'qam'),
        Method('FBRAC', 'main.py', {'agent': 'agents/fbrac.py', **QAM_STEPS},
               'a BC flow that maximises Q by backpropagation through its steps (-Q / alpha)', 'qam'),
        Method('IFQL', 'main.py', {'agent': 'agents/ifql.py', **QAM_STEPS},
               'expectile value, in-sample critic and a BC flow with best-of-N acting (the flow IDQL)', 'qam'),
        Method('BAM', 'main.py', {'agent': 'agents/bam.py', **QAM_STEPS},
               "QAM's fine-tuned flow trained by backpropagation through its memoryless SDE (basic adjoint matching)",
               'qam'),
        Method('FAWAC', 'main.py', {'agent': 'agents/fawac.py', **QAM_STEPS},
               'a BC flow whose flow-matching loss is weighted by exp(inv_temp * advantage) (AWAC)', 'qam'),
        # Their agents/fql.py: this project's ACFQL with their 10-critic pessimistic target and BC mask.
        Method('FQL', 'main.py', {'agent.actor_type': 'distill-ddpg', **QAM_METHOD_FLAGS['FQL'], **QAM_STEPS},
               'chunked FQL with 10 critics and the pessimistic target', 'qam'),
        # Their agents/rlpd.py (on their GELU networks) run by their main.py with --offline_steps=0
        # --balanced_sampling: main_online.py here.
        Method('RLPD', 'main_online.py',
               {'agent': 'agents/acrlpd.py', **QAM_METHOD_FLAGS['RLPD'], 'online_steps': 500_000,
                'eval_interval': 50_000, 'protocol': 'qam'},
               'chunked RLPD with 10 critics, the pessimistic target and a BC term (bc_alpha)', 'qam'),
    )
}  # fmt: skip

PROTOCOLS = {'qc': METHODS, 'qam': QAM_METHODS}  # The methods of each paper, by protocol.
