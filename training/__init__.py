"""The run layer: the typed run config, the lanes (one per seed), the training loops and their plumbing.

`utils/` holds the foundations (datasets, networks, checkpoints, guards); this package sits above them and above
`envs/`, `evaluation.py` and `log_utils.py`, and only the drivers (and `sweeps/`) sit above it.
"""

from training.config import Preset, RunConfig, define_flags, flags_parser, from_flags
from training.hooks import StopTraining
from training.trainer import Trainer

__all__ = ['Preset', 'RunConfig', 'StopTraining', 'Trainer', 'define_flags', 'flags_parser', 'from_flags']
