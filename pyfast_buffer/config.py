"""Buffer configuration: the fields, their validation, and the checks of the machine they run on.

The mapping from verl's sampler config lives in ``verl_mapping.py``; its names are
re-exported here, where they were first importable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Optional, Tuple, Union
from typing import Mapping as MappingType

from . import _core, _torch
from ._args import MAX_CAPACITY, MAX_SOURCE, STRATEGIES, as_count
from .verl_mapping import (
    DEFAULT_VERL_CAPACITY as DEFAULT_VERL_CAPACITY,
)
from .verl_mapping import (
    DEFAULT_VERL_THRESHOLD as DEFAULT_VERL_THRESHOLD,
)
from .verl_mapping import (
    config_from_verl as config_from_verl,
)
from .verl_mapping import (
    max_age_from_threshold as max_age_from_threshold,
)
from .verl_mapping import (
    sample_step_from_tag as sample_step_from_tag,
)

ON_FULL = ("evict_oldest", "block", "error")
AGE_FROM = ("start", "finish")


#: ``source_max_age`` as passed: ``{source: max_age}``, or the (source, max_age) pairs a config stores.
SourceMaxAge = Union[MappingType[int, int], Tuple[Tuple[int, int], ...]]


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
    prompts_per_step: Optional[int] = None
    lookahead: Optional[int] = None
    age_from: str = "start"
    max_attempts: Optional[int] = None
    source_max_age: Optional[SourceMaxAge] = None
    starvation_share: Optional[float] = None

    def source_bounds(self) -> Tuple[Tuple[int, int], ...]:
        """Returns ``source_max_age`` as the sorted (source, max_age) pairs it is stored as (empty for none)."""
        return source_max_age_pairs(self.source_max_age) or ()

    def __post_init__(self) -> None:
        as_count(self.capacity, "capacity", 1, MAX_CAPACITY)
        as_count(self.max_age, "max_age", 0)
        as_count(self.max_uses, "max_uses", 1, 2**31 - 1)
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} is unknown; use 'drop', 'wait' or 'pace'")
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
        if self.age_from not in AGE_FROM:
            raise ValueError(f"age_from={self.age_from!r} is unknown; use 'start' (dispatch step) or 'finish'")
        self._check_pace()
        if self.max_attempts is not None:
            as_count(self.max_attempts, "max_attempts", 1, 2**31 - 1)
        # Stored as sorted (source, max_age) pairs: hashable, and a checkpoint keeps it (dict keys must be str there).
        object.__setattr__(self, "source_max_age", source_max_age_pairs(self.source_max_age))
        share = self.starvation_share
        if share is not None:
            if isinstance(share, bool) or not isinstance(share, (int, float)):
                raise TypeError(f"starvation_share={share!r} is not a number; pass a share in (0, 1) or None")
            if not 0 < share < 1:
                raise ValueError(f"starvation_share={share} must lie in (0, 1), e.g. 0.05 for 5% of trained data")

    def _check_pace(self) -> None:
        if self.strategy != "pace":
            for name in ("prompts_per_step", "lookahead"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name}={getattr(self, name)!r} is used only by strategy='pace'; "
                        f"leave it unset or pass strategy='pace'"
                    )
            return
        if self.prompts_per_step is None:
            raise ValueError(
                "strategy='pace' needs prompts_per_step: the prompt groups one training step takes "
                "(e.g. train_batch_size // group size)"
            )
        as_count(self.prompts_per_step, "prompts_per_step", 1, PACE_MAX_PROMPTS_PER_STEP)
        if self.lookahead is not None:
            as_count(self.lookahead, "lookahead", 0)
            if self.lookahead > self.max_age:
                raise ValueError(
                    f"lookahead={self.lookahead} exceeds max_age={self.max_age}; generation may run at most "
                    "max_age steps ahead of training under pace, so pass lookahead <= max_age"
                )


def pace_limits(config: BufferConfig) -> tuple:
    """Returns the core's (prompts_per_step, lookahead) for ``config``: (0, 0) unless strategy='pace', where an
    unset lookahead is the max_age the buffer is built with (fixed from then on, as the core keeps it)."""
    if config.strategy != "pace":
        return 0, 0
    return config.prompts_per_step, config.max_age if config.lookahead is None else config.lookahead


def check_max_age_keeps_lookahead(config: BufferConfig, max_age: int) -> None:
    """Raises ValueError, before anything changes, if setting ``max_age`` would put it below an explicit lookahead."""
    if config.strategy == "pace" and config.lookahead is not None and max_age < config.lookahead:
        raise ValueError(
            f"max_age={max_age} is below lookahead={config.lookahead}; a paced buffer's lookahead never exceeds "
            "its max_age, so build it with a smaller lookahead to lower max_age this far"
        )


#: Largest prompts_per_step accepted (the core's kMaxPromptsPerStep).
PACE_MAX_PROMPTS_PER_STEP = 2**40


def as_source(value: Any, name: str = "source") -> int:
    """Returns ``value`` as a source tag in [0, MAX_SOURCE], or raises TypeError/ValueError naming ``name``."""
    return as_count(value, name, 0, MAX_SOURCE)


def source_max_age_pairs(value: Any) -> Optional[Tuple[Tuple[int, int], ...]]:
    """Returns ``{source: max_age}`` (or (source, max_age) pairs) as sorted pairs, None for None or empty;
    raises TypeError/ValueError naming the bad source or age."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in value):
        items = [tuple(p) for p in value]
    else:
        raise TypeError(f"source_max_age={value!r} is not a dict; pass {{source: max_age}}, e.g. {{1: 16}}")
    pairs = {}
    for source, age in items:
        pairs[as_source(source, "source_max_age source")] = as_count(age, f"source_max_age[{source}]", 0)
    return tuple(sorted(pairs.items())) or None


def config_from_arguments(arguments: Mapping[str, Any]) -> BufferConfig:
    """Returns the BufferConfig of a constructor's arguments (its ``locals()``), every field passed by keyword.

    Extra entries (``self``, ``pin_memory``, RemoteBuffer's Ray options) are ignored; a field the mapping
    lacks is a KeyError, which tests/test_signatures.py turns into "add it to the constructor's signature".
    """
    return BufferConfig(**{f.name: arguments[f.name] for f in dataclasses.fields(BufferConfig)})


#: Bytes one ready entry takes in the native ring (seven int64 and two int32 columns): the core's kBytesPerEntry.
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
    """Returns whether to pin host memory: ``None`` pins iff CUDA is available.

    torch is imported only where a GPU build of it is installed: a CPU-only (or missing) torch cannot pin, so
    ``None`` is False there without loading it (pyfast_buffer/_torch.py, docs/performance.md)."""
    if pin_memory not in (None, True, False):
        raise TypeError(f"pin_memory={pin_memory!r} must be None, True or False")
    cuda = _torch.cuda_available()
    if pin_memory and not cuda:
        raise ValueError("pin_memory=True needs CUDA, which is not available; pass pin_memory=None or False")
    return cuda if pin_memory is None else bool(pin_memory)
