"""Silences the third-party messages every run printed that are known to be harmless, each at its source.

- gymnasium warns twice per environment that a float64 Box bound is cast to float32 (OGBench's spaces);
- dm_control logs INFO lines on how it loaded its OpenGL backend and MuJoCo's version;
- PyOpenGL logs at INFO that its optional accelerator module is missing;
- JAX warns that `os.fork()` is unsafe in a multithreaded process when `subprocess` starts a program (imageio's
  ffmpeg for videos); `subprocess` runs nothing in the child before exec, which is the safe case;
- JAX logs at INFO that it found no TPU (`Unable to initialize backend 'tpu'`) on every machine without one.
Other warnings and log records, of these libraries too, still show.
"""

import logging
import warnings

_installed = []


class _DropRecords(logging.Filter):
    """Drops INFO-or-lower records from `path_part` files, or whose message starts with `prefix`."""

    def __init__(self, path_part=None, prefix=None):
        super().__init__()
        self.path_part = path_part
        self.prefix = prefix

    def filter(self, record):
        if record.levelno > logging.INFO:
            return True
        if self.path_part is not None and self.path_part in record.pathname.replace('\\', '/'):
            return False
        if self.prefix is not None and str(record.msg).startswith(self.prefix):
            return False
        return True


def quiet_known_noise():
    """Installs the filters above (idempotent)."""
    if _installed:
        return
    warnings.filterwarnings(
        'ignore', message=r".*Box (low|high)'s precision lowered by casting", module=r'gymnasium\.spaces\.box'
    )
    warnings.filterwarnings('ignore', message=r'os\.fork\(\) was called', category=RuntimeWarning, module='subprocess')
    # absl hands dm_control's records to the 'absl' Python logger.
    logging.getLogger('absl').addFilter(_DropRecords(path_part='dm_control/'))
    logging.getLogger('OpenGL.acceleratesupport').addFilter(_DropRecords(prefix='No OpenGL_accelerate module'))
    logging.getLogger('jax._src.xla_bridge').addFilter(_DropRecords(prefix="Unable to initialize backend 'tpu'"))
    _installed.append(True)
