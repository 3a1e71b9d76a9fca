"""Losses and gradients of this project's agents against the authors' code (github ColinQiyangLi/qam), side by side:
the same parameters, batch and noise, every loss, info and gradient compared, the adjoints too (QAM), after one
`update` and after U fused updates (`batch_update`), and the sampled actions.

    python -m benchmarks.reference_grads --reference=/path/to/qam           # every case, table and JSON
    python -m benchmarks.reference_grads --reference=/path/to/qam --cases=QAM,QAM-E

`--reference` is a checkout of their code (bring it with the search tool's fetch; never part of this project); it
runs in its own process (`benchmarks/reference_grads_probe.py`, their checkout first on PYTHONPATH) and imports its
own `utils.networks` (distrax and tensorflow_probability, both in this project's stack). Its agent is built with the
same seed; its parameters are then loaded into this project's agent (module by module, by name), so even where the
two initialise alike that is not assumed. QAM's keys are split alike in both codes, so both draw their own noise from
the same keys; ACFQL keeps the QC reference's key splits, so for FQL the reference's draws are recorded and replayed
here (`Draws`). Small networks (two layers of 32) with the agents' other defaults (10 critics, 10 flow steps).
The relative error of an array is ||ours - theirs|| / ||theirs|| (the absolute norm where theirs is 0).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import jax
import numpy as np

from benchmarks import reference_grads_probe as probe
from benchmarks.common import machine_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(actor_hidden_dims=[32, 32], value_hidden_dims=[32, 32])
# The QAM paper's FQL is ACFQL with these keys (their `agents/fql.py` has no others to set).
QAM_FQL = dict(actor_type='distill-ddpg', num_qs=10, rho=0.5, bc_mask='chunk')
# The QAM paper's RLPD is ACRLPD with these keys (rho, num_qs and the BC weight are set on both sides).
QAM_RLPD = dict(bc_mask='chunk', network_style='qam')
RLPD_SHARED = dict(num_qs=10, rho=0.5, bc_alpha=0.1)
# reproduce.py's cube-double values of QSM and DAC, the schedule changed from vp to cosine for DAC.
QSM = dict(actor_loss_type='qsm', inv_temp=1.0, alpha=10.0, clip_sampler_before=False, clip_sampler_after=True)
DAC = dict(actor_loss_type='dac', alpha=3.0, clip_sampler_before=True, clip_sampler_after=False, beta_schedule='cosine')
# reproduce.py's CGQL values (inv_temp 10, guidance 0.1) with best-of-4; the noisy critic's weight raised to 0.1.
CGQL = dict(inv_temp=10.0, guidance_coef=0.1, best_of_n=4)
OTHER_SWITCHES = dict(target_actor=False, use_target_grad=False, clip_adj=False, clip_grad=False, best_of_n=4)

# name: (our agent, their module, keys set on both sides, keys set only on ours)
CASES = {
    'QAM': ('qam', 'agents.qam', dict(action_chunking=True), {}),
    'QAM residual': ('qam', 'agents.qam', dict(action_chunking=True, residual=True), {}),
    'QAM single-action': ('qam', 'agents.qam', dict(action_chunking=False), {}),
    'QAM single-action residual': ('qam', 'agents.qam', dict(action_chunking=False, residual=True), {}),
    'QAM other switches': ('qam', 'agents.qam', dict(action_chunking=True, **OTHER_SWITCHES), {}),
    'QAM-F': ('qam', 'agents.qam', dict(action_chunking=True, fql_alpha=10.0), {}),
    'QAM-F residual': ('qam', 'agents.qam', dict(action_chunking=True, fql_alpha=10.0, residual=True), {}),
    'QAM-F single-action': ('qam', 'agents.qam', dict(action_chunking=False, fql_alpha=10.0), {}),
    'QAM-E': ('qam', 'agents.qam', dict(action_chunking=True, edit_scale=0.1), {}),
    'QAM-E residual': ('qam', 'agents.qam', dict(action_chunking=True, edit_scale=0.1, residual=True), {}),
    'QAM-E single-action': ('qam', 'agents.qam', dict(action_chunking=False, edit_scale=0.1), {}),
    'FQL (ACFQL with rho)': ('acfql', 'agents.fql', dict(action_chunking=True), QAM_FQL),
    'FQL single-action (ACFQL with rho)': ('acfql', 'agents.fql', dict(action_chunking=False), QAM_FQL),
    'FEdit': ('fedit', 'agents.fedit', dict(action_chunking=True, edit_scale=0.2, best_of_n=4), {}),
    'FEdit single-action': ('fedit', 'agents.fedit', dict(action_chunking=False, edit_scale=0.2), {}),
    'QSM': ('dcgql', 'agents.dcgql', dict(action_chunking=True, **QSM), {}),
    'QSM single-action': ('dcgql', 'agents.dcgql', dict(action_chunking=False, **QSM), {}),
    'DAC': ('dcgql', 'agents.dcgql', dict(action_chunking=True, **DAC), {}),
    'DAC single-action': ('dcgql', 'agents.dcgql', dict(action_chunking=False, **DAC), {}),
    'ReBRAC': ('rebrac', 'agents.rebrac', dict(action_chunking=True, alpha_actor=0.01, actor_noise=0.2), {}),
    'ReBRAC single-action': ('rebrac', 'agents.rebrac', dict(action_chunking=False, alpha_actor=0.1), {}),
    'DSRL': ('dsrl', 'agents.dsrl', dict(action_chunking=True, noise_scale=1.4, best_of_n=4), {}),
    'DSRL single-action': ('dsrl', 'agents.dsrl', dict(action_chunking=False, noise_scale=0.8), {}),
    'CGQL': ('cgql', 'agents.cgql', dict(action_chunking=True, mode='simple', **CGQL), {}),
    'CGQL single-action': ('cgql', 'agents.cgql', dict(action_chunking=False, mode='simple', **CGQL), {}),
    'CGQL-M': ('cgql', 'agents.cgql', dict(action_chunking=True, mode='mse', noisy_coef=0.1, **CGQL), {}),
    'CGQL-L': ('cgql', 'agents.cgql', dict(action_chunking=True, mode='linex', noisy_coef=0.1, **CGQL), {}),
    'CGQL-L clipped': (
        'cgql', 'agents.cgql', dict(action_chunking=True, mode='linex', noisy_coef=0.1, isd_clip=1e-3, **CGQL), {},
    ),  # fmt: skip
    'FBRAC': ('fbrac', 'agents.fbrac', dict(action_chunking=True, alpha=0.1, best_of_n=4), {}),
    'FBRAC single-action': ('fbrac', 'agents.fbrac', dict(action_chunking=False, alpha=30.0), {}),
    'IFQL': ('ifql', 'agents.ifql', dict(action_chunking=True, kappa=0.9), {}),
    'IFQL single-action': ('ifql', 'agents.ifql', dict(action_chunking=False, kappa=0.7), {}),
    'BAM': ('bam', 'agents.bam', dict(action_chunking=True, inv_temp=10.0, best_of_n=4), {}),
    'BAM residual': ('bam', 'agents.bam', dict(action_chunking=True, inv_temp=10.0, residual=True), {}),
    'BAM single-action': ('bam', 'agents.bam', dict(action_chunking=False, inv_temp=30.0, target_actor=False), {}),
    'FAWAC': ('fawac', 'agents.fawac', dict(action_chunking=True, inv_temp=0.8), {}),
    'FAWAC single-action': ('fawac', 'agents.fawac', dict(action_chunking=False, inv_temp=6.4), {}),
    'RLPD (ACRLPD with rho)': ('acrlpd', 'agents.rlpd', dict(action_chunking=True, **RLPD_SHARED), QAM_RLPD),
    'RLPD single-action (ACRLPD with rho)': (
        'acrlpd', 'agents.rlpd', dict(action_chunking=False, **RLPD_SHARED), QAM_RLPD,
    ),  # fmt: skip
}
TOLERANCE = 1e-5
GROUPS = ('loss', 'info', 'grad', 'adjoint', 'update', 'batch_update', 'actions')


# Their module names that differ here, by agent: the temperature is `Temperature` (`log_temp`) everywhere here.
MODULE_NAMES = {
    'qam': {'modules_edit_alpha/log_value': 'modules_edit_alpha/log_temp'},
    'acrlpd': {'modules_alpha/log_value': 'modules_temp/log_temp'},
    'fedit': {'modules_alpha/log_value': 'modules_edit_alpha/log_temp'},  # the edit policy's, as QAM-E's
    'dsrl': {'modules_alpha/log_value': 'modules_temp/log_temp'},
    # Their time-conditioned critic is a vector field with one output; here a `Value` with a time input.
    'cgql': {f'modules_{c}/mlp/': f'modules_{c}/value_net/' for c in ('critic', 'target_critic')},
}


def renamed(key, agent_name):
    """The key of a reference array (a parameter, its gradient, ...) here (None: of a module this project does not
    build)."""
    if '/modules_target_actor_fast/' in key:
        return None  # their QAM builds a target of the fine-tuned flow that nothing reads
    for theirs, ours in MODULE_NAMES.get(agent_name, {}).items():
        key = key.replace(theirs, ours)
    return key


def rlpd_actor_loss(agent, batch, params, key):
    """ACRLPD's actor and temperature losses as one, the way their RLPD's `actor_loss` returns them (same key:
    the temperature loss sees the actor's sample)."""
    loss, info = agent.actor_loss(batch, params, key)
    alpha_loss, alpha_info = agent.temperature_loss(batch, params, key)
    total = loss + alpha_loss
    return total, {**info, 'total_loss': total, 'alpha_loss': alpha_loss, 'alpha': alpha_info['alpha']}


def rlpd_info_names(ours, agent):
    """Adds their RLPD's names of ACRLPD's temperature logs: their `actor/` holds what ACRLPD logs as `alpha/`."""
    for prefix in ('total/info/', 'update/info/'):
        if f'{prefix}alpha/alpha_loss' in ours:
            ours[f'{prefix}actor/alpha_loss'] = ours[f'{prefix}alpha/alpha_loss']
            ours[f'{prefix}actor/alpha'] = ours[f'{prefix}alpha/alpha']
            ours[f'{prefix}actor/total_loss'] = (
                ours[f'{prefix}actor/actor_loss'] + ours[f'{prefix}actor/bc_loss'] + ours[f'{prefix}alpha/alpha_loss']
            )
    return ours


def dcgql_power_mask(ours, agent):
    """Their QSM/DAC losses raise each chunk's term to the power `valid` where they mean to multiply by it: a chunk
    past an episode end adds 1 (x ** 0), not 0, to the DDPM and the guidance terms (the same gradients). Adds that
    constant, the fraction of such chunks in the probe's batch, to the losses here."""
    extra = float(np.mean(1 - probe.make_batch(1)['valid'][:, -1]))
    for key in ('actor/info/actor_loss', 'total/info/actor/actor_loss', 'update/info/actor/actor_loss'):
        ours[key] = ours[key] + extra
    for key in ('actor/loss', 'total/loss'):
        ours[key] = ours[key] + (agent.config['alpha'] + 1) * extra
    return ours


def rebrac_action_std(ours, agent):
    """Their ReBRAC logs its actor's std, a constant 1 (a Gaussian with a constant std of which only the mode is
    used); ReBRAC here has no std to log."""
    for prefix in ('actor/info/', 'total/info/actor/', 'update/info/actor/'):
        ours[f'{prefix}action_std'] = np.float32(1.0)
    return ours


# Agents whose reference samples actions for one observation only: both sides are compared on one.
ONE_OBSERVATION = ('ifql',)


# Where an agent splits or writes its losses unlike the reference: (losses for `probe`, `f(ours, agent)` translating
# its arrays to the reference's).
ADAPTERS = {
    'acrlpd': ({'actor': rlpd_actor_loss}, rlpd_info_names),
    'dcgql': (None, dcgql_power_mask),
    'rebrac': (None, rebrac_action_std),
}


def load_params(agent, theirs, agent_name):
    """`agent` with the reference's parameters (same module names and shapes, else an error) and a fresh optimizer
    state; also the largest difference of the two codes' initial parameters."""
    ours = probe.flatten(agent.network.params, 'params/')
    names = {k: renamed(k, agent_name) for k in theirs if k.startswith('params/')}
    mapped = {name: theirs[k] for k, name in names.items() if name}
    if set(mapped) != set(ours):
        only_theirs, only_ours = sorted(set(mapped) - set(ours)), sorted(set(ours) - set(mapped))
        raise SystemExit(f'parameter names differ: only theirs {only_theirs}, only ours {only_ours}')
    init_gap = 0.0
    for k, v in ours.items():
        if v.shape != mapped[k].shape:
            raise SystemExit(f'{k}: shape {v.shape} here, {mapped[k].shape} in the reference')
        init_gap = max(init_gap, float(np.abs(v - mapped[k]).max()))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(agent.network.params)
    names = ['params/' + '/'.join(str(k.key) for k in path) for path, _ in leaves]
    params = jax.tree_util.tree_unflatten(treedef, [mapped[n] for n in names])
    network = agent.network.replace(params=params, opt_state=agent.network.tx.init(params))
    return agent.replace(network=network), init_gap


def group_of(key):
    if key == 'actions' or key.startswith('adjoint/') or key.startswith('batch_update/'):
        return key.split('/')[0]
    if key.startswith('update/'):
        return 'update'
    return key.split('/')[1]  # <loss>/loss, <loss>/info/..., <loss>/grad/...


def compare(ours, theirs, agent_name):
    """{group: (worst relative error, its key)} over every array the reference wrote (bar params and draws), and the
    keys this project lacks."""
    worst, missing = {}, []
    for their_key, t in theirs.items():
        key = renamed(their_key, agent_name)
        if key is None or key.startswith(('params/', 'draws/', 'ndraws/')):
            continue
        if key not in ours:
            missing.append(key)
            continue
        o = np.asarray(ours[key], dtype=np.float64)
        t = np.asarray(t, dtype=np.float64)
        if o.shape != t.shape:
            missing.append(f'{key} (shape {o.shape} here, {t.shape} there)')
            continue
        norm = np.linalg.norm(t)
        err = float(np.linalg.norm(o - t) / norm) if norm > 0 else float(np.linalg.norm(o))
        group = group_of(key)
        if group not in worst or err > worst[group][0]:
            worst[group] = (err, key)
    return worst, missing


def our_config(agent_name, shared, extra):
    from agents import agents

    module = sys.modules[agents[agent_name].__module__]
    config = module.get_config()
    config.update({k: tuple(v) if isinstance(v, list) else v for k, v in {**SMALL, **shared, **extra}.items()})
    config['horizon_length'] = probe.HORIZON
    return agents[agent_name], config


def run_reference(name, reference, their_module, keys, out, *args):
    """The arrays `reference_grads_probe.py` writes for their agent `their_module` with config `keys` (and `args`),
    run in its own process from the checkout `reference` (theirs first on PYTHONPATH)."""
    argv = [
        sys.executable, os.path.join(ROOT, 'benchmarks', 'reference_grads_probe.py'), f'--module={their_module}',
        f'--config={json.dumps(keys)}', f'--out={out}', *args,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.path.abspath(reference))
    done = subprocess.run(argv, cwd=os.path.abspath(reference), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f'the reference failed on {name}:\n{done.stderr[-3000:]}')
    return dict(np.load(out))


def run_case(name, reference, work_dir):
    agent_name, their_module, shared, extra = CASES[name]
    record = agent_name in ('acfql', 'acrlpd')  # the QC reference's key splits; the others split as theirs
    out = os.path.join(work_dir, f'{"".join(c if c.isalnum() else "_" for c in name)}.npz')
    theirs = run_reference(name, reference, their_module, {**SMALL, **shared}, out, *(['--record'] if record else []))
    cls, config = our_config(agent_name, shared, extra)
    agent = cls.create(probe.SEED, *probe.example_inputs(), config)
    agent, init_gap = load_params(agent, theirs, agent_name)
    adjoint = (lambda a, obs, key: a.adjoint_pass(obs, key)) if hasattr(agent, 'adjoint_pass') else None
    losses, translate = ADAPTERS.get(agent_name, (None, lambda o, a: o))
    one = agent_name in ONE_OBSERVATION
    ours = translate(probe.probe(agent, adjoint, replay=theirs if record else None, losses=losses,
                                 one_observation=one), agent)  # fmt: skip
    worst, missing = compare(ours, theirs, agent_name)
    for step in ('update', 'batch_update'):  # a comparison of parameters that did not move would prove nothing
        moved = [k for k in ours if k.startswith(f'{step}/params/modules_critic/')]
        if moved and all(np.array_equal(ours[k], ours['params/' + k.split('/params/')[1]]) for k in moved):
            missing.append(f'{step}: the critic did not change')
    return dict(case=name, init_gap=init_gap, worst=worst, missing=missing, noise='replayed' if record else 'keys')


def table(results):
    lines = [
        '| case | noise | ' + ' | '.join(GROUPS) + ' | same initial params |',
        '|---|---|' + '---|' * len(GROUPS) + '---|',
    ]
    for r in results:
        cells = [f'{r["worst"][g][0]:.1e}' if g in r['worst'] else '-' for g in GROUPS]
        init = 'yes' if r['init_gap'] == 0 else f'no ({r["init_gap"]:.1e})'
        lines.append(f'| {r["case"]} | {r["noise"]} | ' + ' | '.join(cells) + f' | {init} |')
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--reference', required=True, help='a checkout of github ColinQiyangLi/qam')
    parser.add_argument('--cases', default=','.join(CASES), help='comma-separated case names (default: all)')
    parser.add_argument('--out', default=os.path.join(ROOT, 'benchmarks', 'results_reference_grads.json'))
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.cases.split(',') if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit(f'error: unknown case(s) {unknown}; choose from {list(CASES)}')
    if not os.path.isfile(os.path.join(args.reference, 'agents', 'qam.py')):
        sys.exit(f'error: {args.reference} is not a checkout of github ColinQiyangLi/qam (no agents/qam.py there)')
    results = []
    with tempfile.TemporaryDirectory() as work_dir:
        for name in names:
            results.append(run_case(name, args.reference, work_dir))
            r = results[-1]
            worst = max((v for v in r['worst'].values()), default=(0.0, ''))
            print(f'{name}: worst relative error {worst[0]:.1e} ({worst[1]}); missing here: {r["missing"]}', flush=True)
    print(table(results))
    failed = [r['case'] for r in results if r['missing'] or any(v[0] > TOLERANCE for v in r['worst'].values())]
    with open(args.out, 'w') as f:
        json.dump(dict(results=results, tolerance=TOLERANCE, machine=machine_info()), f, indent=1)
    print(f'wrote {args.out}')
    if failed:
        sys.exit(f'above {TOLERANCE:g} relative (or missing arrays): {failed}')


if __name__ == '__main__':
    main()
