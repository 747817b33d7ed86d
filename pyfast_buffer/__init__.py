"""pyfast_buffer: a native-accelerated, staleness-aware trajectory buffer for asynchronous RL."""

from typing import Any

from . import _built  # noqa: F401  (first: without the compiled core, say how to build it)
from .batch import AGE_BUCKETS, BLOCKED_BY, FIELDS, LOG_FORMAT, Batch, set_metrics_prefix
from .buffer import StalenessBuffer
from .checkpoint import CheckpointError
from .config import BufferConfig
from .errors import AdmissionError, BufferClosedError, BufferFullError
from .reference import ReferenceBuffer
from .released import RELEASE_REASONS, Released
from .verl_mapping import config_from_verl, max_age_from_threshold, sample_step_from_tag


def __getattr__(name: str) -> Any:
    """``__version__`` on first access: importlib.metadata costs a sixth of the import, torch is not loaded here
    at all (pyfast_buffer/_torch.py); both load on the first call that needs them."""
    if name != "__version__":
        raise AttributeError(f"module 'pyfast_buffer' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("pyfast_buffer")
    except PackageNotFoundError:  # running from a source tree without installing
        found = "0+unknown"
    globals()["__version__"] = found  # later reads find it without this function
    return found


__all__ = [
    "AGE_BUCKETS",
    "BLOCKED_BY",
    "FIELDS",
    "LOG_FORMAT",
    "RELEASE_REASONS",
    "AdmissionError",
    "Batch",
    "BufferClosedError",
    "BufferConfig",
    "BufferFullError",
    "CheckpointError",
    "ReferenceBuffer",
    "Released",
    "StalenessBuffer",
    "__version__",
    "config_from_verl",
    "max_age_from_threshold",
    "sample_step_from_tag",
    "set_metrics_prefix",
]
