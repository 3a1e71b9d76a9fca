"""Environments and datasets of every family (see `env_utils`).

Importing the package picks MuJoCo's headless OpenGL backend when `MUJOCO_GL` is unset (`gl_backend`) and
silences known-harmless third-party messages (`utils.quiet`): both must happen before MuJoCo, dm_control or
gymnasium environments are imported, which only this package does.
"""

from envs.gl_backend import choose_gl_backend
from utils.quiet import quiet_known_noise

quiet_known_noise()
choose_gl_backend()
