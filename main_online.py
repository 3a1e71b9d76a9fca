"""Pure online training with prior data (RLPD-style): every update batch is half offline chunks, half replay chunks.

    python main_online.py --env_name=cube-triple-play-singletask-task2-v0 --horizon_length=5 --agent.bc_alpha=0.01

Variants of the paper: RLPD `--horizon_length=1`, RLPD-AC `--horizon_length=5`, QC-RLPD `--horizon_length=5
--agent.bc_alpha=0.01`. The replay buffer starts empty and is filled with uniform random actions until
`start_training`.
"""

import sys

import numpy as np
from absl import app, flags

from agents import agents
from utils.datasets import ReplayBuffer
from utils.training import Trainer, UsageError, define_flags, exit_on_user_errors, stack_utd

FLAGS = flags.FLAGS
define_flags(offline=False, buffer_size=1000000, agent_file='agents/acrlpd.py')

TRANSITION_KEYS = ('observations', 'actions', 'rewards', 'terminals', 'masks', 'next_observations')


def main(_):
    if FLAGS.start_training < FLAGS.horizon_length:
        raise UsageError(
            f'--start_training ({FLAGS.start_training}) must be >= --horizon_length, so that the '
            'replay buffer holds a full chunk before the first update'
        )
    trainer = Trainer(FLAGS, sys.argv, agents)
    dataset = trainer.train_dataset
    buffer = ReplayBuffer.create({k: dataset[k][0] for k in TRANSITION_KEYS}, size=FLAGS.buffer_size, seed=FLAGS.seed)
    config = trainer.config
    utd, batch_size = FLAGS.utd_ratio, config['batch_size']
    dataset_half = batch_size // 2
    replay_half = batch_size - dataset_half

    def sample_batch():
        chunks = [
            stack_utd(trainer.sample_dataset_chunks(utd * dataset_half), utd, dataset_half),
            stack_utd(
                buffer.sample_sequence(utd * replay_half, config['horizon_length'], config['discount']),
                utd,
                replay_half,
            ),
        ]
        return {k: np.concatenate([c[k] for c in chunks], axis=1) for k in chunks[0]}

    trainer.online_phase(buffer, sample_batch, random_steps=FLAGS.start_training - 1)
    trainer.finish()


if __name__ == '__main__':
    app.run(exit_on_user_errors(main))
