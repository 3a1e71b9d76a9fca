"""Simulator state export for `--save_all_online_states` (MuJoCo-based environments)."""

import numpy as np

from envs.common import EnvError


def _mujoco_data(env):
    """The MuJoCo `MjData` behind an environment: OGBench keeps `_data`, gymnasium `data`, robosuite `sim.data`."""
    candidates = [env.unwrapped, getattr(env.unwrapped, 'env', None)]
    for base in candidates:
        if base is None:
            continue
        for attr in ('_data', 'data'):
            data = getattr(base, attr, None)
            if data is not None and hasattr(data, 'qpos'):
                return base, data
        sim = getattr(base, 'sim', None)
        if sim is not None and hasattr(sim, 'data'):
            return base, sim.data
    raise EnvError(f'--save_all_online_states needs a MuJoCo environment; {type(env.unwrapped).__name__} has no state')


def get_env_state(env):
    """Copies of the current `qpos`, `qvel` and, for OGBench scene/puzzle, `button_states`."""
    base, data = _mujoco_data(env)
    state = dict(qpos=np.array(data.qpos, copy=True), qvel=np.array(data.qvel, copy=True))
    if hasattr(base, '_cur_button_states'):
        state['button_states'] = np.array(base._cur_button_states, copy=True)
    return state
