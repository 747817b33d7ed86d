"""Buffer configuration: the fields, their validation, and the checks of the machine they run on.

The mapping from verl's sampler config lives in ``integrations/verl_mapping.py``; its names are
re-exported here, where they were first importable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Optional

import torch

from . import _core
from ._args import MAX_CAPACITY, STRATEGIES, as_count
from .integrations.verl_mapping import (
    DEFAULT_VERL_CAPACITY as DEFAULT_VERL_CAPACITY,
)
from .integrations.verl_mapping import (
    DEFAULT_VERL_THRESHOLD as DEFAULT_VERL_THRESHOLD,
)
from .integrations.verl_mapping import (
    config_from_verl as config_from_verl,
)
from .integrations.verl_mapping import (
    max_age_from_threshold as max_age_from_threshold,
)
from .integrations.verl_mapping import (
    sample_step_from_tag as sample_step_from_tag,
)

ON_FULL = ("evict_oldest", "block", "error")


@dataclasses.dataclass(frozen=True)
class BufferConfig:
    """A validated buffer configuration; see ``StalenessBuffer`` for the meaning of each field."""

    capacity: int
    max_age: int = 7
    strategy: str = "drop"
    max_uses: int = 1
    on_full: str = "evict_oldest"
    parameter_sync_step: Optional[int] = None
    track_released: bool = False
    release_bound: Optional[int] = None
    unique_ids: bool = False

    def __post_init__(self) -> None:
        as_count(self.capacity, "capacity", 1, MAX_CAPACITY)
        as_count(self.max_age, "max_age", 0)
        as_count(self.max_uses, "max_uses", 1, 2**31 - 1)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} is unknown; use 'drop' or 'wait'")
        if self.on_full not in ON_FULL:
            raise ValueError(f"on_full={self.on_full!r} is unknown; use 'evict_oldest', 'block' or 'error'")
        if self.parameter_sync_step is not None:
            as_count(self.parameter_sync_step, "parameter_sync_step", 1)
        for name in ("track_released", "unique_ids"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.release_bound is not None:
            as_count(self.release_bound, "release_bound", 1)
            if not self.track_released:
                raise ValueError(f"release_bound={self.release_bound} needs track_released=True")


def config_from_arguments(arguments: Mapping[str, Any]) -> BufferConfig:
    """Returns the BufferConfig of a constructor's arguments (its ``locals()``), every field passed by keyword.

    Extra entries (``self``, ``pin_memory``, RemoteBuffer's Ray options) are ignored; a field the mapping
    lacks is a KeyError, which tests/test_signatures.py turns into "add it to the constructor's signature".
    """
    return BufferConfig(**{f.name: arguments[f.name] for f in dataclasses.fields(BufferConfig)})


#: Bytes one ready entry takes in the native ring (six int64 and two int32 columns): the core's kBytesPerEntry.
BYTES_PER_ENTRY = _core.BYTES_PER_ENTRY


def check_capacity_fits(capacity: int) -> None:
    """Raises MemoryError naming capacity and the bytes needed when the ring would not fit in physical memory."""
    needed = capacity * BYTES_PER_ENTRY
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX: let the allocation decide
        return
    if physical > 0 and needed > physical:
        raise MemoryError(
            f"capacity={capacity} needs {needed} bytes ({needed / 2**30:.1f} GiB) of ring memory, more "
            f"than this machine's {physical / 2**30:.1f} GiB; lower capacity"
        )


def resolve_pin_memory(pin_memory: Optional[bool]) -> bool:
    """Returns whether to pin host memory: ``None`` pins iff CUDA is available."""
    if pin_memory not in (None, True, False):
        raise TypeError(f"pin_memory={pin_memory!r} must be None, True or False")
    cuda = torch.cuda.is_available()
    if pin_memory and not cuda:
        raise ValueError("pin_memory=True needs CUDA, which is not available; pass pin_memory=None or False")
    return cuda if pin_memory is None else bool(pin_memory)
