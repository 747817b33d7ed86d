"""ReferenceBuffer: the pure-Python twin of StalenessBuffer, written the plain way.

A deque of groups, each a list of per-trajectory record dicts, a dict of
in-flight prompts and a few counters, all under one threading.Condition. It has
the same API, the same semantics and the same exceptions as the native buffer:
it is the test oracle and the benchmark baseline, so it favours obviousness
over speed. Its sections follow the core's files (``csrc/ring_common.cpp``, ``ring_in_flight``,
``ring_write``, ``ring_take``, ``ring_evict``, ``ring_state``), so one can be read beside the other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections import deque
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from . import _reference_pace, bias, state
from ._args import (
    as_count,
    as_ids,
    as_lease,
    as_lengths,
    as_seconds,
    as_slots,
    as_step,
    as_steps,
    as_timeout,
    is_probe,
    same_length,
)
from ._buffer_base import BufferBase, check_bounded
from .accounting import AccountingMethods
from .attempts import PromptAttempts, default_attempts_bound
from .batch import AGE_BUCKETS, Batch, age_bucket, make_metrics
from .config import SourceMaxAge, check_max_age_keeps_lookahead, pace_limits, resolve_pin_memory
from .errors import CLOSED_MESSAGE, AdmissionError, BufferClosedError, BufferFullError, WouldBlock
from .released import NOT_TRACKED, Released, default_release_bound

_RETIRED, _DROPPED_STALE, _EVICTED, _FAILED, _EXPIRED = range(5)  # codes of RELEASE_REASONS


#: The core's message for restamp_in_flight under age_from="start" (csrc/ring_in_flight.cpp), word for word.
RESTAMP_NEEDS_FINISH = (
    "restamp_in_flight: this buffer measures age from the dispatch step (age_from='start'), which a weight "
    "update cannot change; construct it with age_from='finish' to age trajectories from the weights that "
    "finished them"
)
_NO_LEASE = 2**63 - 1  # the deadline of a prompt without a lease, as in the core
# The per-entry meta word, as csrc/entry_meta.hpp packs it: length (low 32 bits), source slot, two flags.
_NO_LENGTH = 0xFFFFFFFF
_PROTECTED = 1 << 40
_OBSERVED = 1 << 41


def _meta(length: int, slot: int, protect: bool, observed: bool) -> int:
    return (
        (_NO_LENGTH if length < 0 else length)
        | (slot << 32)
        | (_PROTECTED if protect else 0)
        | (_OBSERVED if observed else 0)
    )


def _slot(meta: int) -> int:
    return (meta >> 32) & 0xFF


def _length(meta: int) -> int:
    return -1 if meta & _NO_LENGTH == _NO_LENGTH else meta & _NO_LENGTH


def _latency_us(rec: dict) -> int:
    return max(rec["complete_ns"] - rec["dispatch_ns"], 0) // 1000


_WAKE_S = 0.1  # longest sleep of a blocking call between two looks at signals, leases and its deadline


class _Plan:
    def __init__(self) -> None:
        self.walked = self.taken = self.dropped = 0  # walked counts groups here
        self.full = False
        self.blocked_by = "none"
        self.pace_blocker: Optional[int] = None  # pace: the in-flight stamp that blocked the take
        self.unbounded = False  # take(bounded=False): this call ignores every age bound


class ReferenceBuffer(BufferBase, AccountingMethods):
    """Pure-Python StalenessBuffer; see that class for the arguments (pin_memory is accepted and ignored)."""

    # -- construction, validation, the clock, interrupts, release notes (csrc/ring_common.cpp) -----------------------
    def __init__(
        self,
        capacity: int,
        max_age: int = 7,
        strategy: str = "drop",
        max_uses: int = 1,
        on_full: str = "evict_oldest",
        pin_memory: Optional[bool] = None,
        parameter_sync_step: Optional[int] = None,
        track_released: bool = False,
        release_bound: Optional[int] = None,
        unique_ids: bool = False,
        prompts_per_step: Optional[int] = None,
        lookahead: Optional[int] = None,
        age_from: str = "start",
        max_attempts: Optional[int] = None,
        source_max_age: Optional[SourceMaxAge] = None,
        starvation_share: Optional[float] = None,
    ) -> None:
        self._configure(locals())
        self._per_step, self._lookahead = pace_limits(self.config)
        self._next_take = 0  # pace: one past the step of the latest take
        self._protected_waiting = 0  # pace: protected dispatch calls waiting for admission
        self._unprotected_waiting = 0  # pace: other dispatch/put calls waiting for admission
        # (id, reason code) of everything that left, oldest first, until released() drains it
        self._released: Optional[deque] = deque() if track_released else None
        self._release_bound = release_bound or default_release_bound(capacity)
        self._released_overflow = 0
        self._live: Optional[Set[int]] = set() if unique_ids else None  # ids ready in the ring
        resolve_pin_memory(pin_memory)  # same checks as the native buffer; the twin never pins
        self.pin_memory = False
        self._groups: deque = deque()  # oldest first; each group is a list of record dicts
        self._size = 0
        # prompt id -> (sample_step, dispatch_ns, since_ns, deadline_ns); since/deadline on the lease clock
        self._in_flight: Dict[int, tuple] = {}
        self._leases: Dict[int, int] = {}  # prompt id -> deadline_ns, for leased prompts only
        self._manual_clock: Optional[int] = None  # _set_lease_clock's frozen time, if any
        self._counts: Dict[str, int] = dict.fromkeys(state.ALL_LEDGER_KEYS, 0)
        self._clock = -1
        self._clock_from_stamp = False  # the clock is a producer's stamp above every trainer step seen
        self._evicted_unreported = 0
        self._closed = False
        self._cond = threading.Condition()
        self._wake_fd = -1  # the awaitable API's wake-up fd (aio.py): a byte per arm when waiters may go
        self._wake_armed = False
        self._config_lock = threading.Lock()
        # What the bound does to the data (docs/data-bias.md), as the core keeps it.
        self._attempts = PromptAttempts(default_attempts_bound(capacity))
        self._bias: Optional[bias.Sketches] = None  # from the first dispatch on
        self._source_max_age: Dict[int, int] = dict(self.config.source_bounds())
        self._protected_seen = False
        self._tagged = False
        self._source_counts = np.zeros((state.SOURCE_SLOTS, len(state.SOURCE_COUNT_FIELDS)), dtype=np.int64)
        self._watch = bias.StarvationWatch(starvation_share)
        self._takes_seen = 0  # takes so far: every bias.WINDOW_TAKES-th logs the bias record

    def _check_open(self) -> None:
        if self._closed:
            raise BufferClosedError(CLOSED_MESSAGE)

    def _check_clock(self, current_step: int) -> None:
        if current_step < self._clock and self._clock_from_stamp:
            raise ValueError(
                f"current_step={current_step} is lower than step {self._clock}, which a dispatch or put stamped "
                "as its sample_step, ahead of the trainer: a stamp is the step of the weights that generated the "
                "data, never above the trainer's current step; stamp producers with the trainer's step (or its "
                "last weight push), or pass the trainer's real global step here"
            )
        if current_step < self._clock:
            raise ValueError(
                f"current_step={current_step} is lower than step {self._clock} of an earlier take or evict_stale; "
                "the trainer's step never goes back, pass the current global step"
            )

    def _advance_clock_by_stamp(self, sample_step: int) -> None:
        if sample_step > self._clock:
            self._clock, self._clock_from_stamp = sample_step, True

    def _advance_clock_by_trainer(self, current_step: int) -> None:
        if current_step >= self._clock:
            self._clock, self._clock_from_stamp = current_step, False

    def _check_fits(self, n: int, fix: str) -> None:
        if n > self.config.capacity:
            raise ValueError(
                f"traj_ids: {n} trajectories exceed capacity={self.config.capacity}; raise capacity or {fix} per call"
            )

    def _check_not_live(self, traj_list: List[int]) -> None:
        if self._live is None:
            return
        for t in traj_list:
            if t in self._live:
                raise ValueError(
                    f"traj_ids: trajectory {t} is already in the buffer and unique_ids=True; "
                    "give every trajectory a fresh id (or pass unique_ids=False)"
                )

    @staticmethod
    def _first_duplicate(ids: List[int]) -> Optional[int]:
        seen = set()
        for i in ids:
            if i in seen:
                return i
            seen.add(i)
        return None

    # -- the awaitable API's wake-ups (aio.py; the core's WakeFd, set_wake_fd and friends) ------------------------
    def _notify_waiters(self) -> None:
        """Wakes the blocked calls and, once per arm, writes a byte to the wake fd (the lock is held)."""
        self._cond.notify_all()
        if self._wake_fd >= 0 and self._wake_armed:
            self._wake_armed = False
            with contextlib.suppress(OSError):  # a full pipe already holds a wake-up
                os.write(self._wake_fd, b"\x01")

    def _set_wake_fd(self, fd: int) -> None:
        with self._cond:
            self._wake_fd = fd

    def _arm_wake(self) -> None:
        with self._cond:
            self._wake_armed = True

    def _next_lease_deadline_ns(self) -> int:
        with self._cond:
            return min(self._leases.values()) if self._leases and self._manual_clock is None else -1

    def _begin_admission_wait(self, prompt_ids: Any) -> bool:
        prompts = as_ids(prompt_ids, "prompt_ids").tolist()
        with self._cond:
            protected = bool(prompts) and self._holds_protected_attempt(prompts)
            if protected:
                self._protected_waiting += 1
            else:
                self._unprotected_waiting += 1
            return protected

    def _end_admission_wait(self, protected: bool) -> None:
        with self._cond:
            if protected:
                self._protected_waiting = max(self._protected_waiting - 1, 0)
                self._notify_waiters()  # the calls held behind it may go now
            else:
                self._unprotected_waiting = max(self._unprotected_waiting - 1, 0)

    def _wait(self, deadline: float) -> None:
        """Sleeps on the condition until notified, the deadline, the earliest lease deadline or _WAKE_S."""
        wait = min(deadline - time.monotonic(), _WAKE_S)
        if self._leases and self._manual_clock is None:
            wait = min(wait, (min(self._leases.values()) - time.monotonic_ns()) / 1e9)
        self._cond.wait(max(wait, 0.0))

    def _note_left(self, id_: int, code: int) -> None:
        if self._released is not None:
            if len(self._released) >= self._release_bound:
                self._released.popleft()
                self._released_overflow += 1
            self._released.append((id_, code))
        if self._live is not None and code <= _EVICTED:
            self._live.discard(id_)

    def _report_evicted(self) -> int:
        evicted, self._evicted_unreported = self._evicted_unreported, 0
        return evicted

    # -- in-flight prompts: dispatch, fail, renew, leases, expiry (csrc/ring_in_flight.cpp) --------------------------
    def dispatch(
        self,
        prompt_ids: Any,
        step: int,
        lease: Optional[float] = None,
        timeout: Optional[float] = None,
        *,
        source: Any = None,
    ) -> None:
        prompts = as_ids(prompt_ids, "prompt_ids").tolist()
        slots = as_slots(source, len(prompts), "prompts")
        step = as_step(step, "step")
        lease = as_lease(lease)
        timeout = as_timeout(timeout)
        with self._cond:
            self._check_open()
            self._expire_due()
            dup = self._first_duplicate(prompts)
            if dup is not None:
                raise ValueError(f"prompt_ids: prompt {dup} appears twice; dispatch each prompt once")
            paced = self._paced() and len(prompts) > 0
            if paced:
                self._check_pace_call_size(len(prompts), "dispatch")
            deadline = time.monotonic() + (timeout or 0.0)
            waited = protected_call = False
            while True:  # after a wait, validate again: another thread may have dispatched one of these
                for p in prompts:
                    if p in self._in_flight:
                        raise ValueError(
                            f"prompt_ids: prompt {p} is already in flight (dispatched at step "
                            f"{self._in_flight[p][0]}); complete or fail it before dispatching it again"
                        )
                if not paced:
                    break
                # Decided before admission without touching the table, and again after a wait.
                protected_call = self._holds_protected_attempt(prompts)
                if self._wait_for_admission([step] * len(prompts), timeout, "dispatch", deadline, protected_call):
                    break
                waited = True
            if self._paced():
                self._counts["admitted"] += len(prompts)
                self._counts["admission_waits"] += waited
                self._counts["admitted_ahead"] += protected_call and self._unprotected_waiting > 0
            now, since = time.time_ns(), self._lease_now()
            deadline = _NO_LEASE if lease is None else min(since + int(lease * 1e9), _NO_LEASE - 1)
            if self._bias is None and prompts:
                self._bias = bias.Sketches()
            k = self.config.max_attempts or 0
            for i, p in enumerate(prompts):
                slot = 0 if slots is None else int(slots[0 if len(slots) == 1 else i])
                untrained_run = self._attempts.on_dispatch(p, slot)
                self._in_flight[p] = (step, now, since, deadline, _meta(-1, slot, 0 < k <= untrained_run, True))
                if self._paced() and 0 < k <= untrained_run:
                    self._counts["protected_admitted"] += 1
                if lease is not None:
                    self._leases[p] = deadline
                self._source_counts[slot, 0] += 1
                self._tagged |= slot != 0
            self._counts["dispatched"] += len(prompts)
            self._advance_clock_by_stamp(step)
        self._watch.on_dispatch(None if slots is None else slots - 1, len(prompts))

    def fail(self, prompt_ids: Any) -> None:
        prompts = as_ids(prompt_ids, "prompt_ids").tolist()
        with self._cond:
            self._check_open()
            self._expire_due()
            dup = self._first_duplicate(prompts)
            if dup is not None:
                raise ValueError(f"prompt_ids: prompt {dup} appears twice; fail each prompt once")
            self._check_in_flight(prompts)
            for p in prompts:
                self._pop_in_flight(p)
                self._attempts.on_failed(p)
                self._note_left(p, _FAILED)
            self._counts["failed"] += len(prompts)
            self._notify_waiters()

    def renew(self, prompt_ids: Any, lease: float) -> None:
        prompts = as_ids(prompt_ids, "prompt_ids").tolist()
        lease = as_seconds(lease, "lease", False, "renew with a lease > 0")
        with self._cond:
            self._check_open()
            self._expire_due()
            dup = self._first_duplicate(prompts)
            if dup is not None:
                raise ValueError(f"prompt_ids: prompt {dup} appears twice; renew each prompt once")
            for p in prompts:
                if p not in self._in_flight:
                    raise ValueError(
                        f"prompt_ids: prompt {p} is not in flight; only in-flight prompts can be renewed "
                        "(it may already be completed, failed or expired)"
                    )
            deadline = min(self._lease_now() + int(lease * 1e9), _NO_LEASE - 1)
            for p in prompts:
                step, dispatched_at, since, _, meta = self._in_flight[p]
                self._in_flight[p] = (step, dispatched_at, since, deadline, meta)
                self._leases[p] = deadline

    def restamp_in_flight(self, step: int) -> int:
        step = as_step(step, "step")
        with self._cond:
            self._check_open()
            self._expire_due()
            if self.config.age_from != "finish":
                raise ValueError(RESTAMP_NEEDS_FINISH)
            # Never past the trainer's next step: it would move pace's next take without admission.
            limit = self._pace_next_take() if self._paced() else min(max(self._clock, 0) + 1, 2**63 - 1)
            if step > limit:
                raise ValueError(
                    f"restamp_in_flight: step={step} is past the trainer's next step {limit}; pass the step of the "
                    f"weights pushed to the engines, which the trainer has already produced (<= {limit})"
                )
            raised = [p for p, rec in self._in_flight.items() if rec[0] < step]
            for p in raised:
                self._in_flight[p] = (step, *self._in_flight[p][1:])
            if raised:
                self._advance_clock_by_stamp(step)
                self._notify_waiters()
            return len(raised)

    def expire_in_flight(self, older_than_s: float) -> int:
        older_ns = int(as_seconds(older_than_s, "older_than_s", True, "pass seconds >= 0") * 1e9)
        with self._cond:
            self._check_open()
            by_lease = self._expire_due()
            cutoff = self._lease_now() - older_ns
            old = sorted((rec[2], p) for p, rec in self._in_flight.items() if rec[2] <= cutoff)
            self._expire([p for _, p in old])
            return by_lease + len(old)

    def _set_lease_clock(self, now_ns: Optional[int]) -> None:
        if now_ns is not None and now_ns < 0:
            raise ValueError(f"lease clock={now_ns} must be >= 0")
        with self._cond:
            self._manual_clock = now_ns
            self._notify_waiters()

    def _check_in_flight(self, prompts) -> None:
        for p in prompts:
            if p not in self._in_flight:
                raise ValueError(
                    f"prompt_ids: prompt {p} is not in flight; dispatch it first "
                    "(it may already be completed, failed or expired)"
                )

    def _lease_now(self) -> int:
        return self._manual_clock if self._manual_clock is not None else time.monotonic_ns()

    def _pop_in_flight(self, prompt: int) -> tuple:
        self._leases.pop(prompt, None)
        return self._in_flight.pop(prompt)

    def _expire(self, prompts: List[int]) -> None:
        for p in prompts:
            self._pop_in_flight(p)
            self._attempts.on_failed(p)
            self._note_left(p, _EXPIRED)
        self._counts["failed"] += len(prompts)
        self._counts["expired"] += len(prompts)
        if prompts:
            self._notify_waiters()

    def _expire_due(self) -> int:
        """Fails every prompt whose lease passed, by deadline then id; returns how many."""
        if self._closed or not self._leases:
            return 0
        now = self._lease_now()
        due = sorted((d, p) for p, d in self._leases.items() if d <= now)
        self._expire([p for _, p in due])
        return len(due)

    # -- writing: complete, put, grouping, on_full, eviction of the oldest (csrc/ring_write.cpp) ---------------------
    def _finish_list(self, finish_step: Any, n: int) -> Optional[List[int]]:
        if finish_step is None:
            return None
        finish = as_steps(finish_step, "finish_step", n, copy=True).tolist()
        return finish * n if len(finish) == 1 else finish

    def _check_finish_groups(self, finish: Optional[List[int]], groups: Dict[int, List[int]]) -> None:
        if finish is None or self.config.age_from != "finish":
            return
        for key, members in groups.items():
            for i in members[1:]:
                if finish[i] != finish[members[0]]:
                    raise ValueError(
                        f"finish_step: under age_from='finish' a group shares one finish step; group {key} has "
                        f"finish_step {finish[members[0]]} and {finish[i]}"
                    )

    def complete(
        self,
        traj_ids: Any,
        prompt_ids: Any,
        timeout: Optional[float] = None,
        *,
        finish_step: Any = None,
        lengths: Any = None,
    ) -> None:
        trajs, prompts = as_ids(traj_ids, "traj_ids", copy=True), as_ids(prompt_ids, "prompt_ids", copy=True)
        same_length(trajs, "traj_ids", prompts, "prompt_ids")
        finish = self._finish_list(finish_step, len(trajs))
        timeout = as_timeout(timeout)
        length_of = as_lengths(lengths, len(trajs))
        n = len(trajs)
        with self._cond:
            self._check_open()
            self._expire_due()
            if n == 0:
                return
            self._check_fits(n, "complete fewer prompts")
            traj_list = trajs.tolist()
            dup = self._first_duplicate(traj_list)
            if dup is not None:
                raise ValueError(f"traj_ids: trajectory {dup} appears twice; complete each trajectory once")
            groups = self._group_stably(prompts)
            self._check_finish_groups(finish, groups)
            deadline = time.monotonic() + (timeout or 0.0)
            while True:
                self._expire_due()
                self._check_in_flight(groups)
                ends: List[int] = finish or []
                for p, members in groups.items() if ends else ():
                    started = self._in_flight[p][0]
                    for i in members:
                        if ends[i] < started:
                            raise ValueError(
                                f"finish_step={ends[i]} of trajectory {traj_list[i]} is before step {started}, the "
                                f"stamp of prompt {p} (its dispatch step, or the step restamp_in_flight raised it "
                                f"to); pass the step of the weights in force when it finished (>= {started})"
                            )
                self._check_not_live(traj_list)
                if self._wait_for_room(n, timeout, "complete", deadline):
                    break
            now = time.time_ns()
            assert self._bias is not None  # every in-flight prompt was dispatched, which starts the monitor
            for p, members in groups.items():
                step, dispatched_at, _, _, meta = self._pop_in_flight(p)
                base = meta & ~_NO_LENGTH
                metas = [meta if length_of is None else base | int(length_of[i]) for i in members]
                self._append(
                    [
                        self._record(
                            traj_list[i], p, step, dispatched_at, now, step if finish is None else finish[i], m
                        )
                        for i, m in zip(members, metas)
                    ]
                )
                self._bias.add(0, 0, [max(now - dispatched_at, 0) // 1000] * len(members))
                if length_of is not None:
                    self._bias.add(0, 1, (int(length_of[i]) for i in members))
                self._attempts.on_complete(p)
                if meta & _PROTECTED:
                    self._attempts.counters["protected"] += 1
                    self._protected_seen = True
                self._source_counts[_slot(meta), 1] += len(members)
            self._restore_order()
            for f_step in finish or []:
                self._advance_clock_by_stamp(f_step)
            self._counts["completed"] += len(groups)
            self._counts["put_total"] += n
            self._notify_waiters()

    def put(
        self,
        traj_ids: Any,
        sample_step: Any,
        group_ids: Any = None,
        timeout: Optional[float] = None,
        *,
        finish_step: Any = None,
        source: Any = None,
    ) -> None:
        # Owned copies: each caller array is read once, as the native wrapper's copies are.
        trajs = as_ids(traj_ids, "traj_ids", copy=True)
        slots = None if source is None else as_slots(source, len(trajs), "trajectories")
        slot_of = (lambda i: 0) if slots is None else (lambda i: int(slots[0 if len(slots) == 1 else i]))
        steps = as_steps(sample_step, "sample_step", len(trajs), copy=True).tolist()
        finish = self._finish_list(finish_step, len(trajs))
        groups_arr = None
        if group_ids is not None:
            groups_arr = as_ids(group_ids, "group_ids", copy=True)
            same_length(trajs, "traj_ids", groups_arr, "group_ids")
        timeout = as_timeout(timeout)
        n = len(trajs)
        traj_list = trajs.tolist()
        step_of = (lambda i: steps[0]) if len(steps) == 1 else (lambda i: steps[i])
        with self._cond:
            self._check_open()
            if n == 0:
                return
            self._check_fits(n, "put fewer")
            dup = self._first_duplicate(traj_list)
            if dup is not None:
                raise ValueError(f"traj_ids: trajectory {dup} appears twice; put each trajectory once")
            if groups_arr is None:
                groups = {i: [i] for i in range(n)}  # each trajectory is its own group
                key_of = traj_list
            else:
                groups = self._group_stably(groups_arr)
                key_of = groups_arr.tolist()
                self._check_uniform(groups, step_of, "sample_step", "stamped", "sample_step", 0)
                self._check_uniform(groups, slot_of, "source", "tagged", "source", -1)
            for i, end in enumerate(finish or ()):
                if end < step_of(i):
                    raise ValueError(
                        f"finish_step={end} of trajectory {traj_list[i]} is before its sample_step={step_of(i)}; "
                        "pass the step of the weights in force when it finished"
                    )
            if groups_arr is not None:
                self._check_finish_groups(finish, groups)
            by_finish = finish is not None and self.config.age_from == "finish"
            stamps = [finish[m[0]] if by_finish else step_of(m[0]) for m in groups.values()]  # type: ignore[index]
            if self._paced():
                self._check_pace_call_size(len(stamps), "put")
            deadline = time.monotonic() + (timeout or 0.0)
            waited = False
            while True:  # after a wait, validate again: another thread may have put one of these ids
                self._check_not_live(traj_list)
                if self._paced() and not self._wait_for_admission(stamps, timeout, "put", deadline, False):
                    waited = True
                    continue
                if self._wait_for_room(n, timeout, "put", deadline):
                    break
            if self._paced():
                self._counts["admitted"] += len(stamps)
                self._counts["admission_waits"] += waited
            now = time.time_ns()
            for members in groups.values():
                gid = key_of[members[0]]
                meta = _meta(-1, slot_of(members[0]), False, False)
                self._append(
                    [
                        self._record(
                            traj_list[i],
                            gid,
                            step_of(members[0]),
                            now,
                            now,
                            step_of(i) if finish is None else finish[i],
                            meta,
                        )
                        for i in members
                    ]
                )
                self._source_counts[_slot(meta), 0] += 1
                self._source_counts[_slot(meta), 1] += len(members)
                self._tagged |= _slot(meta) != 0
            self._restore_order()
            self._counts["dispatched"] += len(groups)
            self._counts["completed"] += len(groups)
            self._counts["put_total"] += n
            self._advance_clock_by_stamp(max(steps))
            for f_step in finish or []:
                self._advance_clock_by_stamp(f_step)
            self._notify_waiters()

    @staticmethod
    def _check_uniform(groups: Dict[int, List[int]], value_of: Any, arg: str, verb: str, what: str, shown: int) -> None:
        """Raises ValueError naming the first group whose members differ in ``value_of`` (shown plus ``shown``)."""
        for g, members in groups.items():
            for i in members[1:]:
                if value_of(i) != value_of(members[0]):
                    raise ValueError(
                        f"{arg}: group {g} has entries {verb} {value_of(members[0]) + shown} "
                        f"and {value_of(i) + shown}; a group shares one {what}"
                    )

    @staticmethod
    def _group_stably(keys: np.ndarray) -> Dict[int, List[int]]:
        groups: Dict[int, List[int]] = {}
        for i, key in enumerate(keys.tolist()):
            groups.setdefault(key, []).append(i)
        return groups  # dicts keep first-appearance order

    def _record(
        self, traj_id: int, group_id: int, step: int, dispatch_ns: int, complete_ns: int, finish_step: int, meta: int
    ) -> dict:
        return {
            "meta": meta,
            "traj_id": traj_id,
            "group_id": group_id,
            "sample_step": step,
            "policy_version": self._policy_version(step),
            "dispatch_ns": dispatch_ns,
            "complete_ns": complete_ns,
            "uses": 0,
            "finish_step": finish_step,
        }

    def _policy_version(self, step: int) -> int:
        sync = self.config.parameter_sync_step
        return step // sync if sync else -1

    def _wait_for_room(self, n: int, timeout: Optional[float], call: str, deadline: float) -> bool:
        cap, on_full = self.config.capacity, self.config.on_full
        if self._size + n <= cap or on_full == "evict_oldest":
            return True
        if on_full == "block" and is_probe(timeout):
            raise WouldBlock(f"{call} waits for room: {n} entries need room, {self._size} of capacity={cap} are ready")
        if on_full == "error" or timeout is None:
            hint = ", or pass timeout= to wait for room" if on_full == "block" else " or 'block'"
            raise BufferFullError(
                f"ring full: {n} entries do not fit, {self._size} of capacity={cap} are ready; "
                f"take more often, raise capacity, use on_full='evict_oldest'{hint}"
            )
        while True:
            self._wait(deadline)
            self._check_open()
            if self._size + n <= cap:
                return False  # room after waiting: the caller re-validates its arguments
            if time.monotonic() >= deadline:
                break
        raise TimeoutError(
            f"{call} timed out after {timeout} s waiting for room: {n} entries need room, "
            f"{self._size} of capacity={cap} are ready; take more often, raise capacity "
            "or use on_full='evict_oldest'"
        )

    def _append(self, records: List[dict]) -> None:
        need = len(records)
        evicted = 0
        while self._size + need > self.config.capacity:  # on_full="evict_oldest": whole groups, oldest first
            evicted += self._evict_oldest_group()
        self._counts["evicted"] += evicted
        self._evicted_unreported += evicted
        self._groups.append(records)
        self._size += need
        if self._live is not None:
            self._live.update(rec["traj_id"] for rec in records)

    def _evict_oldest_group(self) -> int:
        """Removes the oldest group (the caller counts it as evicted); returns its length."""
        oldest = self._groups.popleft()
        if self._observing():
            self._observe_lost(oldest, evicted=True)
        self._size -= len(oldest)
        for rec in oldest:
            self._note_left(rec["traj_id"], _EVICTED)
        return len(oldest)

    # -- pace: admission, the take gate, the stamp order (csrc/ring_admission.cpp) ---------------------------------
    def _paced(self) -> bool:
        return self.config.strategy == "pace"

    def _age_stamp(self, group: List[dict]) -> int:
        """The step a group's age is measured from: its dispatch step, or under age_from='finish' its finish step."""
        return group[0]["finish_step" if self.config.age_from == "finish" else "sample_step"]

    def _pace_next_take(self) -> int:
        return max(self._next_take, self._clock, 0)

    def _outstanding(self) -> List[int]:
        """One stamp per in-flight prompt (its dispatch step) and per ready group (its age stamp)."""
        return [rec[0] for rec in self._in_flight.values()] + [self._age_stamp(g) for g in self._groups]

    def _pace_admits(self, stamps: List[int]) -> bool:
        """Whether groups stamped ``stamps`` may start now: each stamp admitted one after the other, oldest first."""
        outstanding = self._outstanding()
        for stamp in sorted(stamps):
            limit = self.config.max_age
            if _reference_pace.admissible(outstanding, stamp, self._pace_next_take(), limit, *self._pace_args()) < 1:
                return False
            outstanding.append(stamp)
        return True

    def _pace_args(self) -> tuple:
        return self._per_step, self._lookahead

    def _admissible_now(self, step: int) -> int:
        return _reference_pace.admissible(
            self._outstanding(), step, self._pace_next_take(), self.config.max_age, *self._pace_args()
        )

    def _check_pace_call_size(self, groups: int, call: str) -> None:
        limit = (self._lookahead + 1) * self._per_step
        if groups > limit:
            what = "traj_ids" if call == "put" else "prompt_ids"
            unit = "groups" if call == "put" else "prompts"
            raise ValueError(
                f"{what}: {groups} {unit} exceed the admission limit {limit} = (lookahead + 1) * prompts_per_step; "
                f"{call} at most {limit} per call"
            )

    def _admission_message(self, stamps: List[int]) -> str:
        limit = (self._lookahead + 1) * self._per_step
        ready, in_flight = len(self._groups), len(self._in_flight)
        first = min(stamps)
        room = self._admissible_now(first)
        unit = "groups" if len(set(stamps)) > 1 else "prompts"
        text = (
            f"{len(stamps)} {unit} at step {first} do not fit strategy='pace': limit (lookahead + 1) * "
            f"prompts_per_step = {limit} prompt groups, {ready + in_flight} outstanding ({in_flight} in flight, "
            f"{ready} ready), {room} admissible now"
        )
        if room < limit - ready - in_flight:
            text += (
                f"; prompts stamped {first} must be trained by step {min(first + self.config.max_age, 2**63 - 1)} and "
                f"the trainer's "
                f"next take is at step {self._pace_next_take()}, so fewer slots remain for them"
            )
        return (
            text + "; take (train) to free slots, fail stuck prompts, dispatch with newer weights, or raise lookahead"
        )

    def _holds_protected_attempt(self, prompts: List[int]) -> bool:
        """Whether dispatching ``prompts`` now would start a protected (max_attempts) attempt; changes nothing."""
        k = self.config.max_attempts or 0
        return k > 0 and any(self._attempts.peek_untrained_run(p) >= k for p in prompts)

    def _protected_waiting_message(self) -> str:
        return f"{self._protected_waiting} protected (max_attempts) dispatch call(s) waiting for admission go first"

    def _wait_for_admission(
        self, stamps: List[int], timeout: Optional[float], call: str, deadline: float, protected_call: bool
    ) -> bool:
        """Returns True if admitted at once, False after waiting (the caller re-validates); raises otherwise.

        Protected attempts first: while a protected call waits, no other call is admitted (docs/design.md)."""
        if (protected_call or not self._protected_waiting) and self._pace_admits(stamps):
            return True
        first, max_age, next_take = min(stamps), self.config.max_age, self._pace_next_take()
        if first + max_age < next_take:  # past its deadline already: no take can make room for it
            self._counts["admission_refused"] += len(stamps)
            raise AdmissionError(
                f"{call}: prompts stamped {first} would pass max_age={max_age} before the trainer's next take at "
                f"step {next_take}, so no wait can admit them; dispatch with newer weights (step >= "
                f"{next_take - max_age})"
            )
        if is_probe(timeout):
            raise WouldBlock(f"{call} waits for admission under pace: {self._admission_message(stamps)}")
        if timeout is None:
            self._counts["admission_refused"] += len(stamps)
            if not protected_call and self._protected_waiting:
                raise AdmissionError(
                    f"{call}: {len(stamps)} {'groups' if call == 'put' else 'prompts'} not admitted under pace: "
                    f"{self._protected_waiting_message()} (a prompt at its max_attempts-th untrained attempt is "
                    "admitted before any other); pass timeout= to wait behind it, or take (train) to free slots"
                )
            raise AdmissionError(f"{call}: {self._admission_message(stamps)}; or pass timeout= to wait for a slot")
        if protected_call:
            self._protected_waiting += 1
        else:
            self._unprotected_waiting += 1
        try:
            while True:
                self._wait(deadline)
                self._check_open()
                self._expire_due()
                if (protected_call or not self._protected_waiting) and self._pace_admits(stamps):
                    return False
                if time.monotonic() >= deadline:
                    break
        finally:  # a protected waiter leaving (admitted, timed out, interrupted, closed) wakes those behind it
            if protected_call:
                self._protected_waiting -= 1
                self._notify_waiters()
            else:
                self._unprotected_waiting -= 1
        self._counts["admission_refused"] += len(stamps)
        self._counts["admission_waits"] += 1
        behind = not protected_call and self._protected_waiting > 0
        if behind and self._pace_admits(stamps):
            raise TimeoutError(
                f"{call} timed out after {timeout} s waiting for admission under pace behind a protected dispatch: "
                f"{self._protected_waiting_message()}; take (train) to free slots for them, or wait longer"
            )
        raise TimeoutError(
            f"{call} timed out after {timeout} s waiting for admission under pace"
            f"{' (behind a protected dispatch too)' if behind else ''}: {self._admission_message(stamps)}"
        )

    def _restore_order(self) -> None:
        """Under pace the groups stay sorted by age stamp (stable): oldest first is deque order."""
        if self._paced():
            self._groups = deque(sorted(self._groups, key=self._age_stamp))

    def _pace_blocker(self, plan: _Plan, current_step: int) -> Optional[int]:
        taken_groups = plan.walked
        return _reference_pace.blocker(
            [rec[0] for rec in self._in_flight.values()],
            [self._age_stamp(g) for g in self._groups],
            taken_groups,
            current_step,
            self.config.max_age,
            self._per_step,
        )

    def _pace_blocked_message(self, stamp: int, current_step: int) -> str:
        blocking = sorted((rec[0], p) for p, rec in self._in_flight.items() if rec[0] <= stamp)
        names = ", ".join(f"prompt {p} since step {s}" for s, p in blocking[:8])
        more = ", ..." if len(blocking) > 8 else ""
        return (
            f"{len(blocking)} in-flight prompt(s) stamped <= {stamp} ({names}{more}) would pass "
            f"max_age={self.config.max_age} if the trainer took newer groups at step {current_step} "
            f"(prompts_per_step={self._per_step} per step); complete or fail them, or increase max_age "
            "(max_off_policy_threshold)"
        )

    def admissible(self, step: int) -> int:
        if not self._paced():
            raise ValueError(
                f"admissible(): only strategy='pace' admits prompts; this buffer's strategy is "
                f"'{self.config.strategy}', which starts every dispatch at once"
            )
        step = as_step(step, "step")
        with self._cond:
            self._expire_due()
            return self._admissible_now(step)

    # -- taking: plan, commit, take, the wait gate (csrc/ring_take.cpp) ----------------------------------------------
    def take(
        self, batch_size: int, current_step: int, timeout: Optional[float] = None, *, bounded: bool = True
    ) -> Batch:
        batch_size = as_count(batch_size, "batch_size", 1)
        current_step = as_step(current_step, "current_step")
        timeout = as_timeout(timeout)
        check_bounded(bounded, self.config.strategy)
        with self._cond:
            self._check_open()
            self._expire_due()
            self._check_clock(current_step)
            plan = self._plan(batch_size, current_step, not bounded)
            if is_probe(timeout) and not plan.full:
                raise WouldBlock(self._short_cause(plan, batch_size, current_step))
            if timeout is not None and not plan.full:
                deadline = time.monotonic() + timeout
                while not plan.full:
                    self._wait(deadline)
                    self._check_open()
                    self._expire_due()
                    if time.monotonic() >= deadline:
                        plan = self._plan(batch_size, current_step, not bounded)
                        if plan.full:
                            break
                        cause = self._short_cause(plan, batch_size, current_step)
                        raise TimeoutError(f"take timed out after {timeout} s under {self.config.strategy}: {cause}")
                    self._check_clock(current_step)  # a producer may have stamped a later step
                    plan = self._plan(batch_size, current_step, not bounded)
            self._advance_clock_by_trainer(current_step)
            batch = self._commit(plan, current_step)
            if self._paced():
                self._next_take = max(self._next_take, min(current_step + 1, 2**63 - 1))
                self._notify_waiters()
            return batch

    def _short_cause(self, plan: _Plan, batch_size: int, current_step: int) -> str:
        """Why a take planned as ``plan`` is short of a full batch (its Timeout or WouldBlock message)."""
        if plan.blocked_by == "in_flight_at_max_age" and plan.pace_blocker is not None:
            return self._pace_blocked_message(plan.pace_blocker, current_step)
        if plan.blocked_by == "in_flight_at_max_age":
            return self._wait_blocked_message(current_step)
        return (
            f"only {plan.taken} fresh entries are ready for batch_size={batch_size} ({self._size} ready in all, "
            f"{len(self._in_flight)} prompts in flight); produce faster, lower batch_size or raise the timeout"
        )

    def _plan(self, batch_size: int, current_step: int, unbounded: bool = False) -> _Plan:
        """The take at ``current_step``; ``unbounded``: this call ignores every age bound (take's bounded=False)."""
        plan = _Plan()
        plan.unbounded = unbounded
        if self.config.strategy == "wait" and not unbounded and self._wait_blocked(current_step):
            plan.blocked_by = "in_flight_at_max_age"
            return plan
        for group in self._groups:
            if not unbounded and self._is_stale(group, current_step):
                plan.dropped += len(group)
                plan.walked += 1
                continue
            if len(group) > batch_size:
                raise ValueError(
                    f"batch_size={batch_size} is smaller than group {group[0]['group_id']} of "
                    f"{len(group)} trajectories; raise batch_size to at least {len(group)} "
                    "(a batch never splits a group)"
                )
            if plan.taken + len(group) > batch_size:
                plan.full = True
                break
            plan.taken += len(group)
            plan.walked += 1
            if plan.taken == batch_size:
                plan.full = True
                break
        plan.blocked_by = "none" if plan.full else "too_few_ready"
        if self._paced():  # the oldest groups are the batch; take it only if no in-flight prompt then passes max_age
            stamp = self._pace_blocker(plan, current_step)
            if stamp is not None:
                plan = _Plan()
                plan.blocked_by = "in_flight_at_max_age"
                plan.pace_blocker = stamp
        return plan

    def _commit(self, plan: _Plan, current_step: int) -> Batch:
        columns: List[List[int]] = [[] for _ in range(10)]
        hist = [0] * len(AGE_BUCKETS)
        age_sum = age_max = retired = over_age = span_sum = span_max = 0
        keep = []
        # Under pace every use is a group's last (docs/design.md, "Reuse under the bound"): admission reserved
        # one trainer slot per group, so a second use would take a slot no admitted group was promised.
        keep_below = 1 if self._paced() else self.config.max_uses
        observing = self._observing()
        by_slot: Dict[int, List[int]] = {}  # slot -> [taken, dropped] by this call
        for _ in range(plan.walked):
            group = self._groups.popleft()
            self._size -= len(group)
            if not plan.unbounded and self._is_stale(group, current_step):
                if observing:
                    by_slot.setdefault(_slot(group[0]["meta"]), [0, 0])[1] += len(group)
                    self._observe_lost(group, evicted=False)
                for rec in group:
                    self._note_left(rec["traj_id"], _DROPPED_STALE)
                continue
            for rec in group:
                rec["uses"] += 1
                age = current_step - self._age_stamp(group)
                for col, value in zip(
                    columns,
                    (
                        rec["traj_id"],
                        rec["group_id"],
                        rec["sample_step"],
                        age,
                        rec["uses"],
                        rec["policy_version"],
                        rec["dispatch_ns"],
                        rec["complete_ns"],
                        rec["finish_step"],
                        _slot(rec["meta"]) - 1,
                    ),
                ):
                    col.append(value)
                age_sum += age
                age_max = max(age_max, age)
                hist[age_bucket(age)] += 1
                over_age += age > self.config.max_age
                span = rec["finish_step"] - rec["sample_step"]
                span_sum += span
                span_max = max(span_max, span)
            if observing:
                by_slot.setdefault(_slot(group[0]["meta"]), [0, 0])[0] += len(group)
                self._observe_taken(group)
            if group[0]["uses"] < keep_below:
                keep.append(group)  # reused entries keep their place at the front
            else:
                retired += len(group)
                for rec in group:
                    self._note_left(rec["traj_id"], _RETIRED)
        for group in reversed(keep):
            self._groups.appendleft(group)
            self._size += len(group)
        self._counts["taken"] += plan.taken
        retired_early = retired if self._paced() and self.config.max_uses > 1 else 0
        self._counts["retired"] += retired
        self._counts["retired_early"] += retired_early
        self._counts["dropped_stale"] += plan.dropped
        self._counts["trained_over_age"] += over_age
        if plan.walked:
            self._notify_waiters()
        stats = (
            plan.taken,
            plan.dropped,
            retired,
            self._report_evicted(),
            plan.blocked_by,
            age_sum,
            age_max,
            tuple(hist),
            self._size,
            len(self._in_flight),
            self._counts["put_total"],
            self.config.max_age,
            self._counts["expired"],
            over_age,
            span_sum,
            span_max,
            self._counts["admitted"],
            self._counts["admission_refused"],
            self._counts["admission_waits"],
            self._attempts.snapshot()[0],
            tuple((slot - 1, *by_slot[slot]) for slot in sorted(by_slot)) if self._tagged else (),
            self._counts["protected_admitted"],
            self._counts["admitted_ahead"],
            retired_early,
        )
        if self._bias is not None:
            self._bias.on_take()
        self._watch_take(stats)
        # A numpy block, as the core's take: Batch makes the tensor on first access, so torch loads only then.
        return Batch(np.array(columns, dtype=np.int64).reshape(len(columns), plan.taken), make_metrics(stats))

    def _own_max_age(self, slot: int) -> int:
        return self._source_max_age.get(slot - 1, self.config.max_age) if slot else self.config.max_age

    def _is_stale(self, group: List[dict], current_step: int, any_strategy: bool = False) -> bool:
        """Whether the group is past its source's max_age (protected groups never are); only under drop,
        unless ``any_strategy`` (evict_stale applies the bounds under either strategy)."""
        meta = group[0]["meta"]
        if (self.config.strategy != "drop" and not any_strategy) or meta & _PROTECTED:
            return False
        return current_step - self._age_stamp(group) > self._own_max_age(_slot(meta))

    def _observing(self) -> bool:
        return self._bias is not None or self._tagged

    def _observe_lost(self, group: List[dict], evicted: bool) -> None:
        """Counts a group that leaves untaken-now: dropped stale or evicted; lost if it was never taken."""
        meta = group[0]["meta"]
        self._source_counts[_slot(meta), 5 if evicted else 4] += len(group)
        if group[0]["uses"] != 0 or not meta & _OBSERVED or self._bias is None:
            return
        self._bias.add(2, 0, (_latency_us(rec) for rec in group))
        self._bias.add(2, 1, (_length(rec["meta"]) for rec in group if _length(rec["meta"]) >= 0))
        self._attempts.on_lost(group[0]["group_id"], len(group))

    def _observe_taken(self, group: List[dict]) -> None:
        """Counts a group this take handed out (its uses already counted)."""
        slot = _slot(group[0]["meta"])
        self._source_counts[slot, 2] += len(group)
        if group[0]["uses"] != 1:
            return
        self._source_counts[slot, 3] += len(group)
        if group[0]["meta"] & _OBSERVED and self._bias is not None:
            self._bias.add(1, 0, (_latency_us(rec) for rec in group))
            self._bias.add(1, 1, (_length(rec["meta"]) for rec in group if _length(rec["meta"]) >= 0))
            self._attempts.on_trained(group[0]["group_id"])

    def _wait_blocked(self, current_step: int) -> bool:
        if not self._in_flight:
            return False
        return any(current_step - rec[0] >= self._own_max_age(_slot(rec[4])) for rec in self._in_flight.values())

    def _wait_blocked_message(self, current_step: int) -> str:
        limit = current_step - self.config.max_age
        blocking = sorted((rec[0], p) for p, rec in self._in_flight.items() if rec[0] <= limit)
        names = ", ".join(f"prompt {p} since step {s}" for s, p in blocking[:8])
        more = ", ..." if len(blocking) > 8 else ""
        return (
            f"{len(blocking)} in-flight prompt(s) at max_age={self.config.max_age} ({names}{more}); "
            "complete or fail them, or increase max_age (max_off_policy_threshold)"
        )

    # -- evict_stale (csrc/ring_evict.cpp) ---------------------------------------------------------------------------
    def evict_oldest(self, groups: int = 1) -> int:
        groups = as_count(groups, "groups", 0)
        with self._cond:
            self._check_open()
            evicted = sum(self._evict_oldest_group() for _ in range(min(groups, len(self._groups))))
            self._counts["evicted"] += evicted
            self._evicted_unreported += evicted
            if evicted:
                self._notify_waiters()
            return evicted

    def evict_stale(self, current_step: int) -> int:
        current_step = as_step(current_step, "current_step")
        with self._cond:
            self._check_open()
            self._expire_due()
            self._check_clock(current_step)
            self._advance_clock_by_trainer(current_step)
            stale = [self._is_stale(g, current_step, any_strategy=True) for g in self._groups]
            for group, old in zip(self._groups, stale):
                if old:
                    if self._observing():
                        self._observe_lost(group, evicted=False)
                    for rec in group:
                        self._note_left(rec["traj_id"], _DROPPED_STALE)
            fresh = deque(g for g, old in zip(self._groups, stale) if not old)
            removed = self._size - sum(len(g) for g in fresh)
            self._groups, self._size = fresh, self._size - removed
            self._counts["dropped_stale"] += removed
            if removed:
                self._notify_waiters()
            stats = (
                0,
                removed,
                0,
                self._report_evicted(),
                "none",
                0,
                0,
                (0,) * len(AGE_BUCKETS),
                self._size,
                len(self._in_flight),
                self._counts["put_total"],
                self.config.max_age,
                self._counts["expired"],
                0,
                0,
                0,
                self._counts["admitted"],
                self._counts["admission_refused"],
                self._counts["admission_waits"],
                self._attempts.snapshot()[0],
                (),
                self._counts["protected_admitted"],
                self._counts["admitted_ahead"],
                0,
            )
        make_metrics(stats)
        return removed

    # -- state: the ledger, getters, close, export and import of the state (csrc/ring_state.cpp) ---------------------
    def released(self) -> Released:
        with self._cond:
            if self._released is None:
                raise ValueError(NOT_TRACKED)
            records, self._released = list(self._released), deque()
        ids = np.array([i for i, _ in records], dtype=np.int64)
        return Released(ids, np.array([c for _, c in records], dtype=np.int8))

    def ledger(self) -> Dict[str, int]:
        with self._cond:
            self._expire_due()
            c = self._counts
            return {
                "dispatched": c["dispatched"],
                "completed": c["completed"],
                "failed": c["failed"],
                "put_total": c["put_total"],
                "sampled_total": c["put_total"],
                "taken": c["taken"],
                "retired": c["retired"],
                "dropped_stale": c["dropped_stale"],
                "evicted": c["evicted"],
                "in_flight": len(self._in_flight),
                "buffer_left": self._size,
                "max_age_changes": c["max_age_changes"],
                "expired": c["expired"],
                "released_overflow": self._released_overflow,
                "admitted": c["admitted"],
                "admission_refused": c["admission_refused"],
                "admission_waits": c["admission_waits"],
                "trained_over_age": c["trained_over_age"],
                "protected_admitted": c["protected_admitted"],
                "admitted_ahead": c["admitted_ahead"],
                "retired_early": c["retired_early"],
            }

    def __len__(self) -> int:
        return self._size

    @property
    def max_age(self) -> int:
        with self._cond:
            return self.config.max_age

    @max_age.setter
    def max_age(self, value: int) -> None:
        max_age = as_count(value, "max_age", 0)
        check_max_age_keeps_lookahead(self.config, max_age)
        with self._cond:
            if max_age == self.config.max_age:
                return
            self.config = dataclasses.replace(self.config, max_age=max_age)
            self._counts["max_age_changes"] += 1
            self._notify_waiters()  # under wait, a raised bound may unblock a waiting take

    @property
    def in_flight(self) -> int:
        with self._cond:
            self._expire_due()
            return len(self._in_flight)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._notify_waiters()

    def _waiting_repr(self) -> str:
        """Pace: the calls waiting for admission now, as the core's repr shows them (nothing when none)."""
        waiting = self._protected_waiting + self._unprotected_waiting
        return f", admission_waiting={waiting}, protected_waiting={self._protected_waiting}" if waiting else ""

    def __repr__(self) -> str:
        c = self.config
        return (
            f"ReferenceBuffer(capacity={c.capacity}, max_age={c.max_age}, strategy='{c.strategy}', "
            f"max_uses={c.max_uses}, on_full='{c.on_full}', ready={self._size}, in_flight={len(self._in_flight)}"
            f"{self._waiting_repr()}, clock={self._clock}{', closed=True' if self._closed else ''})"
        )

    def _attempts_now(self) -> Tuple[Tuple[int, ...], Dict[int, int]]:
        with self._cond:
            return self._attempts.snapshot()

    def _starved_now(self, min_attempts: int) -> Dict[int, int]:
        with self._cond:
            return self._attempts.starved_prompts(min_attempts)

    def _source_counts_now(self) -> np.ndarray:
        with self._cond:
            return self._source_counts.copy()

    def _bias_now(self) -> Optional[tuple]:
        with self._cond:
            return None if self._bias is None else self._bias.arrays()

    def _apply_source_max_age(self, source: int, max_age: int) -> None:
        with self._cond:
            if max_age < 0:
                self._source_max_age.pop(source, None)
            else:
                self._source_max_age[source] = max_age
            self._notify_waiters()  # under wait, a raised bound may unblock a waiting take

    def state_dict(self) -> Dict[str, Any]:
        with self._cond:
            self._expire_due()
            records = [(rec, len(g)) for g in self._groups for rec in g]
            columns = state.ENTRY_COLUMNS + state.LATER_ENTRY_COLUMNS
            entries = {k: [r[k] for r, _ in records] for k in columns if k != "group_len"}
            entries["group_len"] = [n for _, n in records]
            prompts = sorted(self._in_flight.items())
            now = self._lease_now()
            in_flight = {
                "prompt_id": [p for p, _ in prompts],
                "sample_step": [r[0] for _, r in prompts],
                "dispatch_ns": [r[1] for _, r in prompts],
                "lease_left_ns": [-1 if r[3] == _NO_LEASE else max(r[3] - now, 0) for _, r in prompts],
                "held_ns": [max(now - r[2], 0) for _, r in prompts],
                "meta": [r[4] for _, r in prompts],
            }
            return state.pack(
                self.config,
                entries,
                in_flight,
                self._counts,
                self._clock,
                self._evicted_unreported,
                self._next_take,
                attempts=self._attempts.export(),
                attempt_counters=self._attempts.counters,
                source_counts=self._source_counts.copy(),  # a snapshot: later puts must not change it
            )

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        with self._cond:
            self._check_open()
            s = state.unpack(state_dict, self.config.capacity, self.config.max_uses)
            cols = {k: v.tolist() for k, v in s["entries"].items()}
            live = None
            if self._live is not None:
                live = set(cols["traj_id"])
                if len(live) != len(cols["traj_id"]):
                    dup = self._first_duplicate(cols["traj_id"])
                    raise ValueError(
                        f"state_dict: trajectory {dup} is ready twice, which unique_ids=True forbids; "
                        "load it into a buffer without unique_ids"
                    )
            groups: deque = deque()
            i = 0
            while i < len(cols["traj_id"]):
                n = cols["group_len"][i]
                group = [
                    {k: cols[k][j] for k in state.ENTRY_COLUMNS + state.LATER_ENTRY_COLUMNS if k != "group_len"}
                    for j in range(i, i + n)
                ]
                for rec in group:  # derived from sample_step with this buffer's parameter_sync_step, as the core does
                    rec["policy_version"] = self._policy_version(rec["sample_step"])
                if self.config.age_from == "finish" and len({rec["finish_step"] for rec in group}) > 1:
                    steps = sorted({rec["finish_step"] for rec in group})
                    raise ValueError(
                        f"state_dict: group at entry {i} has finish steps {steps[0]} and {steps[1]}, which "
                        "age_from='finish' forbids; load it with age_from='start'"
                    )
                groups.append(group)
                i += n
            self._groups, self._size = groups, len(cols["traj_id"])
            self._live = live
            f = {k: v.tolist() for k, v in s["in_flight"].items()}
            now = self._lease_now()
            self._in_flight, self._leases = {}, {}
            for p, st, d, left, held, meta in zip(
                f["prompt_id"], f["sample_step"], f["dispatch_ns"], f["lease_left_ns"], f["held_ns"], f["meta"]
            ):
                # A restored lease keeps the time it had left when saved; the time since dispatch likewise.
                deadline = _NO_LEASE if left < 0 else min(now + left, _NO_LEASE - 1)
                self._in_flight[p] = (st, d, now - min(held, now), deadline, meta)
                if left >= 0:
                    self._leases[p] = deadline
            self._attempts.load(s["attempts"], s["attempt_counters"])
            self._source_counts = s["source_counts"].copy()
            metas = cols["meta"] + f["meta"]
            self._protected_seen = any(m & _PROTECTED for m in cols["meta"])
            self._tagged = any(_slot(m) != 0 for m in metas)
            observed = (
                bool(f["meta"]) or len(s["attempts"]["prompt_id"]) > 0 or any(m & _OBSERVED for m in cols["meta"])
            )
            if self._bias is None and observed:
                self._bias = bias.Sketches()
            self._counts = dict(s["ledger"])
            self._clock, self._clock_from_stamp = s["clock"], False  # a state_dict does not say who set it
            self._evicted_unreported = s["evicted_unreported"]
            self._next_take = s["next_take"]
            self._restore_order()
            self._notify_waiters()
