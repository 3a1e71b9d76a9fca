"""Pure online training with prior data (RLPD-style): every update batch is half offline chunks, half replay chunks.

    python main_online.py --env_name=cube-triple-play-singletask-task2-v0 --horizon_length=5 --agent.bc_alpha=0.01

Variants of the paper: RLPD `--horizon_length=1`, RLPD-AC `--horizon_length=5`, QC-RLPD `--horizon_length=5
--agent.bc_alpha=0.01`. The replay buffer starts empty and is filled with uniform random actions until
`start_training`.
"""

from absl import app, flags

from agents import agents
from training import Preset, Trainer, flags_parser, from_flags
from utils.errors import cli_main

PRESET = Preset(
    driver='main_online.py',
    agent_file='agents/acrlpd.py',
    buffer_size=1_000_000,
    offline=False,
    online_data_fraction=0.5,
    replay_starts_with_data=False,
)


def main(_):
    run = from_flags(flags.FLAGS, PRESET)
    Trainer(run, agents).train()


if __name__ == '__main__':
    # The flags are defined when the command line is parsed, so that tests and sweeps can import PRESET alone.
    app.run(cli_main(main), flags_parser=flags_parser(PRESET, __doc__.split('\n')[0]))
