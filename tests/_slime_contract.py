"""Our own minimal stand-ins for the slime pieces the slime integration touches (CI cannot fetch slime; slime is
not on PyPI): the ``DataSource`` ABC, the ``Sample`` fields we read, a prompt source that behaves as
``RolloutDataSourceWithBuffer`` does with no dataset, and ``RolloutFnTrainOutput``. Written by us from slime's
interfaces at 624b824a8; ``tests/slime_upstream/in_slime_checks.py`` checks them against slime's real classes.
"""

from __future__ import annotations

import abc
import types
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional


@dataclass
class Sample:
    """The fields of slime's ``Sample`` we use, with slime's names and defaults."""

    group_index: Optional[int] = None
    index: Optional[int] = None
    prompt: Any = ""
    response: str = ""
    reward: Any = None
    weight_versions: List[str] = field(default_factory=list)

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)


class DataSource(abc.ABC):
    """slime's abstract data source: its five methods and their parameter names."""

    @abc.abstractmethod
    def get_samples(self, num_samples: int) -> List[List[Sample]]: ...

    @abc.abstractmethod
    def add_samples(self, samples: List[List[Sample]]): ...

    @abc.abstractmethod
    def save(self, rollout_id): ...

    @abc.abstractmethod
    def load(self, rollout_id=None): ...

    @abc.abstractmethod
    def __len__(self) -> int: ...


def pop_first(args: Any, rollout_id: Any, buffer: List[List[Sample]], num_samples: int) -> List[List[Sample]]:
    taken = buffer[:num_samples]
    del buffer[:num_samples]
    return taken


class RolloutDataSourceWithBuffer(DataSource):
    """Prompts numbered 0, 1, ... (slime's source with no dataset hands out fresh ``Sample()`` groups, numbered the
    same way), behind a requeue buffer read first through ``buffer_filter``. ``handed`` counts every prompt group it
    made, so a test can check that none is lost. ``save``/``load`` are no-ops here, as slime's are without
    ``--rollout-global-dataset`` state to write."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.buffer: List[List[Sample]] = []
        self.buffer_filter = pop_first
        self.handed = 0
        self.next_index = 0

    def get_samples(self, num_samples: int) -> List[List[Sample]]:
        groups = self.buffer_filter(self.args, None, self.buffer, num_samples) if self.buffer else []
        while len(groups) < num_samples:
            group = []
            for _ in range(self.args.n_samples_per_prompt):
                group.append(Sample(group_index=self.handed, index=self.next_index, prompt=f"p{self.handed}"))
                self.next_index += 1
            self.handed += 1
            groups.append(group)
        return groups

    def add_samples(self, samples: List[List[Sample]]) -> None:
        for group in samples:
            assert len(group) == self.args.n_samples_per_prompt
            self.buffer.append(group)

    def save(self, rollout_id: Any) -> None:
        pass

    def load(self, rollout_id: Any = None) -> None:
        pass

    def __len__(self) -> int:
        return 0


@dataclass
class RolloutFnTrainOutput:
    samples: List[List[Sample]]
    metrics: Optional[Dict[str, Any]] = None


def slime_modules() -> Dict[str, types.ModuleType]:
    """These copies as the ``slime`` modules our ``_source.py`` imports, for ``sys.modules`` in a test."""
    root, rollout = types.ModuleType("slime"), types.ModuleType("slime.rollout")
    data_source = types.ModuleType("slime.rollout.data_source")
    data_source.DataSource = DataSource
    data_source.RolloutDataSourceWithBuffer = RolloutDataSourceWithBuffer
    root.__path__, rollout.__path__ = [], []
    return {"slime": root, "slime.rollout": rollout, "slime.rollout.data_source": data_source}
