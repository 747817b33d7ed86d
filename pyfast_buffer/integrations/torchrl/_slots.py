"""Which core entry holds each dim-0 slot of a TorchRL storage, and what a write over a slot does to it.

TorchRL's writers overwrite slots without telling the sampler (there is no eviction call), so every write is
checked here. A slot's entry id is ``generation * slots + slot``: the slot comes back from an id by a modulo, and
an id whose slot was written again since is recognised (``ghost``) without a table of ids.

When the written slots continue the round-robin cursor (TorchRL's default writer), they are the oldest writes, so
their entries still in the core are its oldest: ``evict_oldest`` removes exactly those, counted ``evicted`` (the
storage overflowed before they were sampled). Any other write order (``TensorDictMaxValueWriter``, ``rb[i] =``,
a writer in another process) leaves the old entries in the core as ghosts, skipped and counted when a take meets
them (``overwritten_skipped``). No torchrl import.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Tuple

import numpy as np

NO_ENTRY = -1


class SlotBook:
    """The entry of each slot (``NO_ENTRY`` once it left the core), the write cursor, and the ghosts."""

    def __init__(self, slots: int) -> None:
        self.slots = int(slots)
        self.entry = np.full(self.slots, NO_ENTRY, np.int64)  # the live core entry of each slot
        self.generation = np.zeros(self.slots, np.int64)  # how many times each slot was written
        self.stamp = np.full(self.slots, np.iinfo(np.int64).min, np.int64)  # the last stamp written to each slot
        self.group = np.full(self.slots, NO_ENTRY, np.int64)  # each slot's group id (group_key), or NO_ENTRY
        self.arange = np.arange(self.slots, dtype=np.int64)  # the slots in order (a round-robin write's check)
        self.cursor = 0  # the slot a round-robin writer writes next
        self.ghosts = 0  # core entries whose slot was written again (not round robin): skipped when met
        self.counts: Counter = Counter()

    def overwritten(self, written: np.ndarray) -> Tuple[Optional[np.ndarray], np.ndarray, bool]:
        """For the slots a write named (in order, a slot again if the write wrapped round): the positions of each
        slot's last write, in order (None: every slot once already); the entries of those slots still in the
        core (their data is being replaced); and whether the write continued the round-robin cursor (then those
        are the core's oldest entries: evict them)."""
        n = len(written)
        round_robin = (
            n > 0
            and int(written[0]) == self.cursor
            and bool(np.array_equal(written, (self.cursor + np.arange(n)) % self.slots))
        )
        keep = None
        repeats = n > self.slots if round_robin else n > 1 and len(np.unique(written)) != n
        if repeats:  # the write wrapped round (or named a slot twice): keep each slot's last write
            keep = np.sort(n - 1 - np.unique(written[::-1], return_index=True)[1])
            self.counts["overwritten_in_write"] += n - len(keep)
        old = self.entry[written if keep is None else written[keep]]
        return keep, old[old != NO_ENTRY], round_robin

    def groups_among(self, ids: np.ndarray) -> int:
        """How many groups the entries ``ids`` belong to (the core evicts whole groups)."""
        return max(1, len(np.unique(self.group[ids % self.slots])))

    def write(self, slots: np.ndarray, stamps: np.ndarray, groups: Optional[np.ndarray] = None) -> np.ndarray:
        """New entry ids for ``slots`` (unique, in write order); old entries of theirs still in the core (not
        evicted first) become ghosts."""
        old = self.entry[slots]
        ghosts = int((old != NO_ENTRY).sum())
        self.ghosts += ghosts
        self.counts["overwritten_in_place"] += ghosts
        self.generation[slots] += 1
        ids = self.generation[slots] * self.slots + slots
        self.entry[slots] = ids
        self.stamp[slots] = stamps
        if groups is not None:
            self.group[slots] = groups
        if len(slots):
            self.cursor = int(slots[-1] + 1) % self.slots
        return ids

    def slots_of(self, ids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The slots of taken entry ids and which of them are live (False: a ghost, whose slot holds newer data)."""
        slots = ids % self.slots
        return slots, self.entry[slots] == ids

    def left(self, ids: np.ndarray) -> None:
        """Entries that left the core (retired, dropped, evicted): their slots hold no live entry any more."""
        if not len(ids):
            return
        slots, live = self.slots_of(ids)
        self.entry[slots[live]] = NO_ENTRY
        self.ghosts -= int((~live).sum())

    def clear(self) -> None:
        self.entry.fill(NO_ENTRY)
        self.stamp.fill(np.iinfo(np.int64).min)
        self.cursor, self.ghosts = 0, 0

    def state(self) -> dict:
        return {
            "slots": self.slots,
            "entry": self.entry.copy(),
            "generation": self.generation.copy(),
            "stamp": self.stamp.copy(),
            "group": self.group.copy(),
            "cursor": self.cursor,
            "ghosts": self.ghosts,
            "counts": dict(self.counts),
        }

    @classmethod
    def from_state(cls, state: dict) -> SlotBook:
        book = cls(int(state["slots"]))
        for name in ("entry", "generation", "stamp", "group"):
            setattr(book, name, np.asarray(state[name], np.int64).copy())
        book.cursor, book.ghosts = int(state["cursor"]), int(state["ghosts"])
        book.counts.update({k: int(v) for k, v in dict(state["counts"]).items()})
        return book
