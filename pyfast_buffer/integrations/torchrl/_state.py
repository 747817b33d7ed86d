"""The TorchRL sampler's state across a save, a load and a process boundary: TorchRL's ``state_dict`` /
``load_state_dict`` / ``dumps`` / ``loads`` hooks and pickling, as a mixin of ``StalenessSampler`` (which owns
the attributes read here: the core, the slot book, the counters). No torchrl import.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

from pyfast_buffer.integrations.torchrl._slots import SlotBook

STATE_FILE = "pyfast_buffer_sampler.pt"


class SamplerState:
    """``StalenessSampler``'s state hooks (the sampler defines ``_flush``, ``_new_core`` and the attributes)."""

    _flush: Any
    _new_core: Any
    _consumer_version: int
    _max_age: int
    _strategy: str
    _newest: int
    _core: Any
    _book: Optional[SlotBook]
    _pending: list
    _missing_key: bool
    _revision: Optional[int]
    _slots: Optional[int]

    def state_dict(self) -> Dict[str, Any]:
        self._flush()
        state: Dict[str, Any] = OrderedDict(
            consumer_version=self._consumer_version,
            max_age=self._max_age,
            strategy=self._strategy,
            newest_stamp=self._newest,
        )
        if self._core is not None and self._book is not None:
            state["core"] = self._core.state_dict()
            state["slots"] = {
                k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in self._book.state().items()
            }
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._consumer_version = int(state_dict["consumer_version"])
        self._max_age = int(state_dict["max_age"])
        self._newest = int(state_dict.get("newest_stamp", -1))
        self._pending.clear()
        self._missing_key, self._revision = False, None
        if "core" not in state_dict:
            self._core, self._book = None, None
            return
        slots = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in state_dict["slots"].items()}
        self._book = SlotBook.from_state(slots)
        self._slots = self._book.slots
        self._core = self._new_core(self._book.slots)
        self._core.load_state_dict(state_dict["core"])

    def dumps(self, path: Any) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / STATE_FILE)

    def loads(self, path: Any) -> None:
        self.load_state_dict(torch.load(Path(path) / STATE_FILE, weights_only=False))

    def __getstate__(self) -> Dict[str, Any]:
        self._flush()
        state: Dict[str, Any] = dict(super().__getstate__())  # type: ignore[misc]  # TorchRL's Sampler
        state["_recorded"], state["_marked"] = [], None
        # By value (numpy), not as tensors: a process spawned with this sampler would receive tensors as file
        # descriptors of shared memory that are closed once the pickling's temporaries are gone.
        state["_core_state"] = _mapped(self.state_dict(), lambda t: t.numpy()) if self._core is not None else None
        state["_core"], state["_book"] = None, None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        saved: Optional[Dict[str, Any]] = state.pop("_core_state", None)
        for name, value in state.items():
            setattr(self, name, value)
        if saved is not None:
            self.load_state_dict(_mapped(saved, torch.from_numpy, np.ndarray))


def _mapped(state: Any, convert: Any, kind: type = torch.Tensor) -> Any:
    """``state`` with every ``kind`` leaf converted (nested dicts, lists and tuples kept)."""
    if isinstance(state, kind):
        return convert(state)
    if isinstance(state, dict):
        return type(state)((k, _mapped(v, convert, kind)) for k, v in state.items())
    if isinstance(state, (list, tuple)):
        return type(state)(_mapped(v, convert, kind) for v in state)
    return state
