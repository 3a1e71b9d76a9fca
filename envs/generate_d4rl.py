"""Writes a small D4RL-format hdf5 file (`observations, actions, rewards, terminals, timeouts`) from random actions.

It lets the D4RL loading path run on a machine that cannot download D4RL; the data are not D4RL's.

    python -m envs.generate_d4rl --env_name=antmaze-umaze-diverse-v2 --num_episodes=5 --save_dir=~/.d4rl/datasets
"""

import argparse
import os

import numpy as np

from envs.common import EnvError, require
from utils.errors import run_cli


def generate_dataset(env_name, save_path, num_episodes=3, episode_length=None, seed=0):
    """Rolls out uniformly random actions for `num_episodes` episodes and writes them in D4RL's layout.

    `terminals` marks true terminations, `timeouts` the steps where an episode hit `episode_length` (default: the
    environment's own limit). Returns the number of rows written.
    """
    from envs import d4rl_utils

    h5py = require('h5py', 'pip install h5py')
    if not d4rl_utils.is_d4rl_env(env_name):
        raise EnvError(f'{env_name!r} is not a D4RL AntMaze/Adroit name (e.g. antmaze-umaze-diverse-v2, pen-human-v1)')
    if num_episodes < 1:
        raise EnvError('need --num_episodes >= 1')
    env = d4rl_utils.make_d4rl_env(env_name, prefer_legacy=False)
    env.action_space.seed(seed)
    rows = {k: [] for k in ('observations', 'actions', 'rewards', 'terminals', 'timeouts')}
    for ep in range(num_episodes):
        ob, _ = env.reset(seed=seed + ep)
        t = 0
        while True:
            action = env.action_space.sample()
            next_ob, reward, terminated, truncated, _ = env.step(action)
            t += 1
            timeout = bool(truncated) or (episode_length is not None and t >= episode_length)
            rows['observations'].append(ob)
            rows['actions'].append(action)
            rows['rewards'].append(reward)
            rows['terminals'].append(bool(terminated))
            rows['timeouts'].append(timeout and not terminated)
            ob = next_ob
            if terminated or timeout:
                break
    env.close()
    save_path = os.path.expanduser(save_path)
    os.makedirs(os.path.dirname(os.path.abspath(save_path)), exist_ok=True)
    with h5py.File(save_path, 'w') as f:
        f.create_dataset('observations', data=np.asarray(rows['observations'], np.float32))
        f.create_dataset('actions', data=np.asarray(rows['actions'], np.float32))
        f.create_dataset('rewards', data=np.asarray(rows['rewards'], np.float32))
        f.create_dataset('terminals', data=np.asarray(rows['terminals'], bool))
        f.create_dataset('timeouts', data=np.asarray(rows['timeouts'], bool))
    return len(rows['rewards'])


def main(argv=None):
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--env_name', default='antmaze-umaze-diverse-v2')
    p.add_argument('--save_dir', default='~/.d4rl/datasets', help='the file is <save_dir>/<env_name>.hdf5')
    p.add_argument('--num_episodes', type=int, default=3)
    p.add_argument('--episode_length', type=int, default=None, help="steps per episode (default: the env's limit)")
    p.add_argument('--seed', type=int, default=0)
    args = p.parse_args(argv)
    path = os.path.join(os.path.expanduser(args.save_dir), f'{args.env_name}.hdf5')
    n = generate_dataset(args.env_name, path, args.num_episodes, args.episode_length, args.seed)
    print(f'wrote {path} ({n} rows)')


if __name__ == '__main__':
    run_cli(main)
