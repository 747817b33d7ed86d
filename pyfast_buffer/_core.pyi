# Hand-written stub of the native extension (csrc/bindings.cpp). Parameters bound without py::arg are
# positional-only ('/'); tests/test_core_stub.py checks that against the binding.
from typing import Optional, Tuple

import numpy as np
import numpy.typing as npt

AGE_BUCKETS: int
BYTES_PER_ENTRY: int
BATCH_COLUMNS: int

class BufferClosedError(ValueError): ...
class BufferFullError(RuntimeError): ...

_Stats = Tuple[int, int, int, int, str, int, int, Tuple[int, ...], int, int, int]

class Ring:
    def __init__(
        self,
        capacity: int,
        max_age: int,
        strategy: str,
        max_uses: int,
        on_full: str,
        parameter_sync_step: int,
        columns: Optional[tuple] = None,
    ) -> None: ...
    def dispatch(self, prompt_ids: npt.NDArray[np.int64], step: int, /) -> None: ...
    def complete(
        self, traj_ids: npt.NDArray[np.int64], prompt_ids: npt.NDArray[np.int64], timeout: Optional[float], /
    ) -> None: ...
    def fail(self, prompt_ids: npt.NDArray[np.int64], /) -> None: ...
    def put(
        self,
        traj_ids: npt.NDArray[np.int64],
        group_ids: Optional[npt.NDArray[np.int64]],
        sample_steps: npt.NDArray[np.int64],
        timeout: Optional[float],
        /,
    ) -> None: ...
    def take(
        self, out: npt.NDArray[np.int64], batch_size: int, current_step: int, timeout: Optional[float], /
    ) -> _Stats:
        """Writes BATCH_COLUMNS * k values to out (field by field) and returns the stats tuple."""
    def evict_stale(self, current_step: int, /) -> _Stats: ...
    def ledger(self) -> dict[str, int]: ...
    def __len__(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def borrows_columns(self) -> bool: ...
    def close(self) -> None: ...
    def export_state(self) -> dict: ...
    def import_state(self, state: dict, /) -> None: ...
