"""What both buffers share besides their storage: the configuration built from the constructor's arguments,
``from_verl``, the refusal to be copied, the context manager, ``save``/``load`` and the awaitable calls.

``StalenessBuffer`` and ``ReferenceBuffer`` keep their explicit signatures (for users, docs and type
checkers) and hand their ``locals()`` to ``_configure``, which reads every ``BufferConfig`` field by
keyword; tests/test_signatures.py checks each signature against ``dataclasses.fields(BufferConfig)``.
Adding a constructor argument is a field in ``BufferConfig`` plus one line in each signature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Type, TypeVar

from .aio import AsyncMethods
from .checkpoint import CheckpointMethods
from .config import BufferConfig, check_capacity_fits, config_from_arguments
from .errors import NO_COPY
from .verl_mapping import config_from_verl

_Buffer = TypeVar("_Buffer", bound="BufferBase")

#: Why take(bounded=False) is refused under pace (the core says the same).
UNBOUNDED_UNDER_PACE = (
    "bounded=False is refused under pace: its admission already promised every group the bound; take with the "
    "bound, or use strategy 'drop' or 'wait' for takes without it"
)


def check_bounded(bounded: Any, strategy: str) -> None:
    """Raises unless ``bounded`` is True or False, or if it is False under pace (a take without the age bound is a
    property of that one call; the buffer's max_age never changes for it)."""
    if bounded is not True and bounded is not False:
        raise TypeError(f"bounded={bounded!r} must be True (take under max_age) or False (this take without it)")
    if not bounded and strategy == "pace":
        raise ValueError(UNBOUNDED_UNDER_PACE)


class BufferBase(CheckpointMethods, AsyncMethods):
    """The base of StalenessBuffer and ReferenceBuffer (not a buffer by itself: it has no storage)."""

    config: BufferConfig

    def _configure(self, arguments: Mapping[str, Any]) -> BufferConfig:
        """Sets and returns ``config`` from a constructor's arguments, and checks that the ring fits this machine."""
        self.config = config_from_arguments(arguments)
        check_capacity_fits(self.config.capacity)
        return self.config

    @classmethod
    def from_verl(cls: Type[_Buffer], sampler_cfg: Any, trainer_cfg: Any, **overrides: Any) -> _Buffer:
        """Builds a buffer from verl's ``trainer.v1.sampler`` block and trainer config (see config_from_verl)."""
        return cls(**config_from_verl(sampler_cfg, trainer_cfg, **overrides))

    def close(self) -> None:
        raise NotImplementedError

    def __copy__(self) -> Any:
        raise TypeError(NO_COPY.format(cls=type(self).__name__))

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError(NO_COPY.format(cls=type(self).__name__))

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(NO_COPY.format(cls=type(self).__name__))

    def __enter__(self: _Buffer) -> _Buffer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
