"""Writes a small but valid RoboMimic `low_dim_v15.hdf5` from scripted robosuite Lift rollouts.

It exists so that the real RoboMimic loading path (env rebuilt from `env_args`, low-dim keys, rewards, dones) can
be exercised without downloading RoboMimic's human demonstrations; it is no substitute for them in experiments.

    python -m envs.generate_robomimic --num_demos=10 --save_path=~/.robomimic/lift/mh/low_dim_v15.hdf5
"""

import argparse
import json
import os

import numpy as np

from envs.common import EnvError, require
from envs.robomimic_utils import LOW_DIM_KEYS, ROBOSUITE_INSTALL, low_dim_observation, make_robosuite_env
from utils.errors import run_cli

# Extra robosuite keys stored per step, as RoboMimic files carry more than the four keys the agents read.
_EXTRA_KEYS = ('robot0_joint_pos', 'robot0_joint_vel', 'robot0_gripper_qvel')


def lift_env_args():
    """RoboMimic-style metadata of the Lift task: Panda, OSC_POSE delta control at 20 Hz, sparse reward."""
    arm_controller = {
        'type': 'OSC_POSE',
        'input_max': 1,
        'input_min': -1,
        'output_max': [0.05, 0.05, 0.05, 0.5, 0.5, 0.5],
        'output_min': [-0.05, -0.05, -0.05, -0.5, -0.5, -0.5],
        'kp': 150,
        'damping': 1,
        'impedance_mode': 'fixed',
        'kp_limits': [0, 300],
        'damping_limits': [0, 10],
        'position_limits': None,
        'orientation_limits': None,
        'uncouple_pos_ori': True,
        'control_delta': True,
        'interpolation': None,
        'ramp_ratio': 0.2,
    }
    return {
        'env_name': 'Lift',
        'type': 1,
        'env_kwargs': {
            'has_renderer': False,
            'has_offscreen_renderer': False,
            'ignore_done': True,
            'use_object_obs': True,
            'use_camera_obs': False,
            'control_freq': 20,
            'reward_shaping': False,
            'robots': ['Panda'],
            'controller_configs': arm_controller,
        },
    }


def scripted_lift_action(raw_obs, phase_steps, rng, noise):
    """Open-loop phases on closed-loop targets: above the cube, down, close the gripper, lift."""
    eef = raw_obs['robot0_eef_pos']
    cube = raw_obs['cube_pos']
    phase, steps = phase_steps
    if phase == 0:
        target, grip = cube + np.array([0.0, 0.0, 0.08]), -1.0
        done = np.linalg.norm(target - eef) < 0.01 or steps > 60
    elif phase == 1:
        target, grip = cube + np.array([0.0, 0.0, -0.005]), -1.0
        done = np.linalg.norm(target - eef) < 0.008 or steps > 40
    elif phase == 2:
        target, grip = eef, 1.0
        done = steps >= 12
    else:
        target, grip = cube + np.array([0.0, 0.0, 0.15]), 1.0
        done = False
    delta = np.clip((target - eef) * 12.0, -1.0, 1.0)
    action = np.concatenate([delta, np.zeros(3), [grip]])
    action[:3] += rng.normal(0.0, noise, size=3)
    next_phase = (phase + 1, 0) if done and phase < 3 else (phase, steps + 1)
    return np.clip(action, -1.0, 1.0), next_phase


def generate_dataset(save_path, num_demos=5, max_steps=200, seed=0, noise=0.05, show_progress=True):
    """Rolls out `num_demos` scripted Lift episodes (each stops at success or `max_steps`) and writes the hdf5.

    Returns the number of successful demos.
    """
    h5py = require('h5py', 'pip install h5py')
    require('robosuite', ROBOSUITE_INSTALL)
    from tqdm import trange

    if num_demos < 1:
        raise EnvError('need --num_demos >= 1')
    env_args = lift_env_args()
    rng = np.random.default_rng(seed)
    env = make_robosuite_env(env_args, seed=int(rng.integers(2**31)))
    save_path = os.path.expanduser(save_path)
    os.makedirs(os.path.dirname(os.path.abspath(save_path)), exist_ok=True)
    num_success = 0
    total = 0
    with h5py.File(save_path, 'w') as f:
        data = f.create_group('data')
        for i in trange(num_demos, desc='scripted Lift demos', disable=not show_progress):
            raw = env.reset()
            phase = (0, 0)
            rec = {k: [] for k in ('actions', 'rewards', 'dones', 'states')}
            obs_seq = []
            success = False
            for _ in range(max_steps):
                action, phase = scripted_lift_action(raw, phase, rng, noise)
                rec['states'].append(np.asarray(env.sim.get_state().flatten()))
                obs_seq.append(raw)
                raw, _, _, _ = env.step(action)
                success = bool(env._check_success())
                rec['actions'].append(action)
                rec['rewards'].append(float(success))
                rec['dones'].append(float(success))
                if success:
                    break
            obs_seq.append(raw)
            # RoboMimic marks the final step of every demo as done.
            rec['dones'][-1] = 1.0
            num_success += int(success)
            n = len(rec['actions'])
            total += n
            g = data.create_group(f'demo_{i}')
            g.attrs['num_samples'] = n
            for k, v in rec.items():
                g.create_dataset(k, data=np.asarray(v, dtype=np.float64 if k != 'dones' else np.int64))
            for group_name, seq in (('obs', obs_seq[:-1]), ('next_obs', obs_seq[1:])):
                grp = g.create_group(group_name)
                for k in LOW_DIM_KEYS + _EXTRA_KEYS:
                    grp.create_dataset(k, data=np.stack([low_dim_observation(o, (k,)) for o in seq]))
        data.attrs['total'] = total
        data.attrs['env_args'] = json.dumps(env_args)
    env.close()
    return num_success


def main(argv=None):
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--save_path', default='~/.robomimic/lift/mh/low_dim_v15.hdf5')
    p.add_argument('--num_demos', type=int, default=10)
    p.add_argument('--max_steps', type=int, default=200, help='steps before an unsuccessful demo is cut')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--noise', type=float, default=0.05, help='std of the Gaussian noise on position actions')
    args = p.parse_args(argv)
    n = generate_dataset(args.save_path, args.num_demos, args.max_steps, args.seed, args.noise)
    print(f'wrote {os.path.expanduser(args.save_path)} ({n}/{args.num_demos} demos succeeded)')


if __name__ == '__main__':
    run_cli(main)
