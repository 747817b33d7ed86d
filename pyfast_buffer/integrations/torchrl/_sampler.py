"""``StalenessSampler``: pyfast_buffer as a TorchRL replay-buffer ``Sampler``.

Each dim-0 slot of the storage is one entry of our core, stamped with the policy version of its data
(``version_key``, written by TorchRL's ``PolicyVersion`` transform or a collector's ``track_policy_version``) when
the buffer writes it (``mark_update``, which TorchRL's writers call with the storage after the data is in).
``sample`` is the core's ``take`` at ``consumer_version``: the stalest entries within ``max_age`` first, whole
groups (``group_key``), each used up to ``max_uses`` times, counted in the core's ledger; it never blocks (TorchRL
samples under the buffer's write lock: a wait there would stall the collector that brings the data).

- ``drop``: entries past ``max_age`` leave, counted ``dropped_stale``; a sample with nothing fresh raises.
- ``wait``: nothing is dropped; entries past ``max_age`` are still sampled, stalest first, and counted
  ``trained_over_age`` (TorchRL's collectors have no in-flight view the trainer could wait on).

Writes by another process (a shared buffer filled by collector workers, which write through their own copy of
the sampler) are found at the next ``sample``: every copy counts its writes per slot in one shared-memory tensor
(``_writes``, handed to a spawned process as shared memory), and a slot whose count moved since this copy last
looked was rewritten, whatever its version (a rewrite at the same ``policy_version`` was missed when only the
version column was compared, issue 59). The storage's mutation revision says when to look.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.utils import unravel_index

from pyfast_buffer.buffer import StalenessBuffer
from pyfast_buffer.integrations._common import ages_metrics, buffer_metrics
from pyfast_buffer.integrations.torchrl._slots import NO_ENTRY, SlotBook
from pyfast_buffer.integrations.torchrl._state import SamplerState
from pyfast_buffer.integrations.torchrl._storage import (
    column,
    column_values,
    dim0_capacity,
    dim0_len,
    inner_cells,
    written_slots,
)

logger = logging.getLogger("pyfast_buffer.torchrl")

EMPTY_STORAGE = "Cannot sample from an empty storage."  # TorchRL's samplers' words
STRATEGIES = ("drop", "wait")
#: Entries of the core per storage slot: room for the ghosts of writes out of round-robin order.
CORE_PER_SLOT = 2


class StalenessSampler(SamplerState, Sampler):
    """A TorchRL ``Sampler`` that trains only fresh-enough data and accounts for every entry (module docstring).

    Args:
        max_age: the bound, in consumer versions (StalenessAwareSampler's ``max_staleness``).
        strategy: ``"drop"`` (the default) or ``"wait"``.
        version_key: the data's policy-version key; None stamps each write with ``consumer_version``.
        consumer_version: the trainer's version (set it after each weight update, or ``increment_consumer_version``).
        group_key: a key of group ids (e.g. one per prompt): a group is sampled whole, or not at all.
        max_uses: how many times an entry is sampled before it retires (1: each entry once).
        length_key: a key of response lengths, for the bias monitor (``metrics()``).
        info_key: the key of each sampled entry's age in ``info`` (None: no info).
        shuffle: shuffle a batch's order (the core takes stalest first).
    """

    def __init__(
        self,
        max_age: int = 7,
        *,
        strategy: str = "drop",
        version_key: Any = "policy_version",
        consumer_version: int = 0,
        group_key: Any = None,
        max_uses: int = 1,
        length_key: Any = None,
        info_key: Optional[str] = "staleness",
        shuffle: bool = True,
        **unknown: Any,
    ) -> None:
        if "max_staleness" in unknown:
            raise TypeError("StalenessSampler takes max_age= (StalenessAwareSampler's max_staleness); rename it")
        if unknown:
            raise TypeError(f"StalenessSampler got unknown arguments {sorted(unknown)}")
        if strategy not in STRATEGIES:
            hint = " (pace needs an admission call before each rollout; TorchRL's collectors have none)"
            raise ValueError(
                f"strategy={strategy!r}: use one of {list(STRATEGIES)}{hint if strategy == 'pace' else ''}"
            )
        for name, value, minimum in (("max_age", max_age, 0), ("max_uses", max_uses, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
        self._max_age = max_age
        self._strategy = strategy
        self._version_key = version_key
        self._consumer_version = int(consumer_version)
        self._group_key = group_key
        self._max_uses = max_uses
        self._length_key = length_key
        self._info_key = info_key
        self._shuffle = bool(shuffle)
        self._core: Optional[StalenessBuffer] = None
        self._book: Optional[SlotBook] = None
        self._missing_key = False
        self._pending: list = []  # slots an extend named without mark_update (read at the next sample)
        self._marked: Any = None  # the index mark_update just wrote (extend follows with it)
        self._recorded: list = []  # (index, stamps) of writes not applied to the core yet (``_record``)
        self._recorded_rows = 0
        self._slots: Optional[int] = None  # the storage's dim-0 slots
        self._revision: Optional[int] = None  # the storage's mutation revision once our writes are applied
        self._newest = -1  # the newest stamp written (see _step)
        self._ran_out = False
        self._writes: Optional[torch.Tensor] = None  # writes per slot by every copy (shared memory; module docs)
        self._seen: Optional[np.ndarray] = None  # this copy's view of ``_writes`` once applied
        self.last_ages: list = []

    #: TorchRL's replay buffer prefetches ``min(_remaining_batches, prefetch)`` batches in a thread pool, sampled
    #: before the trainer moves ``consumer_version``: a prefetched batch was judged fresh at an older version and
    #: came back stale (issue 59). Zero turns prefetch off: each batch is drawn when ``sample`` is called.
    _remaining_batches = 0

    # ---- StalenessAwareSampler's conventions ----------------------------------------------------------------
    @property
    def ran_out(self) -> bool:
        """True after a sample left nothing to sample at the current version (TorchRL's iteration ends)."""
        return self._ran_out

    @ran_out.setter
    def ran_out(self, value: bool) -> None:
        self._ran_out = bool(value)

    @property
    def consumer_version(self) -> int:
        return self._consumer_version

    @consumer_version.setter
    def consumer_version(self, value: int) -> None:
        self._consumer_version = int(value)

    def increment_consumer_version(self) -> None:
        self._consumer_version += 1

    @property
    def max_age(self) -> int:
        return self._max_age

    @max_age.setter
    def max_age(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"max_age={value!r} must be an int >= 0")
        self._max_age = value
        if self._core is not None:
            self._core.max_age = value

    # ---- the core -------------------------------------------------------------------------------------------
    def _ensure(self, storage: Any) -> Tuple[StalenessBuffer, SlotBook]:
        return self._ensure_slots(dim0_capacity(storage))

    def _ensure_slots(self, slots: int) -> Tuple[StalenessBuffer, SlotBook]:
        self._slots = slots
        self._ensure_writes(slots)  # before any copy is sent to another process
        if self._core is None or self._book is None:
            self._core, self._book = self._new_core(slots), SlotBook(slots)
        return self._core, self._book

    def _new_core(self, slots: int) -> StalenessBuffer:
        """The core for a storage of ``slots`` dim-0 slots: room for each slot's entry and the ghosts."""
        return StalenessBuffer(
            CORE_PER_SLOT * slots,
            max_age=self._max_age,
            strategy=self._strategy,
            max_uses=self._max_uses,
            on_full="evict_oldest",
            pin_memory=False,
            track_released=True,
        )

    # ---- the write path -------------------------------------------------------------------------------------
    def _ensure_writes(self, slots: int) -> None:
        """The shared per-slot write counts (module docstring), for a storage of ``slots`` dim-0 slots."""
        if self._writes is None or len(self._writes) != slots:
            self._writes = torch.zeros(slots, dtype=torch.int64).share_memory_()
            self._seen = np.zeros(slots, np.int64)

    def _count_writes(self, storage: Any, slots: np.ndarray) -> None:
        """Counts a write of this copy in the shared per-slot counts, and as seen by this copy."""
        self._ensure_writes(dim0_capacity(storage))
        assert self._writes is not None and self._seen is not None
        index = torch.from_numpy(slots)
        if len(index):
            self._writes[index] += 1
            self._seen[slots] = self._writes[index].numpy()

    def mark_update(self, index: Any, *, storage: Any = None) -> None:
        if storage is None:
            return
        self._count_writes(storage, written_slots(index))
        if not self._record(storage, index):
            self._flush()  # in write order: what was recorded goes first
            self._write(storage, written_slots(index))
        self._revision = _revision(storage)
        self._marked = index

    def _record(self, storage: Any, index: Any) -> bool:
        """The common write (TorchRL's default writers, ungrouped, a tensor storage) is recorded, its stamps read
        now, and applied to the core with the writes after it at the next ``sample`` (or ledger, state, ...):
        in one pass, so a write costs the buffer a gather of its stamps. False: not this case."""
        if (
            self._group_key is not None
            or self._length_key is not None
            or not isinstance(index, torch.Tensor)
            or index.ndim != 1
            or index.dtype != torch.int64
            or index.device.type != "cpu"
            or (len(index) and int(index.min()) < 0)  # a max-value writer's -1: a row it did not write
        ):
            return False
        if self._version_key is None:
            stamps = torch.full_like(index, self._consumer_version)
        else:
            values = column_values(storage, self._version_key)
            if values is None:
                return False
            stamps = values[index]
            if stamps.ndim != 1:
                return False
        if self._slots is None:
            self._slots = dim0_capacity(storage)
        self._missing_key = False
        self._recorded.append((index, stamps))
        self._recorded_rows += len(index)
        if self._recorded_rows >= self._slots:  # a storage's worth: apply them (a bound on what waits)
            self._flush()
        return True

    def _flush(self) -> None:
        """Applies the recorded writes to the core, in order, with what each would have done applied alone: a
        run of writes that continue one another goes as one round-robin write when it is one; anything else
        goes write by write. (Merged whole, two writes wrapping round were one write that overwrote itself, and
        the ledger changed with when it was read.)"""
        if not self._recorded:
            return
        assert self._slots is not None
        recorded, self._recorded, self._recorded_rows = self._recorded, [], 0
        self._ensure_slots(self._slots)
        run: list = []
        for index, stamps in recorded:
            if run and not _continues(run[-1][0], index):
                self._apply_run(run)
                run = []
            run.append((index, _int64(stamps)))
        self._apply_run(run)

    def _apply_run(self, run: list) -> None:
        """Writes that continue one another: one round-robin write if they make one, else each alone, in order."""
        if len(run) > 1:
            slots, stamps = torch.cat([i for i, _ in run]).numpy(), torch.cat([t for _, t in run]).numpy()
            if len(stamps):
                self._newest = max(self._newest, int(stamps.max()))
            if self._apply_round_robin(slots, stamps):
                return
        for index, stamps_t in run:
            slots, stamps = index.numpy(), stamps_t.numpy()
            if len(stamps):
                self._newest = max(self._newest, int(stamps.max()))
            if not self._apply_round_robin(slots, stamps):
                self._apply(slots, stamps)

    def extend(self, index: Any) -> None:
        # The writer called mark_update (with the storage) first; a path that did not leaves them to sample().
        marked, self._marked = self._marked, None
        if marked is index:
            return
        slots = written_slots(index)
        if marked is None or not np.array_equal(written_slots(marked), slots):
            self._pending.append(slots)

    def add(self, index: Any) -> None:
        self.extend(index)

    def _apply_round_robin(self, slots: np.ndarray, stamps: np.ndarray) -> bool:
        """The common write in few array operations: the slots continue the cursor without wrapping, and no ghost
        is in the core, so the live entries of these slots are the core's oldest and ``evict_oldest`` of their
        count removes exactly them. False: not this case (``_apply`` does it)."""
        book, core = self._book, self._core
        assert book is not None and core is not None
        n, start = len(slots), book.cursor
        end = start + n
        if book.ghosts or n == 0 or end > book.slots:
            return False
        if slots[0] != start or slots[-1] != end - 1 or not np.array_equal(slots, book.arange[start:end]):
            return False
        live = n - int(np.count_nonzero(book.entry[start:end] == NO_ENTRY))
        if live:  # the storage overflowed before these were sampled: they leave as evicted
            core.evict_oldest(live)
        generation = book.generation[start:end]
        generation += 1
        ids = generation * book.slots + slots
        book.entry[start:end] = ids
        book.stamp[start:end] = stamps
        book.cursor = end % book.slots
        core.put(ids, stamps)
        core.released()  # drained: what left is exactly these slots' old entries, already replaced above
        return True

    def _write(self, storage: Any, written: np.ndarray) -> None:
        """A write read from the storage now (the slots it named, a slot again if it wrapped round)."""
        if not len(written):
            return
        self._ensure(storage)
        stamps = self._stamps(storage, written)
        if stamps is None:
            return
        groups = lengths = None
        if self._group_key is not None:
            groups = column(storage, self._group_key, written)
            if groups is None:
                raise KeyError(f"group_key={self._group_key!r} is not in the data written; write it, or pass None")
        if self._length_key is not None:
            lengths = column(storage, self._length_key, written, reduce="mean")
        self._apply(written, stamps, groups, lengths)

    def _apply(
        self,
        written: np.ndarray,
        stamps: np.ndarray,
        groups: Optional[np.ndarray] = None,
        lengths: Optional[np.ndarray] = None,
    ) -> None:
        """Any write: each slot's old entry evicted (round robin) or left a ghost, its last write put."""
        core, book = self._core, self._book
        assert core is not None and book is not None
        keep, old, round_robin = book.overwritten(written)
        slots = written if keep is None else written[keep]
        if keep is not None:
            stamps = stamps[keep]
            groups = None if groups is None else groups[keep]
            lengths = None if lengths is None else lengths[keep]
        if len(old) and round_robin:  # the oldest entries of the core: the storage overflowed before they were used
            core.evict_oldest(len(old) if groups is None else book.groups_among(old))
            book.left(core.released().ids)
        ids = book.write(slots, stamps, groups)
        if lengths is None:
            core.put(ids, stamps, groups)
        else:
            prompts = ids if groups is None else groups  # a group is one prompt's trajectories
            firsts = np.sort(np.unique(prompts, return_index=True)[1])
            for stamp in np.unique(stamps[firsts]).tolist():  # dispatch stamps one step per call
                core.dispatch(prompts[firsts][stamps[firsts] == stamp], int(stamp))
            core.complete(ids, prompts, lengths=lengths)
        book.left(core.released().ids)  # a full core evicted its oldest (ghosts first, as they are the oldest)

    def _stamps(self, storage: Any, slots: np.ndarray) -> Optional[np.ndarray]:
        if self._version_key is None:
            return np.full(len(slots), self._consumer_version, np.int64)
        stamps = column(storage, self._version_key, slots)
        self._missing_key = stamps is None
        if stamps is not None and len(stamps):
            self._newest = max(self._newest, int(stamps.max()))
        return stamps

    def _step(self) -> int:
        """The step a take ages from: ``consumer_version``, or the newest stamp written if that is ahead (data
        stamped v was made by weights v, so the trainer is at v at least; ``consumer_version`` is set late)."""
        if self._newest > self._consumer_version:
            assert self._book is not None
            self._book.counts["consumer_behind"] += 1
            return self._newest
        return self._consumer_version

    def _catch_up(self, storage: Any) -> None:
        """Writes this copy did not see: pending extends, and writes by other processes (module docstring)."""
        self._flush()
        for slots in self._pending:
            self._write(storage, slots)
        self._pending.clear()
        revision = _revision(storage)
        if revision is None or revision == self._revision or self._version_key is None:
            return
        n = dim0_len(storage)
        _core, book = self._ensure(storage)
        slots = np.arange(n, dtype=np.int64)
        stamps = column(storage, self._version_key, slots)
        if stamps is None:
            self._missing_key = True
            return
        rewritten = (stamps != book.stamp[:n]) | (book.entry[:n] == -1) & (book.generation[:n] == 0)
        if self._writes is not None and self._seen is not None and len(self._writes) >= n:
            counts = self._writes[:n].numpy().copy()
            rewritten |= counts != self._seen[:n]  # rewritten by another copy, at any version
            self._seen[:n] = counts
        changed = slots[rewritten]
        if len(changed):
            book.counts["foreign_writes"] += len(changed)
            self._write(storage, changed)
        self._revision = revision

    # ---- the read path --------------------------------------------------------------------------------------
    def sample(self, storage: Any, batch_size: int) -> Tuple[Any, Dict[str, Any]]:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be an int >= 1 (the rows one sample returns)")
        if len(storage) == 0:
            raise RuntimeError(EMPTY_STORAGE)
        self._catch_up(storage)
        if self._missing_key:
            raise KeyError(
                f"Could not find key {self._version_key!r} in the replay buffer storage: stamp the data with its "
                "policy version (the PolicyVersion transform, a collector's track_policy_version=True), or pass "
                "version_key=None to stamp each write with consumer_version"
            )
        core, book = self._ensure(storage)
        inner = inner_cells(storage)
        want = max(1, int(batch_size) // inner)
        slots, ages = self._take(core, book, want)
        if not len(slots):
            raise RuntimeError(self._why_empty(core, book, len(storage)))
        # TorchRL's ``for batch in rb:`` stops once this is set: nothing more could be sampled at this version.
        self._ran_out = self._sampleable_count(storage) == 0
        if self._shuffle and len(slots) > 1:
            order = torch.randperm(len(slots), generator=self._rng).numpy()
            slots, ages = slots[order], ages[order]
        self.last_ages = ages.tolist()
        index: Any = torch.from_numpy(slots)
        age = torch.from_numpy(ages.astype(np.float32))
        if inner > 1:
            cells = (index[:, None] * inner + torch.arange(inner)).reshape(-1)
            index = unravel_index(cells, storage.shape)
            age = age.repeat_interleave(inner)
        device = getattr(storage, "device", None)
        if isinstance(index, torch.Tensor) and device is not None and str(device) != "cpu":
            index = index.to(device)
        return index, ({} if self._info_key is None else {self._info_key: age})

    def _take(self, core: StalenessBuffer, book: SlotBook, want: int) -> Tuple[np.ndarray, np.ndarray]:
        got_slots, got_ages = [], []
        got = 0
        while got < want:
            step = self._step()
            batch = core.take(want - got, step)
            ids = batch.traj_ids.numpy()
            slots, live = book.slots_of(ids)  # before the release report marks the retired ones gone
            book.left(core.released().ids)
            if not len(ids):
                break
            got_slots.append(slots[live])
            got_ages.append(step - batch.sample_step.numpy()[live])
            got += int(live.sum())
            if live.all():  # short only if the next group does not fit: that is the batch
                break
            book.counts["overwritten_skipped"] += int((~live).sum())  # ghosts took places: take again for them
        if not got_slots:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(got_slots), np.concatenate(got_ages)

    def _why_empty(self, core: StalenessBuffer, book: SlotBook, stored: int) -> str:
        led = core.ledger()
        return (
            f"no entry can be sampled at consumer_version={self._consumer_version}: the storage holds {stored}, "
            f"of which {led['buffer_left'] - book.ghosts} are ours to sample; so far {led['dropped_stale']} were "
            f"dropped as older than max_age={self._max_age} (StalenessAwareSampler's max_staleness) and "
            f"{led['retired']} used max_uses={self._max_uses} "
            "times. Write fresher data (or update the collector's weights more often), raise max_age or "
            "max_uses, or wait for the collector before sampling (rb.can_sample())"
        )

    def _sampleable_count(self, storage: Any, batch_size: Any = None) -> int:
        """How many entries a sample could return now (TorchRL's ``rb.can_sample()`` asks)."""
        if len(storage) == 0:
            return 0
        self._catch_up(storage)
        core, book = self._ensure(storage)
        if self._strategy == "drop" and core.evict_stale(self._step()):
            book.left(core.released().ids)
        return max(0, len(core) - book.ghosts)

    # ---- accounting -----------------------------------------------------------------------------------------
    def ledger(self) -> Dict[str, int]:
        """The core's ledger (one entry per slot write) and the sampler's counts: ``overwritten_in_place`` (entries
        a write out of round-robin order replaced before they were sampled), ``overwritten_skipped`` (those a take
        met and skipped: counted ``retired`` in the core), ``overwritten_in_write`` (rows one write longer than the
        storage wrote over itself: never entries), ``foreign_writes`` (writes of other processes found),
        ``consumer_behind`` (takes aged from a stamp newer than ``consumer_version``) and ``ghosts`` (replaced
        entries still in the core)."""
        self._flush()
        if self._core is None or self._book is None:
            return {}
        out = dict(self._core.ledger())
        for key in (
            "overwritten_in_place",
            "overwritten_skipped",
            "overwritten_in_write",
            "foreign_writes",
            "consumer_behind",
        ):
            out[key] = int(self._book.counts[key])
        out["ghosts"] = self._book.ghosts
        return out

    def metrics(self) -> Dict[str, float]:
        """The ages of the last sample (mean, max), the ledger and the data metrics (starvation, the bias monitor)."""
        self._flush()
        if self._core is None:
            return {}
        out = buffer_metrics(self._core)
        out.update(ages_metrics(self.last_ages))
        return out

    # ---- TorchRL's state hooks ------------------------------------------------------------------------------
    def _empty(self) -> None:
        self._consumer_version, self._newest = 0, -1
        self._core, self._book = None, None
        self._recorded, self._recorded_rows = [], 0
        self._pending.clear()
        self._missing_key, self._revision, self._marked = False, None, None
        self._ran_out = False

    def __repr__(self) -> str:
        self._flush()
        held = 0 if self._core is None else len(self._core) - (self._book.ghosts if self._book else 0)
        return (
            f"{type(self).__name__}(consumer_version={self._consumer_version}, max_age={self._max_age}, "
            f"strategy={self._strategy!r}, max_uses={self._max_uses}, sampleable={held})"
        )


def _int64(stamps: torch.Tensor) -> torch.Tensor:
    return stamps if stamps.dtype == torch.int64 else stamps.to(torch.int64)


def _continues(before: torch.Tensor, index: torch.Tensor) -> bool:
    """Whether the write ``index`` starts at the slot after ``before``'s last and spans its length (a cheap
    test; ``_apply_round_robin`` checks the run exactly)."""
    n = len(index)
    return (
        n > 0 and len(before) > 0 and int(index[0]) == int(before[-1]) + 1 and int(index[-1]) == int(index[0]) + n - 1
    )


def _revision(storage: Any) -> Optional[int]:
    revision = getattr(storage, "_mutation_revision", None)
    return None if revision is None else int(revision)
