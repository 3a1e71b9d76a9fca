"""Offline-to-online training: offline pre-training on a dataset, then online fine-tuning.

    MUJOCO_GL=egl python main.py --agent=agents/acfql.py --env_name=cube-triple-play-singletask-task2-v0 \
        --horizon_length=5 --agent.actor_type=best-of-n

Online batches come from the replay buffer only, which starts as a copy of the offline data. Logs
(`offline_agent.csv`, `online_agent.csv`, `eval.csv`, `env.csv`), `flags.json` and checkpoints go to
`<save_dir>/<run_group>/<exp_name>/`.
"""

from absl import app, flags

from agents import agents
from training import Preset, Trainer, flags_parser, from_flags
from utils.errors import cli_main

PRESET = Preset(
    driver='main.py',
    agent_file='agents/acfql.py',
    buffer_size=2_000_000,
    offline=True,
    online_data_fraction=0.0,
    replay_starts_with_data=True,
)


def main(_):
    run = from_flags(flags.FLAGS, PRESET)
    Trainer(run, agents).train()


if __name__ == '__main__':
    # The flags are defined when the command line is parsed, so that tests and sweeps can import PRESET alone.
    app.run(cli_main(main), flags_parser=flags_parser(PRESET, __doc__.split('\n')[0]))
