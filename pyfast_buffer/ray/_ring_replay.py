"""Rebuilds a StalenessBuffer's state from a journal: one whole export, then the deltas after it, loaded once.

A delta (``StalenessBuffer._journal_delta``, csrc/ring_delta.cpp) is an effect, not a call to re-run: the
entries are, for each run ``(changed, from, len)`` of its ``runs`` (a flat array of triples), its next
``changed`` rows then rows ``[from, from + len)`` of the previous state, and after the last run its other
rows; in-flight prompts and attempt records come as changed rows and removed ids; the ledger and the other
scalars whole. Applying one costs what it carries: the entries are kept as a deque of row blocks, so a take
or a put (at most one run) touches only the blocks at the ends, and a compaction or a re-sort (several runs)
slices the blocks it keeps.

A journal record carries its delta ``trimmed``: without its empty arrays (a take adds no rows, most calls move
no prompt and no attempt record), which are half of a record's nodes; ``apply`` reads a missing array as empty.
"""

from __future__ import annotations

import bisect
import collections
from typing import Any, Deque, Dict, List, Tuple

import numpy as np

from .. import state

ENTRY_KEYS = state.ENTRY_COLUMNS + state.LATER_ENTRY_COLUMNS  # the columns of the core's export
_NARROW = ("uses", "group_len")  # int32 in the core's export
IN_FLIGHT_KEYS = (
    "in_flight_prompt",
    "in_flight_step",
    "in_flight_dispatch_ns",
    "in_flight_meta",
    "in_flight_lease_left_ns",
    "in_flight_held_ns",
)
SCALAR_KEYS = ("ledger", "clock", "evicted_unreported", "next_take", "attempt_counters", "source_counts")
_EMPTY = np.empty(0, np.int64)


def trimmed(delta: Dict[str, Any]) -> Dict[str, Any]:
    """``delta`` without its empty arrays, the attempt records' included (the state's scalars stay whole):
    what ``apply`` rebuilds the same state from, in fewer of the journal record's nodes to encode."""
    out: Dict[str, Any] = {}
    for key, value in delta.items():
        if key == "attempts":
            attempts: Dict[str, np.ndarray] = value
            kept = {column: array for column, array in attempts.items() if array.size}
            if kept:
                out[key] = kept
        elif key in SCALAR_KEYS or type(value) is not np.ndarray or value.size:
            out[key] = value
    return out


def _array(delta: Dict[str, Any], key: str) -> Any:
    return delta.get(key, _EMPTY)


class _Rows:
    """The ready entries as blocks of rows (one int64 column per entry key), oldest first."""

    def __init__(self) -> None:
        self._blocks: Deque[np.ndarray] = collections.deque()
        self.size = 0

    def keep(self, start: int, count: int) -> None:
        """Keeps rows [start, start + count) only."""
        self._drop(start, left=True)
        self._drop(self.size - count, left=False)

    def _drop(self, n: int, left: bool) -> None:
        while n > 0:
            block = self._blocks[0] if left else self._blocks[-1]
            if len(block) <= n:
                (self._blocks.popleft if left else self._blocks.pop)()
                n -= len(block)
                self.size -= len(block)
                continue
            if left:
                self._blocks[0] = block[n:]
            else:
                self._blocks[-1] = block[: len(block) - n]
            self.size -= n
            n = 0

    def add(self, block: np.ndarray, left: bool) -> None:
        if len(block):
            (self._blocks.appendleft if left else self._blocks.append)(block)
            self.size += len(block)

    def rebuild(self, pieces: List[Tuple[int, int, int]], changed: np.ndarray) -> None:
        """Replaces the rows by, for each (n, start, count) in order, the next n rows of ``changed`` then rows
        [start, start + count) of the current ones, and after the last piece the rest of ``changed``."""
        old = list(self._blocks)
        ends = np.cumsum([len(b) for b in old]).tolist()  # where each old block ends
        self._blocks, self.size, at = collections.deque(), 0, 0
        for n, start, count in pieces:
            self.add(changed[at : at + n], left=False)
            at += n
            k = bisect.bisect_right(ends, start)  # the block that holds row `start`
            while count > 0:
                begin = ends[k] - len(old[k])
                piece = old[k][start - begin : start - begin + count]
                self.add(piece, left=False)
                start, count, k = start + len(piece), count - len(piece), k + 1
        self.add(changed[at:], left=False)

    def columns(self) -> Dict[str, np.ndarray]:
        rows = np.concatenate(list(self._blocks)) if self._blocks else np.empty((0, len(ENTRY_KEYS)), np.int64)
        out: Dict[str, np.ndarray] = {k: np.ascontiguousarray(rows[:, i]) for i, k in enumerate(ENTRY_KEYS)}
        for k in _NARROW:
            out[k] = out[k].astype(np.int32)
        return out


def _row_block(delta: Dict[str, Any], start: int, stop: int) -> np.ndarray:
    return np.stack([np.asarray(_array(delta, k)[start:stop], np.int64) for k in ENTRY_KEYS], axis=1)


class CoreReplay:
    """A buffer's state rebuilt from ``_journal_delta(full=True)`` and the deltas exported after it."""

    def __init__(self, whole: Dict[str, Any]) -> None:
        self._rows = _Rows()
        self._in_flight: Dict[int, Tuple[int, ...]] = {}
        self._attempts: collections.OrderedDict[int, Tuple[int, ...]] = collections.OrderedDict()
        self._scalars: Dict[str, Any] = {}
        self.now_ns = 0
        self.apply(whole)

    def apply(self, delta: Dict[str, Any]) -> None:
        """Applies one delta (the next one exported after those applied so far), whole or ``trimmed``."""
        pieces = [(a, b, c) for a, b, c in np.asarray(_array(delta, "runs"), np.int64).reshape(-1, 3).tolist()]
        n = len(_array(delta, "traj_id"))
        if len(pieces) > 1:  # a compaction or a re-sort: rows kept from the middle
            self._rows.rebuild(pieces, _row_block(delta, 0, n))
        else:  # a take, a put or an eviction: the previous rows minus both ends, one block each side
            front, start, count = pieces[0] if pieces else (0, 0, 0)
            self._rows.keep(start, count)
            self._rows.add(_row_block(delta, 0, front), left=True)
            self._rows.add(_row_block(delta, front, n), left=False)
        now = int(delta["now_ns"])
        if delta["in_flight_all"]:
            self._in_flight.clear()
        for prompt in np.asarray(_array(delta, "in_flight_gone")).tolist():
            self._in_flight.pop(prompt, None)
        columns = [np.asarray(_array(delta, k)).tolist() for k in IN_FLIGHT_KEYS]
        for row in zip(*columns):
            self._in_flight[row[0]] = (*row[1:], now)
        attempts = delta.get("attempts", {})
        records = list(zip(*(np.asarray(_array(attempts, k)).tolist() for k in state.ATTEMPT_COLUMNS)))
        if delta["attempts_all"]:
            self._attempts.clear()
        for prompt in np.asarray(_array(delta, "attempts_gone")).tolist():
            self._attempts.pop(prompt, None)
        moved = int(delta["attempts_moved"])
        for i, record in enumerate(records):
            if i < moved:  # the table's new tail, in order: each goes to the back
                self._attempts.pop(record[0], None)
            self._attempts[record[0]] = record
        self._scalars = {k: delta[k] for k in SCALAR_KEYS}
        self.now_ns = now

    def export(self) -> Dict[str, Any]:
        """The state in the core's flat export format, in-flight times measured at the last delta's clock."""
        out: Dict[str, Any] = self._rows.columns()
        prompts = sorted(self._in_flight)
        rows = [self._in_flight[p] for p in prompts]
        step, dispatch, meta, left, held, at = (np.asarray([r[i] for r in rows], np.int64) for i in range(6))
        late = self.now_ns - at  # how long before the last delta each row was exported
        out.update(
            in_flight_prompt=np.asarray(prompts, np.int64),
            in_flight_step=step,
            in_flight_dispatch_ns=dispatch,
            in_flight_meta=meta,
            in_flight_lease_left_ns=np.where(left < 0, -1, np.maximum(left - late, 0)),
            in_flight_held_ns=held + late,
        )
        records = list(self._attempts.values())
        out["attempts"] = {
            k: np.asarray([r[i] for r in records], np.int64) for i, k in enumerate(state.ATTEMPT_COLUMNS)
        }
        out.update(self._scalars)
        return out
