"""Our own minimal stand-ins for the Miles types ``StalenessDataBuffer`` meets, for tests that run without Miles.

Miles (radixark/miles) is not on PyPI in a usable version, so CI cannot install it. These classes carry only the
names and fields our buffer reads or Miles hands it: the ``DataBuffer`` contract (``put``, ``get``,
``get_metrics``), its two inputs, a ``Sample`` with a status and per-turn weight versions, and the dynamic
filter's verdict. ``tests/miles_upstream/in_miles_checks.py`` compares each one with Miles's real class, so a
change in Miles shows up in the upstream runner, not as a silent drift here.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional


@dataclass
class Sample:
    """The fields of Miles's ``Sample`` that the data buffer touches."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    group_index: Optional[int] = None
    index: Optional[int] = None
    prompt: str = ""
    response: str = ""
    reward: Optional[float] = None
    status: Status = Status.PENDING
    weight_versions: List[str] = field(default_factory=list)

    @property
    def oldest_weight_version(self) -> Optional[int]:
        numbers = [int(v) for v in self.weight_versions if str(v).isdigit()]
        return min(numbers) if numbers else None

    def reset_for_retry(self) -> None:
        self.response, self.reward, self.status, self.weight_versions = "", None, Sample.Status.PENDING, []


@dataclass(frozen=True)
class DataBufferConstructorInput:
    args: Any
    unused_handler_fn: Callable[[List[Sample]], None]


@dataclass
class DataBufferInput:
    prompt_group: List[Sample]
    group: List[Any]


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: Optional[str] = None


class DataBuffer(abc.ABC):
    """Miles's contract: the producer puts finished groups, the consumer gets one at a time, metrics per step."""

    @abc.abstractmethod
    async def put(self, input: DataBufferInput) -> None: ...

    @abc.abstractmethod
    async def get(self, **context: Any) -> DataBufferInput: ...

    @abc.abstractmethod
    def get_metrics(self) -> Dict[str, float]: ...
