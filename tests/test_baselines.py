"""The QAM paper's baselines on the run layer: each trains with main.py offline then online on generated cube data
with two seeds in one process, is killed and resumed, follows the QAM paper's protocol by default and is named as
that paper names it (the killed run a driver process, its resume in this one: what the process adds is tested in
test_resume.py). That the resumed run is exactly the uninterrupted one is tested for ACFQL and QAM in
test_resume.py, and for every agent's own state (all a checkpoint holds of it) in each agent's test file
(`helpers.sequential_updates_with_a_resume`).
"""

import json
import os
import signal

import pytest
from helpers import checkpoint_files, parse_run, read_csv, start_driver, wait_for

import main
from agents import agents
from training import Trainer

ENV_NAME = 'cube-single-play-singletask-task2-v0'
TINY = ['--agent.actor_hidden_dims=(16,16)', '--agent.value_hidden_dims=(16,16)', '--agent.batch_size=8',
        '--agent.num_qs=2', '--eval_episodes=1', '--horizon_length=3']  # fmt: skip
# Each baseline's agent file, the keys that make it that method, the QAM paper's name for it and a loss it logs.
BASELINES = {
    'FEdit': ('agents/fedit.py', ['--agent.flow_steps=2', '--agent.edit_scale=0.2'], 'actor/edit_q_loss'),
    'ReBRAC': ('agents/rebrac.py', ['--agent.alpha_actor=0.01'], 'actor/bc_loss'),
    'DSRL': ('agents/dsrl.py', ['--agent.flow_steps=2', '--agent.noise_scale=1.0'], 'critic/distill_loss'),
    # One driver run per agent file (the suite's time): CGQL-M and CGQL-L are this agent's other modes (their losses
    # and a resume in test_cgql.py).
    'CGQL': ('agents/cgql.py', ['--agent.flow_steps=2', '--agent.mode=simple', '--agent.inv_temp=10'],
             'critic/critic_loss'),
    'FBRAC': ('agents/fbrac.py', ['--agent.flow_steps=2', '--agent.alpha=0.1'], 'actor/q_loss'),
    'IFQL': ('agents/ifql.py', ['--agent.flow_steps=2', '--agent.num_samples=4'], 'value/value_loss'),
    'BAM': ('agents/bam.py', ['--agent.flow_steps=2', '--agent.inv_temp=10'], 'actor/bam_loss'),
    'FAWAC': ('agents/fawac.py', ['--agent.flow_steps=2', '--agent.inv_temp=0.8'], 'critic/value_loss'),
    # DAC is this agent with actor_loss_type='dac' (its loss and a resume in test_dcgql.py).
    'QSM': ('agents/dcgql.py', ['--agent.diffusion_steps=2', '--agent.alpha=10'], 'actor/bc_loss'),
}


@pytest.mark.slow
@pytest.mark.parametrize('method', list(BASELINES))
def test_a_baseline_trains_offline_then_online_with_two_seeds_and_resumes_after_a_kill(
    data_dir, tmp_path, no_wandb, capsys, method
):
    agent, keys, loss = BASELINES[method]
    args = [
        f'--agent={agent}', f'--env_name={ENV_NAME}', f'--dataset_dir={data_dir}', f'--save_dir={tmp_path}', *TINY,
        *keys, '--seeds=0,1', '--offline_steps=6', '--online_steps=6', '--start_training=3', '--eval_interval=6',
        '--log_interval=3', '--save_interval=3', '--exp_name=run',
    ]  # fmt: skip
    run_dirs = [os.path.join(tmp_path, 'Debug', f'run_sd{s}') for s in (0, 1)]
    proc = start_driver(args)
    # Killed once both seeds have a checkpoint (step 3; the evaluations and the online phase's compiles follow),
    # then resumed to the end: the logs are those of one run.
    assert wait_for(lambda: all(checkpoint_files(d) for d in run_dirs), proc), proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, 'the run ended before it was killed'
    Trainer(parse_run(main.PRESET, [*args, '--resume']), agents).train()
    assert 'Resuming run' in capsys.readouterr().out
    for run_dir in run_dirs:
        for name, steps in (('offline_agent.csv', [3, 6]), ('online_agent.csv', [9, 12])):
            rows = read_csv(os.path.join(run_dir, name))
            assert [int(r['step']) for r in rows] == steps, name
            assert {'critic/critic_loss', loss} <= set(rows[0]), name
        assert [int(r['step']) for r in read_csv(os.path.join(run_dir, 'eval.csv'))] == [6, 12]
        assert os.path.exists(os.path.join(run_dir, 'finished.json'))
        with open(os.path.join(run_dir, 'flags.json')) as f:
            flags = json.load(f)
        assert flags['paper_method'] == method and flags['protocol'] == 'qam'  # --protocol=auto: the agent's paper
    losses = {read_csv(os.path.join(d, 'offline_agent.csv'))[0]['critic/critic_loss'] for d in run_dirs}
    assert len(losses) == 2  # each seed its own run
