"""The run layer: a typed run config, the chunk sampler, the online actor and the trainer the drivers share.

`utils/` holds the foundations (datasets, networks, checkpoints, guards); this package sits above them and above
`envs/`, `evaluation.py` and `log_utils.py`, and only the drivers sit above it.
"""

from training.config import Preset, RunConfig, define_flags, from_flags
from training.trainer import StopTraining, Trainer

__all__ = ['Preset', 'RunConfig', 'StopTraining', 'Trainer', 'define_flags', 'from_flags']
