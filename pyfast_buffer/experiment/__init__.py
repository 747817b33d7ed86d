"""A real asynchronous GRPO run on StalenessBuffer, comparing reuse and staleness arms.

``run_experiment(ExperimentConfig(...), [ArmConfig(...), ...], out_dir)`` is the Python face;
``pyfast-buffer experiment`` and ``pyfast-buffer demo`` are the command-line ones.
"""

from .config import PRESETS, ArmConfig, ExperimentConfig, preset
from .runner import ExperimentResult, run_experiment

__all__ = ["PRESETS", "ArmConfig", "ExperimentConfig", "ExperimentResult", "preset", "run_experiment"]

from .cli import add_parser

__all__ += ["add_parser"]
