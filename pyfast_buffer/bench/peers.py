"""The contenders: our buffer, the reference twin, and the peers a user would otherwise reach for.

Every contender stores the same eight columns per entry (traj id, group id, sample step, policy
version, dispatch and completion stamps as int64; uses and group length as int32) and does the
same work per call, so the timings compare like for like. Optional peers report why they are
unavailable instead of failing the run.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..buffer import StalenessBuffer
from ..reference import ReferenceBuffer

WIDE = ("traj_id", "group_id", "sample_step", "policy_version", "dispatch_ns", "complete_ns")
NARROW = ("uses", "group_len")
BYTES_PER_ENTRY = 8 * len(WIDE) + 4 * len(NARROW)
#: Bytes of one entry in a batch (eight int64 fields): the copy that is the floor of put and take.
FLOOR_BYTES = 64


def unavailable(module: str, extra: str = "bench") -> Optional[str]:
    """Returns None if ``module`` imports, else the reason it is skipped."""
    try:
        importlib.import_module(module)
    except Exception as exc:
        return f"{module} not importable ({type(exc).__name__}: {exc}); pip install 'pyfast_buffer[{extra}]'"
    return None


class Ours:
    """pyfast_buffer.StalenessBuffer (the native core)."""

    name = "pyfast_buffer"
    cls: Callable = StalenessBuffer

    def __init__(self, capacity: int, max_age: int) -> None:
        self.buf = self.cls(capacity, max_age=max_age)

    def put(self, ids: np.ndarray, step: int) -> None:
        self.buf.put(ids, step)

    def fill(self, ids: np.ndarray, steps: np.ndarray) -> None:
        self.buf.put(ids, steps)

    def take(self, batch_size: int, step: int) -> int:
        return len(self.buf.take(batch_size, step).traj_ids)  # the ids, as a tensor: what a trainer reads

    def evict(self, step: int) -> int:
        return self.buf.evict_stale(step)

    def __len__(self) -> int:
        return len(self.buf)


class OursTorch(Ours):
    """pyfast_buffer.StalenessBuffer fed torch tensors, as a training loop holds its ids (made once per id array,
    untimed: the loop has them already)."""

    name = "pyfast_buffer torch in"

    def __init__(self, capacity: int, max_age: int) -> None:
        super().__init__(capacity, max_age)
        self._tensors: Dict[int, Any] = {}

    def _tensor(self, ids: np.ndarray) -> Any:
        found = self._tensors.get(id(ids))
        if found is None or found[0] is not ids:
            found = self._tensors[id(ids)] = (ids, torch.from_numpy(ids))
        return found[1]

    def put(self, ids: np.ndarray, step: int) -> None:
        self.buf.put(self._tensor(ids), step)

    def fill(self, ids: np.ndarray, steps: Any) -> None:
        self.buf.put(self._tensor(ids), self._tensor(steps) if isinstance(steps, np.ndarray) else steps)


class Reference(Ours):
    """pyfast_buffer.ReferenceBuffer: a deque of records, the plain way (the baseline)."""

    name = "reference"
    cls = ReferenceBuffer


class NumpyRing:
    """Numpy columns with head/tail cursors; take and evict use one vectorised mask pass."""

    name = "numpy mask"

    def __init__(self, capacity: int, max_age: int) -> None:
        self.capacity, self.max_age = capacity, max_age
        self.storage = 2 * capacity  # slack, so shifting the live region left is amortised O(1) per entry
        self.cols: Dict[str, np.ndarray] = {k: np.zeros(self.storage, np.int64) for k in WIDE}
        self.cols.update({k: np.zeros(self.storage, np.int32) for k in NARROW})
        self.head = self.tail = 0

    def __len__(self) -> int:
        return self.tail - self.head

    def _make_room(self, n: int) -> None:
        self.head = max(self.head, self.tail + n - self.capacity)  # a full ring drops its oldest
        self.head = min(self.head, self.tail)
        if self.tail + n <= self.storage:
            return
        live = slice(self.head, self.tail)
        for col in self.cols.values():  # shift the live region to the front
            col[: self.tail - self.head] = col[live]
        self.tail -= self.head
        self.head = 0

    def put(self, ids: np.ndarray, step) -> None:
        n = len(ids)
        self._make_room(n)
        at = slice(self.tail, self.tail + n)
        c = self.cols
        c["traj_id"][at] = ids
        c["group_id"][at] = ids
        c["sample_step"][at] = step
        c["policy_version"][at] = -1
        c["dispatch_ns"][at] = 0
        c["complete_ns"][at] = 0
        c["uses"][at] = 0
        c["group_len"][at] = 1
        self.tail += n

    fill = put

    def take(self, batch_size: int, step: int) -> int:
        live = slice(self.head, self.tail)
        fresh = np.flatnonzero(self.cols["sample_step"][live] >= step - self.max_age)[:batch_size]
        out = {k: col[live][fresh] for k, col in self.cols.items()}  # the gather of the batch
        walked = int(fresh[-1]) + 1 if len(fresh) == batch_size else self.tail - self.head
        self.head += walked
        return len(out["traj_id"])

    def evict(self, step: int) -> int:
        live = slice(self.head, self.tail)
        keep = self.cols["sample_step"][live] >= step - self.max_age
        kept = int(np.count_nonzero(keep))
        for col in self.cols.values():
            col[self.head : self.head + kept] = col[live][keep]
        removed = self.tail - self.head - kept
        self.tail = self.head + kept
        return removed


class NumbaRing(NumpyRing):
    """The same numpy columns, with take and evict as numba-jitted loops."""

    name = "numba loop"
    _kernels: Optional[Tuple[Callable, Callable]] = None

    @classmethod
    def kernels(cls) -> Tuple[Callable, Callable]:
        if cls._kernels is None:
            import numba

            @numba.njit(cache=False, nogil=True)
            def take_walk(steps, head, tail, cutoff, batch_size, cols64, cols32, out64, out32):
                k = 0
                i = head
                while i < tail and k < batch_size:
                    if steps[i] >= cutoff:
                        for c in range(cols64.shape[0]):
                            out64[c, k] = cols64[c, i]
                        for c in range(cols32.shape[0]):
                            out32[c, k] = cols32[c, i]
                        k += 1
                    i += 1
                return k, i

            @numba.njit(cache=False, nogil=True)
            def compact(steps, head, tail, cutoff, cols64, cols32):
                w = head
                for i in range(head, tail):
                    keep = steps[i] >= cutoff
                    for c in range(cols64.shape[0]):
                        cols64[c, w] = cols64[c, i]
                    for c in range(cols32.shape[0]):
                        cols32[c, w] = cols32[c, i]
                    w += keep
                return w

            cls._kernels = (take_walk, compact)
        return cls._kernels

    def __init__(self, capacity: int, max_age: int) -> None:
        super().__init__(capacity, max_age)
        # 2-D blocks so one jitted loop moves every column of a row.
        self.block64 = np.zeros((len(WIDE), self.storage), np.int64)
        self.block32 = np.zeros((len(NARROW), self.storage), np.int32)
        self.cols = {k: self.block64[i] for i, k in enumerate(WIDE)}
        self.cols.update({k: self.block32[i] for i, k in enumerate(NARROW)})
        self.kernels()

    def take(self, batch_size: int, step: int) -> int:
        take_walk, _ = self.kernels()
        rows = min(batch_size, self.capacity)
        out64 = np.empty((len(WIDE), rows), np.int64)
        out32 = np.empty((len(NARROW), rows), np.int32)
        k, self.head = take_walk(
            self.cols["sample_step"],
            self.head,
            self.tail,
            step - self.max_age,
            batch_size,
            self.block64,
            self.block32,
            out64,
            out32,
        )
        return int(k)

    def evict(self, step: int) -> int:
        _, compact = self.kernels()
        before = self.tail
        self.tail = int(
            compact(self.cols["sample_step"], self.head, self.tail, step - self.max_age, self.block64, self.block32)
        )
        return before - self.tail


class Cpprb:
    """cpprb 11 ReplayBuffer with the same eight fields; take is sample + a staleness mask."""

    name = "cpprb"

    def __init__(self, capacity: int, max_age: int) -> None:
        import cpprb

        env: Dict[str, Dict[str, type]] = {k: {"dtype": np.int64} for k in WIDE}
        env.update({k: {"dtype": np.int32} for k in NARROW})
        self.rb = cpprb.ReplayBuffer(capacity, env)
        self.max_age = max_age
        self._consts: Dict[int, Dict[str, np.ndarray]] = {}

    def _fields(self, ids: np.ndarray, step) -> Dict[str, np.ndarray]:
        n = len(ids)
        if n not in self._consts:  # built once, outside the timed calls: generous to cpprb
            self._consts[n] = {k: np.zeros(n, np.int64) for k in ("policy_version", "dispatch_ns", "complete_ns")}
            self._consts[n].update(uses=np.zeros(n, np.int32), group_len=np.ones(n, np.int32))
        steps = np.broadcast_to(np.asarray(step, np.int64), (n,))
        return dict(traj_id=ids, group_id=ids, sample_step=steps, **self._consts[n])

    def put(self, ids: np.ndarray, step) -> None:
        self.rb.add(**self._fields(ids, step))

    fill = put

    def take(self, batch_size: int, step: int) -> int:
        sample = self.rb.sample(batch_size)
        fresh = sample["sample_step"][:, 0] >= step - self.max_age
        return int(np.count_nonzero(fresh))

    def __len__(self) -> int:
        return int(self.rb.get_stored_size())


class Cpprb2(Cpprb):
    """cpprb 11 set up as a user would for this job: two fields, ``idx`` and ``step``; take is sample + mask."""

    name = "cpprb 2 fields"

    def __init__(self, capacity: int, max_age: int) -> None:
        import cpprb

        self.rb = cpprb.ReplayBuffer(capacity, {"idx": {"dtype": np.int64}, "step": {"dtype": np.int64}})
        self.max_age = max_age

    def put(self, ids: np.ndarray, step) -> None:
        self.rb.add(idx=ids, step=np.broadcast_to(np.asarray(step, np.int64), (len(ids),)))

    fill = put

    def take(self, batch_size: int, step: int) -> int:
        sample = self.rb.sample(batch_size)
        return int(np.count_nonzero(sample["step"][:, 0] >= step - self.max_age))


class CpprbFull(Cpprb):
    """cpprb doing the same work as take: sample + mask repeated until B fresh entries are in hand."""

    name = "cpprb to full"

    def take(self, batch_size: int, step: int) -> int:
        got = []
        have = 0
        for _ in range(10_000):  # bounded: a ring with no fresh entry never fills a batch
            sample = self.rb.sample(batch_size)
            fresh = sample["sample_step"][:, 0] >= step - self.max_age
            got.append(sample["traj_id"][fresh, 0])
            have += int(np.count_nonzero(fresh))
            if have >= batch_size:
                break
        return min(have, batch_size) if got else 0


class TorchRL:
    """TorchRL ReplayBuffer + LazyTensorStorage + StalenessAwareSampler(max_staleness)."""

    name = "torchrl"

    def __init__(self, capacity: int, max_age: int) -> None:
        import logging

        from torchrl.data import LazyTensorStorage, ReplayBuffer
        from torchrl.data.replay_buffers.samplers import StalenessAwareSampler

        logging.getLogger("torchrl").setLevel(logging.WARNING)
        self.sampler = StalenessAwareSampler(max_staleness=max_age)
        self.rb = ReplayBuffer(storage=LazyTensorStorage(capacity), sampler=self.sampler)
        self._tds: Dict[Tuple[int, int], object] = {}

    def _td(self, ids: np.ndarray, step):
        import torch
        from tensordict import TensorDict

        key = (len(ids), id(ids))
        if key not in self._tds:  # built once, outside the timed calls: generous to torchrl
            n = len(ids)
            t = torch.from_numpy(ids)
            steps = torch.as_tensor(np.broadcast_to(np.asarray(step, np.int64), (n,)).copy())
            zeros = torch.zeros(n, dtype=torch.int64)
            self._tds[key] = TensorDict(
                {
                    "traj_id": t,
                    "group_id": t,
                    "sample_step": steps,
                    "policy_version": steps,
                    "dispatch_ns": zeros,
                    "complete_ns": zeros,
                    "uses": torch.zeros(n, dtype=torch.int32),
                    "group_len": torch.ones(n, dtype=torch.int32),
                },
                batch_size=[n],
            )
        return self._tds[key]

    def put(self, ids: np.ndarray, step) -> None:
        td: Any = self._td(ids, step)
        if not np.isscalar(step):
            td = td.clone()
        else:
            td["policy_version"].fill_(step)
        self.rb.extend(td)

    fill = put

    def take(self, batch_size: int, step: int) -> int:
        self.sampler.consumer_version = step
        return int(self.rb.sample(batch_size).batch_size[0])

    def __len__(self) -> int:
        return len(self.rb)


class EventFloor:
    """A bare threading.Event handoff: the operating system's and the GIL's wake-up floor."""

    name = "threading.Event floor"


class Copy:
    """The physical floor of put and take: numpy.copyto of 64 bytes (one batch row) per entry, B entries."""

    name = "copy (floor)"

    def __init__(self, capacity: int, max_age: int = 0) -> None:
        self.rows = min(capacity, 1 << 16)  # the largest batch any case copies
        self.src = np.ones(self.rows * FLOOR_BYTES, np.uint8)
        self.dst = np.empty_like(self.src)
        self.capacity = capacity

    def _copy(self, n: int) -> int:
        np.copyto(self.dst[: n * FLOOR_BYTES], self.src[: n * FLOOR_BYTES])
        return n

    def put(self, ids: np.ndarray, step) -> None:
        self._copy(len(ids))

    def fill(self, ids: np.ndarray, steps) -> None:
        pass

    def take(self, batch_size: int, step: int) -> int:
        return self._copy(min(batch_size, self.rows))

    def __len__(self) -> int:
        return self.capacity


class Memcpy:
    """numpy.copyto of the same bytes: the bandwidth limit of any one-pass compaction."""

    name = "memcpy"

    def __init__(self, capacity: int, max_age: int = 0) -> None:
        self.src = np.ones(capacity * BYTES_PER_ENTRY, np.uint8)
        self.dst = np.empty_like(self.src)

    def evict(self, step: int) -> int:
        np.copyto(self.dst, self.src)
        return 0


class MemcpyIdsSteps:
    """numpy.copyto of the ids and the steps alone (16 bytes an entry): issue 50's yardstick for evict_stale."""

    name = "memcpy ids+steps"

    def __init__(self, capacity: int, max_age: int = 0) -> None:
        self.src = np.ones((2, capacity), np.int64)
        self.dst = np.empty_like(self.src)

    def evict(self, step: int) -> int:
        np.copyto(self.dst[0], self.src[0])
        np.copyto(self.dst[1], self.src[1])
        return 0


PEERS: Dict[str, Tuple[type, Optional[str]]] = {
    "pyfast_buffer": (Ours, None),
    "pyfast_buffer torch in": (OursTorch, None),
    "reference": (Reference, None),
    "numpy mask": (NumpyRing, None),
    "numba loop": (NumbaRing, "numba"),
    "cpprb": (Cpprb, "cpprb"),
    "cpprb 2 fields": (Cpprb2, "cpprb"),
    "cpprb to full": (CpprbFull, "cpprb"),
    "torchrl": (TorchRL, "torchrl"),
    "memcpy": (Memcpy, None),
    "memcpy ids+steps": (MemcpyIdsSteps, None),
    "copy (floor)": (Copy, None),
}


def available(names: List[str]) -> Tuple[List[Any], Dict[str, str]]:
    """Returns the importable contenders among ``names`` and, for the others, why they are skipped."""
    found: List[Any] = []
    skipped: Dict[str, str] = {}
    for name in names:
        cls, module = PEERS[name]
        reason = unavailable(module) if module else None
        if reason:
            skipped[name] = reason
        else:
            found.append(cls)
    return found, skipped
