"""Offline-to-online training: offline pre-training on a dataset, then online fine-tuning.

    MUJOCO_GL=egl python main.py --agent=agents/acfql.py --env_name=cube-triple-play-singletask-task2-v0 \
        --horizon_length=5 --agent.actor_type=best-of-n

The online replay buffer starts as a copy of the offline data. Logs (`offline_agent.csv`, `online_agent.csv`,
`eval.csv`, `env.csv`), `flags.json` and checkpoints go to `<save_dir>/<run_group>/<exp_name>/`.
"""

import sys

from absl import app, flags

from agents import agents
from utils.datasets import ReplayBuffer
from utils.training import Trainer, define_flags, exit_on_user_errors, stack_utd

FLAGS = flags.FLAGS
define_flags(offline=True, buffer_size=2000000, agent_file='agents/acfql.py')


def main(_):
    trainer = Trainer(FLAGS, sys.argv, agents)
    trainer.offline_phase()
    if FLAGS.online_steps == 0:  # Offline only: no replay buffer to allocate.
        trainer.finish()
        return

    dataset = trainer.train_dataset
    buffer = ReplayBuffer.create_from_initial_dataset(
        dataset, size=max(FLAGS.buffer_size, dataset.size + 1), seed=FLAGS.seed
    )
    config = trainer.config
    batch_size = config['batch_size']

    def sample_batch():
        chunks = buffer.sample_sequence(batch_size * FLAGS.utd_ratio, config['horizon_length'], config['discount'])
        return stack_utd(chunks, FLAGS.utd_ratio, batch_size)

    trainer.online_phase(buffer, sample_batch)
    trainer.finish()


if __name__ == '__main__':
    app.run(exit_on_user_errors(main))
