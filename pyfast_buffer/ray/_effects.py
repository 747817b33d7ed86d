"""The index's own tables (payload owners and sizes, remembered requests and take replies, the released-id
report) as change logs for the journal, and their replay at a restart.

Each table logs what was set or removed since the journal's last record, in order; a record carries the
log, not the table, so it costs what the call changed. The logs are off (None) without a journal.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..released import Released
from ._report import ReleasedReport

_GONE = -1  # a removed key's value in an encoded log (owner slots and byte counts are >= 0)
_REMOVED = object()  # a removed key's value in a log
_ABSENT = object()  # what pop_many's dict.pop gives for a key that was not there


class _Logged:
    """A dict mixin that appends (key, value) to ``log`` for every set and (key, _REMOVED) for every removal."""

    log: Optional[List[Tuple[Any, Any]]] = None

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)  # type: ignore[misc]
        if self.log is not None:
            self.log.append((key, value))

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)  # type: ignore[misc]
        if self.log is not None:
            self.log.append((key, _REMOVED))

    def pop(self, key: Any, *default: Any) -> Any:
        present = key in self  # type: ignore[operator]
        value = super().pop(key, *default)  # type: ignore[misc]
        if present and self.log is not None:
            self.log.append((key, _REMOVED))
        return value

    def popitem(self, *args: Any, **kwargs: Any) -> Tuple[Any, Any]:
        key, value = super().popitem(*args, **kwargs)  # type: ignore[misc]
        if self.log is not None:
            self.log.append((key, _REMOVED))
        return key, value

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def clear(self) -> None:
        for key in list(self):  # type: ignore[call-overload]
            self.pop(key)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:  # type: ignore[operator]
            self[key] = default
        return self[key]  # type: ignore[index]


class LoggedDict(_Logged, dict):
    """A logged dict with batch calls: the index sets and drops the owner and size of every id of a put or a
    take, and one call per id through ``_Logged`` cost a take of 64 ids ~0.1-0.2 ms of the index's CPU."""

    def set_many(self, keys: List[Any], values: List[Any]) -> None:
        """``self[k] = v`` for each pair in order, logged as those sets would be."""
        pairs = list(zip(keys, values))
        dict.update(self, pairs)
        if self.log is not None:
            self.log.extend(pairs)

    def pop_many(self, keys: List[Any], default: Any = None) -> List[Any]:
        """``[self.pop(k, default) for k in keys]``, logged as those pops would be (a removal per key present)."""
        values = list(map(dict.pop, itertools.repeat(self, len(keys)), keys, itertools.repeat(_ABSENT)))
        if self.log is not None:
            self.log.extend((k, _REMOVED) for k, v in zip(keys, values) if v is not _ABSENT)
        return [default if v is _ABSENT else v for v in values]


class LoggedOrderedDict(_Logged, collections.OrderedDict):
    pass


class JournaledReport(ReleasedReport):
    """The released-id report, logging each add and drain (a replay repeats them: the bound acts the same)."""

    def __init__(self, bound: int) -> None:
        super().__init__(bound)
        self.log: Optional[List[Any]] = None

    def add(self, released: Released) -> None:
        super().add(released)
        if self.log is not None:
            self.log.append([released.ids, released.reasons])

    def drain(self) -> Released:
        if self.log is not None:
            self.log.append(None)
        return super().drain()


def _int_log(log: List[Tuple[Any, Any]]) -> Dict[str, np.ndarray]:
    keys = np.asarray([k for k, _ in log], np.int64)
    values = np.asarray([_GONE if v is _REMOVED else v for _, v in log], np.int64)
    return {"keys": keys, "values": values}


def take_logs(
    where: LoggedDict,
    sizes: LoggedDict,
    done_puts: LoggedOrderedDict,
    done_takes: LoggedOrderedDict,
    report: JournaledReport,
) -> Dict[str, Any]:
    """The tables' logs since the previous call, encoded for a record; the logs start empty again."""
    out = {
        "where": _int_log(where.log or []),
        "sizes": _int_log(sizes.log or []),
        "done_puts": _int_log([(k, 0 if v is None else v) for k, v in done_puts.log or []]),
        "done_takes": [[int(k), None if v is _REMOVED else list(v)] for k, v in done_takes.log or []],
        "report": list(report.log or []),
    }
    start_logs(where, sizes, done_puts, done_takes, report)
    return out


def start_logs(*tables: Any) -> None:
    """Turns logging on (the journal starts) with empty logs."""
    for table in tables:
        table.log = []


class TablesReplay:
    """The index's tables rebuilt from a snapshot (``_IndexActor._capture``) and the records after it."""

    def __init__(self, snap: Dict[str, Any], remembered_puts: int, remembered_takes: int, bound: int) -> None:
        ids, slots, sizes = (np.asarray(snap[k]).tolist() for k in ("payload_ids", "payload_slots", "payload_bytes"))
        self.where: Dict[int, Any] = dict(zip(ids, slots))
        self.sizes: Dict[int, Any] = dict(zip(ids, sizes))
        self.done_puts = collections.OrderedDict((int(k), None) for k in np.asarray(snap["done_puts"]).tolist())
        self.done_takes = collections.OrderedDict((int(e[0]), tuple(e[1:])) for e in snap["done_takes"])
        self._bounds = (remembered_puts, remembered_takes)
        self.report = ReleasedReport(bound)
        self.report.overflow = int(snap["report_overflow"])
        if len(snap["report_ids"]):
            self.report.add(Released(np.asarray(snap["report_ids"]), np.asarray(snap["report_reasons"], np.int8)))
        self.rest = {k: snap[k] for k in ("max_age", "extra", "owner_nodes")}

    def apply(self, record: Dict[str, Any]) -> None:
        tables: Tuple[Tuple[Dict[int, Any], str], ...] = (
            (self.where, "where"),
            (self.sizes, "sizes"),
            (self.done_puts, "done_puts"),
        )
        for table, name in tables:
            log = record[name]
            for k, v in zip(np.asarray(log["keys"]).tolist(), np.asarray(log["values"]).tolist()):
                if v == _GONE:
                    table.pop(k, None)
                else:
                    table[k] = None if name == "done_puts" else v
        for k, reply in record["done_takes"]:
            if reply is None:
                self.done_takes.pop(k, None)
            else:
                self.done_takes[k] = tuple(reply)
        remembered: Tuple[Tuple[collections.OrderedDict[int, Any], int], ...] = (
            (self.done_puts, self._bounds[0]),
            (self.done_takes, self._bounds[1]),
        )
        for remembered_table, bound in remembered:
            while len(remembered_table) > bound:
                remembered_table.popitem(last=False)
        for entry in record["report"]:
            if entry is None:
                self.report.drain()
            else:
                self.report.add(Released(np.asarray(entry[0]), np.asarray(entry[1], np.int8)))
        self.rest = {k: record[k] for k in ("max_age", "extra", "owner_nodes")}

    def snapshot(self) -> Dict[str, Any]:
        """The tables in the snapshot's layout (what ``_restore`` loads)."""
        ids = np.fromiter(self.where.keys(), np.int64, len(self.where))
        report = self.report.peek()
        return {
            **self.rest,
            "payload_ids": ids,
            "payload_slots": np.fromiter(self.where.values(), np.int64, len(ids)),
            "payload_bytes": np.asarray([self.sizes.get(k, 0) for k in ids.tolist()], np.int64),
            "done_puts": np.fromiter(self.done_puts.keys(), np.int64, len(self.done_puts)),
            "done_takes": [[k, *v] for k, v in self.done_takes.items()],
            "report_ids": report.ids,
            "report_reasons": report.reasons.astype(np.int64),
            "report_overflow": self.report.overflow,
        }
