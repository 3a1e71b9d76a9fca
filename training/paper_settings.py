"""The settings each paper adds per domain, by method, under its protocol (`qc` or `qam`, as `analysis.paper`).

- `qc` ("Reinforcement Learning with Action Chunking"): its appendix, "Experiment Details": the tables "Behavior
  regularization coefficient (alpha)" for QC-FQL, FQL-n and FQL and "Number of actions sampled for the expected-max
  Q operator (N)" for QC, BFN-n and BFN, and sparse rewards on scene and puzzle-3x3.
- `qam` ("Q-learning with Adjoint Matching"): the authors' `experiments/reproduce.py` and `reproduce_rlpd.py`
  (github ColinQiyangLi/qam): for every method 10 critics with the target `mean - rho * std` (rho 0.5; 0 on
  humanoidmaze), chunks of 5 on the manipulation domains and single actions on the mazes, discount 0.995 on the
  giant and humanoid mazes, sparse rewards on scene and puzzle; and per method and domain the values below.

`sweeps/presets.py` applies them to its method presets; a driver run on a paper task that differs from them says so
(`notes`).
"""

from agents import agent_module
from analysis import paper

PROTOCOL_NAMES = tuple(paper.PROTOCOLS)

# Domains whose rewards each paper sparsifies (-1 until success, then 0); the QC reference README: "For `scene` and
# `puzzle-3x3` domains, use `--sparse=True`"; the QAM scripts run `scene-play-sparse`, `puzzle-*-play-sparse`.
SPARSE_DOMAINS = ('scene', 'puzzle-3x3')
QAM_SPARSE_DOMAINS = ('scene', 'puzzle-3x3', 'puzzle-4x4')

# The QC paper's per-domain values, by method and flag. Domains are name prefixes (OGBench) or RoboMimic task names;
# `cube-quadruple` is the paper's cube-quadruple-100M (pass the shards with --ogbench_dataset_dir).
DOMAINS = ('scene', 'puzzle-3x3', 'cube-double', 'cube-triple', 'cube-quadruple', 'lift', 'can', 'square')
PAPER_SETTINGS = {
    ('QC-FQL', 'agent.alpha'): (300.0, 300.0, 300.0, 100.0, 100.0, 10000.0, 10000.0, 10000.0),
    ('FQL-n', 'agent.alpha'): (100.0, 100.0, 100.0, 100.0, 100.0, 10000.0, 10000.0, 10000.0),
    ('FQL', 'agent.alpha'): (300.0, 100.0, 300.0, 300.0, 300.0, 10000.0, 10000.0, 10000.0),
    ('QC', 'agent.actor_num_samples'): (32, 64, 32, 32, 32, 16, 16, 16),
    ('BFN-n', 'agent.actor_num_samples'): (4,) * 8,
    ('BFN', 'agent.actor_num_samples'): (4,) * 8,
}

# The QAM paper's 10 domains; cube-quadruple and puzzle-4x4 are its 100M-transition datasets (pass the shards with
# --ogbench_dataset_dir), the mazes OGBench's `navigate` datasets.
QAM_DOMAINS = ('puzzle-3x3', 'scene', 'cube-double', 'antmaze-large', 'humanoidmaze-medium', 'cube-triple',
               'cube-quadruple', 'puzzle-4x4', 'antmaze-giant', 'humanoidmaze-large')  # fmt: skip
# The QAM paper's per-domain values (reproduce.py's `agent_params`; QAM-F is its QAM_FQL, QAM-E its QAM_EDIT),
# in the order of QAM_DOMAINS.
QAM_SETTINGS = {
    ('QAM', 'agent.inv_temp'): (3.0, 1.0, 1.0, 10.0, 3.0, 3.0, 1.0, 30.0, 3.0, 3.0),
    ('QAM', 'agent.fql_alpha'): (0.0,) * 10,
    ('QAM', 'agent.edit_scale'): (0.0,) * 10,
    ('QAM-F', 'agent.inv_temp'): (3.0, 1.0, 1.0, 3.0, 1.0, 10.0, 0.3, 3.0, 3.0, 0.3),
    ('QAM-F', 'agent.fql_alpha'): (0.0, 300.0, 0.0, 30.0, 30.0, 300.0, 30.0, 3.0, 30.0, 30.0),
    ('QAM-F', 'agent.edit_scale'): (0.0,) * 10,
    ('QAM-E', 'agent.inv_temp'): (1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 0.1, 10.0, 3.0),
    ('QAM-E', 'agent.fql_alpha'): (0.0,) * 10,
    ('QAM-E', 'agent.edit_scale'): (0.1, 0.0, 0.0, 0.1, 0.1, 0.1, 0.1, 0.9, 0.1, 0.1),
    ('FQL', 'agent.alpha'): (300.0, 300.0, 300.0, 3.0, 30.0, 30.0, 100.0, 1.0, 3.0, 30.0),
    ('QSM', 'agent.inv_temp'): (10.0, 3.0, 1.0, 10.0, 10.0, 10.0, 1.0, 10.0, 10.0, 10.0),
    ('QSM', 'agent.alpha'): (30.0, 30.0, 10.0, 10.0, 30.0, 10.0, 10.0, 1.0, 10.0, 30.0),
    ('DAC', 'agent.alpha'): (1.0, 1.0, 3.0, 0.3, 1.0, 0.3, 1.0, 1.0, 0.3, 0.3),
    ('ReBRAC', 'agent.alpha_actor'): (0.1, 0.03, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01),
    ('ReBRAC', 'agent.actor_noise'): (0.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.2, 0.2, 0.0, 0.1),
    ('DSRL', 'agent.noise_scale'): (1.0, 0.4, 1.0, 0.8, 0.6, 1.4, 1.4, 1.0, 1.2, 0.8),
    ('CGQL', 'agent.guidance_coef'): (0.1, 0.1, 0.01, 0.1, 0.01, 0.1, 0.1, 0.1, 0.1, 0.01),
    ('CGQL-M', 'agent.guidance_coef'): (0.1, 0.1, 0.01, 0.1, 0.1, 0.1, 0.01, 1.0, 0.1, 0.1),
    ('CGQL-M', 'agent.noisy_coef'): (0.1, 0.1, 0.001, 0.1, 0.1, 0.001, 0.1, 0.001, 0.001, 0.1),
    ('CGQL-L', 'agent.guidance_coef'): (0.1, 0.1, 0.01, 0.1, 0.1, 0.1, 0.01, 1.0, 0.1, 0.1),
    ('CGQL-L', 'agent.noisy_coef'): (0.001, 0.1, 0.001, 0.001, 0.1, 0.001, 0.1, 0.001, 0.001, 0.1),
    ('FBRAC', 'agent.alpha'): (0.03, 100.0, 0.1, 0.1, 30.0, 0.03, 1.0, 0.3, 0.1, 10.0),
    ('IFQL', 'agent.kappa'): (0.95, 0.9, 0.9, 0.9, 0.7, 0.95, 0.95, 0.9, 0.8, 0.8),
    ('BAM', 'agent.inv_temp'): (10.0, 10.0, 10.0, 30.0, 10.0, 30.0, 10.0, 30.0, 30.0, 30.0),
    ('FAWAC', 'agent.inv_temp'): (0.8, 6.4, 0.8, 6.4, 6.4, 0.8, 0.8, 0.8, 0.8, 0.8),
    ('FEdit', 'agent.edit_scale'): (0.2, 0.2, 0.2, 0.2, 0.5, 0.3, 0.4, 0.8, 0.3, 0.1),
    ('RLPD', 'agent.bc_alpha'): (0.01, 0.3, 0.1, 0.0, 0.03, 0.0, 0.0, 0.0, 0.01, 0.0),  # reproduce_rlpd.py
}


def paper_domain(env_name, protocol='qc'):
    """The domain of `env_name` in `protocol`'s paper (one of `DOMAINS` or `QAM_DOMAINS`), or None for environments
    that paper does not use."""
    name = env_name.removeprefix('visual-')
    for domain in DOMAINS if protocol == 'qc' else QAM_DOMAINS:
        if name.startswith(domain + '-'):
            return domain
    return None


# What the QAM paper's methods set on every domain beyond their per-domain values: FQL and RLPD where their code
# differs from QC's (`agents/fql.py` and `agents/rlpd.py` weight BC by the chunk's validity; `agents/rlpd.py` builds
# GELU networks), and the constants of reproduce.py's entries.
QAM_METHOD_FLAGS = {
    'FQL': {'agent.bc_mask': 'chunk'},
    'RLPD': {'agent.bc_mask': 'chunk', 'agent.network_style': 'qam'},
    # reproduce.py's per-method constants: QSM clips its chain after each step, DAC before (its posterior mean).
    'QSM': {'agent.actor_loss_type': 'qsm', 'agent.clip_sampler_before': False, 'agent.clip_sampler_after': True},
    'DAC': {'agent.actor_loss_type': 'dac', 'agent.clip_sampler_before': True, 'agent.clip_sampler_after': False},
    'CGQL': {'agent.mode': 'simple', 'agent.inv_temp': 10.0},
    'CGQL-M': {'agent.mode': 'mse', 'agent.inv_temp': 10.0},
    'CGQL-L': {'agent.mode': 'linex', 'agent.inv_temp': 10.0},
}


def qam_domain_flags(domain):
    """What the QAM protocol sets for every method on `domain`."""
    maze = domain.startswith(('antmaze', 'humanoidmaze'))
    return {
        'sparse': domain in QAM_SPARSE_DOMAINS,
        'horizon_length': 1 if maze else 5,
        'agent.action_chunking': True,
        'agent.num_qs': 10,
        'agent.rho': 0.0 if domain.startswith('humanoidmaze') else 0.5,
        'agent.discount': 0.995 if domain.endswith('giant') or domain.startswith('humanoidmaze') else 0.99,
    }


def domain_flags(method, env_name, protocol='qc'):
    """Flags `protocol`'s paper sets for `method` (a preset name) on the domain of `env_name`, on top of the
    method's."""
    domain = paper_domain(env_name, protocol)
    if domain is None:
        return {}
    if protocol == 'qc':
        flags = {'sparse': True} if domain in SPARSE_DOMAINS else {}
        settings, domains = PAPER_SETTINGS, DOMAINS
    else:
        flags, settings, domains = qam_domain_flags(domain), QAM_SETTINGS, QAM_DOMAINS
        flags.update(QAM_METHOD_FLAGS.get(method, {}))
    for (name, flag), values in settings.items():
        if name == method:
            flags[flag] = values[domains.index(domain)]
    return flags


def protocol_of(config):
    """The protocol of the paper that defines the agent of `config` (its file's `PROTOCOL`; 'qc' by default)."""
    module = agent_module(config)
    return getattr(module, 'PROTOCOL', 'qc') if module is not None else 'qc'


def method_of(config, protocol='qc'):
    """`protocol`'s paper's name of the method of an agent config (`QC`, `QC-FQL`, `BFN-n`, ..., `RLPD`, `RLPD-AC`,
    `QC-RLPD` in the QC paper; `QAM`, `QAM-F`, `QAM-E`, `FQL`, `RLPD` in the QAM paper), or None where that paper
    has no such method: each agent file names its own variants (`paper_method(config, protocol)`)."""
    module = agent_module(config)
    return module.paper_method(config, protocol) if module is not None else None


def notes(env_name, sparse, config, protocol='qc'):
    """One line per setting of a run (`sparse` and its agent config) that differs from what `protocol`'s paper
    uses for its method on the domain of `env_name`; none off that paper's domains."""
    domain = paper_domain(env_name, protocol)
    if domain is None:
        return []
    method = method_of(config, protocol)
    title = f'the {paper.protocol(protocol).title}'
    if method is None:
        return [f'note: {title} has no method with this agent config ({config.get("agent_name")}); its settings '
                'and published curves do not apply; training on']  # fmt: skip
    lines = []
    for flag, value in domain_flags(method, env_name, protocol).items():
        ours = sparse if flag == 'sparse' else config.get(flag.removeprefix('agent.'))
        if ours != value:
            lines.append(f'note: {title} runs {method} on {domain} with --{flag}={value} (this run: {ours}); '
                         'training on')  # fmt: skip
    return lines
