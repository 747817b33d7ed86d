# Hand-written stub of the native extension (csrc/bindings.cpp). Parameters bound without py::arg are
# positional-only ('/'); tests/test_core_stub.py checks that against the binding.
from typing import Any, Dict, Optional, Tuple

import numpy as np
import numpy.typing as npt

AGE_BUCKETS: int
BYTES_PER_ENTRY: int
BATCH_COLUMNS: int

class BufferClosedError(ValueError): ...
class BufferFullError(RuntimeError): ...
class AdmissionError(BufferFullError): ...
class WouldBlock(TimeoutError): ...

PROBE_TIMEOUT: float

_Stats = Tuple[
    int,
    int,
    int,
    int,
    str,
    int,
    int,
    Tuple[int, ...],
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    int,
    Tuple[int, ...],
    Tuple[tuple, ...],
    int,
    int,
    int,
]

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
        track_released: bool = False,
        release_bound: int = 0,
        unique_ids: bool = False,
        prompts_per_step: int = 0,
        lookahead: int = 0,
        age_from: str = "start",
        max_attempts: int = 0,
        attempts_bound: int = 0,
    ) -> None: ...
    def released(self) -> Tuple[npt.NDArray[np.int64], npt.NDArray[np.int8]]: ...
    def dispatch(
        self,
        prompt_ids: npt.NDArray[np.int64],
        step: int,
        lease: Optional[float] = None,
        timeout: Optional[float] = None,
        slots: Optional[npt.NDArray[np.int32]] = None,
    ) -> None: ...
    def admissible(self, step: int, /) -> int: ...
    def renew(self, prompt_ids: npt.NDArray[np.int64], lease: float, /) -> None: ...
    def restamp_in_flight(self, step: int, /) -> int: ...
    def expire_in_flight(self, older_than_s: float, /) -> int: ...
    def _set_lease_clock(self, now_ns: Optional[int], /) -> None: ...
    def complete(
        self,
        traj_ids: npt.NDArray[np.int64],
        prompt_ids: npt.NDArray[np.int64],
        timeout: Optional[float] = None,
        finish_steps: Optional[npt.NDArray[np.int64]] = None,
        lengths: Optional[npt.NDArray[np.int64]] = None,
    ) -> None: ...
    def fail(self, prompt_ids: npt.NDArray[np.int64], /) -> None: ...
    def put(
        self,
        traj_ids: npt.NDArray[np.int64],
        group_ids: Optional[npt.NDArray[np.int64]],
        sample_steps: npt.NDArray[np.int64],
        timeout: Optional[float] = None,
        finish_steps: Optional[npt.NDArray[np.int64]] = None,
        slots: Optional[npt.NDArray[np.int32]] = None,
    ) -> None: ...
    def put_one_stamp(self, traj_ids: npt.NDArray[np.int64], sample_step: int, timeout: Optional[float], /) -> None:
        """put of ungrouped ids under one stamp."""
    def put_tensor(self, traj_ids: Any, int64_dtype: Any, sample_step: int, timeout: Optional[float], /) -> bool:
        """put_one_stamp from a 1-d contiguous CPU int64 tensor, read through its data pointer; False, having done
        nothing, for any other tensor."""
    def take(
        self,
        out: npt.NDArray[np.int64],
        batch_size: int,
        current_step: int,
        timeout: Optional[float],
        bounded: bool = True,
        /,
    ) -> _Stats:
        """Writes BATCH_COLUMNS * k values to out (field by field) and returns the stats tuple; ``bounded`` False
        takes without max_age for this call only (refused under pace)."""
    def evict_stale(self, current_step: int, /) -> _Stats: ...
    def evict_oldest(self, groups: int, /) -> int: ...
    def ledger(self) -> dict[str, int]: ...
    def set_source_max_age(self, source: int, max_age: int, /) -> None: ...
    def source_max_ages(self) -> Dict[int, int]: ...
    def starved(self, min_attempts: int, /) -> Dict[int, int]: ...
    def attempts(self) -> Tuple[Tuple[int, ...], Dict[int, int]]: ...
    def source_counts(self) -> npt.NDArray[np.int64]: ...
    def bias(self) -> Optional[tuple]: ...
    def __len__(self) -> int: ...
    @property
    def max_age(self) -> int: ...
    @max_age.setter
    def max_age(self, value: int) -> None: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def borrows_columns(self) -> bool: ...
    def close(self) -> None: ...
    def set_wake_fd(self, fd: int) -> None: ...
    def arm_wake(self) -> None: ...
    def next_lease_deadline_ns(self) -> int: ...
    def begin_admission_wait(self, prompt_ids: npt.NDArray[np.int64]) -> bool: ...
    def end_admission_wait(self, protected_call: bool) -> None: ...
    def export_state(self) -> dict: ...
    def export_delta(self, full: bool) -> dict: ...
    def import_state(self, state: dict, /) -> None: ...
