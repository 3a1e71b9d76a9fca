"""MuJoCo's OpenGL backend for headless machines, chosen before MuJoCo is imported (it reads MUJOCO_GL then).

When `MUJOCO_GL` is unset, MuJoCo and dm_control fall back to GLFW, which needs a display: on a cluster node or a
container that prints an X11 warning and cannot render. `choose_gl_backend` instead picks the first backend that
really renders a frame here (EGL, the GPU path, then OSMesa, the CPU path), each tried in a short subprocess
because a backend, once imported, cannot be swapped in the same process. A `MUJOCO_GL` the user set is kept.
"""

import os
import subprocess
import sys

from envs.common import RENDERING_HINT

CANDIDATES = ('egl', 'osmesa')
DISABLED = 'disable'  # MuJoCo's and dm_control's value for "no rendering".
PROBE_TIMEOUT = 60

# Renders one frame of a one-sphere model; EGL can create a context on some machines and still fail to render.
_PROBE = """
import mujoco
model = mujoco.MjModel.from_xml_string('<mujoco><worldbody><geom type="sphere" size=".1"/></worldbody></mujoco>')
data = mujoco.MjData(model)
mujoco.mj_forward(model, data)
renderer = mujoco.Renderer(model, 8, 8)
renderer.update_scene(data)
renderer.render()
"""

_choice = {}  # What this process chose: {'backend': str, 'reason': str or None}.


def _start_probe(backend):
    env = dict(os.environ, MUJOCO_GL=backend, PYOPENGL_PLATFORM=backend)
    return subprocess.Popen(
        [sys.executable, '-c', _PROBE], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _probe_result(proc):
    """'' when the probe rendered, else its last error line."""
    try:
        _, err = proc.communicate(timeout=PROBE_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f'no frame within {PROBE_TIMEOUT} s'
    if proc.returncode == 0:
        return ''
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    return lines[-1] if lines else f'exit status {proc.returncode}'


def choose_gl_backend(environ=None):
    """Sets `MUJOCO_GL` (and `PYOPENGL_PLATFORM`) in `environ` (default `os.environ`) when unset, to the first of
    `CANDIDATES` that renders here, else to `DISABLED`; returns the backend in effect. Probes once per process."""
    environ = os.environ if environ is None else environ
    if environ.get('MUJOCO_GL'):
        return environ['MUJOCO_GL']
    if 'backend' not in _choice:
        probes = {backend: _start_probe(backend) for backend in CANDIDATES}  # Concurrently: one wait, not two.
        errors = {backend: _probe_result(proc) for backend, proc in probes.items()}
        working = [backend for backend in CANDIDATES if not errors[backend]]
        if working:
            _choice.update(backend=working[0], reason=None)
        else:
            tried = '; '.join(f'{backend}: {error}' for backend, error in errors.items())
            _choice.update(backend=DISABLED, reason=f'no OpenGL backend renders here ({tried}); {RENDERING_HINT}')
    environ['MUJOCO_GL'] = _choice['backend']
    if _choice['backend'] != DISABLED:
        environ.setdefault('PYOPENGL_PLATFORM', _choice['backend'])
    return _choice['backend']


def rendering_disabled_reason(environ=None):
    """Why this process cannot render (one phrase), or None when a backend is set."""
    environ = os.environ if environ is None else environ
    if environ.get('MUJOCO_GL', '').lower() in ('off', 'disable', 'disabled', 'false', '0'):
        return _choice.get('reason') or f'MUJOCO_GL={environ["MUJOCO_GL"]} turns rendering off'
    return None
