"""ReferenceBuffer: the pure-Python twin of StalenessBuffer, written the plain way.

A deque of groups, each a list of per-trajectory record dicts, a dict of
in-flight prompts and a few counters, all under one threading.Condition. It has
the same API, the same semantics and the same exceptions as the native buffer:
it is the test oracle and the benchmark baseline, so it favours obviousness
over speed. Its sections follow the core's files (``csrc/ring_common.cpp``, ``ring_in_flight``,
``ring_write``, ``ring_take``, ``ring_evict``, ``ring_state``), so one can be read beside the other.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from typing import Any, Dict, List, Optional, Set

import numpy as np
import torch

from . import state
from ._args import as_count, as_ids, as_lease, as_seconds, as_step, as_steps, as_timeout, same_length
from ._buffer_base import BufferBase
from .batch import AGE_BUCKETS, Batch, age_bucket, make_metrics
from .config import resolve_pin_memory
from .errors import CLOSED_MESSAGE, BufferClosedError, BufferFullError
from .released import NOT_TRACKED, Released, default_release_bound

_RETIRED, _DROPPED_STALE, _EVICTED, _FAILED, _EXPIRED = range(5)  # codes of RELEASE_REASONS


_NO_LEASE = 2**63 - 1  # the deadline of a prompt without a lease, as in the core
_WAKE_S = 0.1  # longest sleep of a blocking call between two looks at signals, leases and its deadline


class _Plan:
    def __init__(self) -> None:
        self.walked = self.taken = self.dropped = 0  # walked counts groups here
        self.full = False
        self.blocked_by = "none"


class ReferenceBuffer(BufferBase):
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
    ) -> None:
        self._configure(locals())
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
        self._evicted_unreported = 0
        self._closed = False
        self._cond = threading.Condition()

    def _check_open(self) -> None:
        if self._closed:
            raise BufferClosedError(CLOSED_MESSAGE)

    def _check_clock(self, current_step: int) -> None:
        if current_step < self._clock:
            raise ValueError(
                f"current_step={current_step} is lower than step {self._clock} already seen; "
                "the trainer's step never goes back, pass the current global step"
            )

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
    def dispatch(self, prompt_ids: Any, step: int, lease: Optional[float] = None) -> None:
        prompts = as_ids(prompt_ids, "prompt_ids").tolist()
        step = as_step(step, "step")
        lease = as_lease(lease)
        with self._cond:
            self._check_open()
            self._expire_due()
            dup = self._first_duplicate(prompts)
            if dup is not None:
                raise ValueError(f"prompt_ids: prompt {dup} appears twice; dispatch each prompt once")
            for p in prompts:
                if p in self._in_flight:
                    raise ValueError(
                        f"prompt_ids: prompt {p} is already in flight (dispatched at step "
                        f"{self._in_flight[p][0]}); complete or fail it before dispatching it again"
                    )
            now, since = time.time_ns(), self._lease_now()
            deadline = _NO_LEASE if lease is None else min(since + int(lease * 1e9), _NO_LEASE - 1)
            for p in prompts:
                self._in_flight[p] = (step, now, since, deadline)
                if lease is not None:
                    self._leases[p] = deadline
            self._counts["dispatched"] += len(prompts)
            self._clock = max(self._clock, step)

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
                self._note_left(p, _FAILED)
            self._counts["failed"] += len(prompts)
            self._cond.notify_all()

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
                step, dispatched_at, since, _ = self._in_flight[p]
                self._in_flight[p] = (step, dispatched_at, since, deadline)
                self._leases[p] = deadline

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
            self._cond.notify_all()

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
            self._note_left(p, _EXPIRED)
        self._counts["failed"] += len(prompts)
        self._counts["expired"] += len(prompts)
        if prompts:
            self._cond.notify_all()

    def _expire_due(self) -> int:
        """Fails every prompt whose lease passed, by deadline then id; returns how many."""
        if self._closed or not self._leases:
            return 0
        now = self._lease_now()
        due = sorted((d, p) for p, d in self._leases.items() if d <= now)
        self._expire([p for _, p in due])
        return len(due)

    # -- writing: complete, put, grouping, on_full, eviction of the oldest (csrc/ring_write.cpp) ---------------------
    def complete(self, traj_ids: Any, prompt_ids: Any, timeout: Optional[float] = None) -> None:
        trajs, prompts = as_ids(traj_ids, "traj_ids", copy=True), as_ids(prompt_ids, "prompt_ids", copy=True)
        same_length(trajs, "traj_ids", prompts, "prompt_ids")
        timeout = as_timeout(timeout)
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
            deadline = time.monotonic() + (timeout or 0.0)
            while True:
                self._expire_due()
                self._check_in_flight(groups)
                self._check_not_live(traj_list)
                if self._wait_for_room(n, timeout, "complete", deadline):
                    break
            now = time.time_ns()
            for p, members in groups.items():
                step, dispatched_at, _, _ = self._pop_in_flight(p)
                self._append([self._record(traj_list[i], p, step, dispatched_at, now) for i in members])
            self._counts["completed"] += len(groups)
            self._counts["put_total"] += n
            self._cond.notify_all()

    def put(self, traj_ids: Any, sample_step: Any, group_ids: Any = None, timeout: Optional[float] = None) -> None:
        # Owned copies: each caller array is read once, as the native wrapper's copies are.
        trajs = as_ids(traj_ids, "traj_ids", copy=True)
        steps = as_steps(sample_step, "sample_step", len(trajs), copy=True).tolist()
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
                for g, members in groups.items():
                    for i in members[1:]:
                        if step_of(i) != step_of(members[0]):
                            raise ValueError(
                                f"sample_step: group {g} has entries stamped {step_of(members[0])} "
                                f"and {step_of(i)}; a group shares one sample_step"
                            )
            deadline = time.monotonic() + (timeout or 0.0)
            while True:  # after a wait, validate again: another thread may have put one of these ids
                self._check_not_live(traj_list)
                if self._wait_for_room(n, timeout, "put", deadline):
                    break
            now = time.time_ns()
            for members in groups.values():
                gid = key_of[members[0]]
                self._append([self._record(traj_list[i], gid, step_of(members[0]), now, now) for i in members])
            self._counts["dispatched"] += len(groups)
            self._counts["completed"] += len(groups)
            self._counts["put_total"] += n
            self._clock = max(self._clock, max(steps))
            self._cond.notify_all()

    @staticmethod
    def _group_stably(keys: np.ndarray) -> Dict[int, List[int]]:
        groups: Dict[int, List[int]] = {}
        for i, key in enumerate(keys.tolist()):
            groups.setdefault(key, []).append(i)
        return groups  # dicts keep first-appearance order

    def _record(self, traj_id: int, group_id: int, step: int, dispatch_ns: int, complete_ns: int) -> dict:
        return {
            "traj_id": traj_id,
            "group_id": group_id,
            "sample_step": step,
            "policy_version": self._policy_version(step),
            "dispatch_ns": dispatch_ns,
            "complete_ns": complete_ns,
            "uses": 0,
        }

    def _policy_version(self, step: int) -> int:
        sync = self.config.parameter_sync_step
        return step // sync if sync else -1

    def _wait_for_room(self, n: int, timeout: Optional[float], call: str, deadline: float) -> bool:
        cap, on_full = self.config.capacity, self.config.on_full
        if self._size + n <= cap or on_full == "evict_oldest":
            return True
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
            oldest = self._groups.popleft()
            self._size -= len(oldest)
            evicted += len(oldest)
            for rec in oldest:
                self._note_left(rec["traj_id"], _EVICTED)
        self._counts["evicted"] += evicted
        self._evicted_unreported += evicted
        self._groups.append(records)
        self._size += need
        if self._live is not None:
            self._live.update(rec["traj_id"] for rec in records)

    # -- taking: plan, commit, take, the wait gate (csrc/ring_take.cpp) ----------------------------------------------
    def take(self, batch_size: int, current_step: int, timeout: Optional[float] = None) -> Batch:
        batch_size = as_count(batch_size, "batch_size", 1)
        current_step = as_step(current_step, "current_step")
        timeout = as_timeout(timeout)
        with self._cond:
            self._check_open()
            self._expire_due()
            self._check_clock(current_step)
            plan = self._plan(batch_size, current_step)
            if timeout is not None and not plan.full:
                deadline = time.monotonic() + timeout
                while not plan.full:
                    self._wait(deadline)
                    self._check_open()
                    self._expire_due()
                    if time.monotonic() >= deadline:
                        plan = self._plan(batch_size, current_step)
                        if plan.full:
                            break
                        if plan.blocked_by == "in_flight_at_max_age":
                            cause = self._wait_blocked_message(current_step)
                        else:
                            cause = (
                                f"only {plan.taken} fresh entries are ready for batch_size={batch_size} "
                                f"({self._size} ready in all, {len(self._in_flight)} prompts in flight); "
                                "produce faster, lower batch_size or raise the timeout"
                            )
                        raise TimeoutError(f"take timed out after {timeout} s under {self.config.strategy}: {cause}")
                    self._check_clock(current_step)  # a producer may have stamped a later step
                    plan = self._plan(batch_size, current_step)
            self._clock = max(self._clock, current_step)
            return self._commit(plan, current_step)

    def _plan(self, batch_size: int, current_step: int) -> _Plan:
        plan = _Plan()
        if self.config.strategy == "wait" and self._wait_blocked(current_step):
            plan.blocked_by = "in_flight_at_max_age"
            return plan
        for group in self._groups:
            if self._is_stale(group, current_step):
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
        return plan

    def _commit(self, plan: _Plan, current_step: int) -> Batch:
        columns: List[List[int]] = [[] for _ in range(8)]
        hist = [0] * len(AGE_BUCKETS)
        age_sum = age_max = retired = 0
        keep = []
        for _ in range(plan.walked):
            group = self._groups.popleft()
            self._size -= len(group)
            if self._is_stale(group, current_step):
                for rec in group:
                    self._note_left(rec["traj_id"], _DROPPED_STALE)
                continue
            for rec in group:
                rec["uses"] += 1
                age = current_step - rec["sample_step"]
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
                    ),
                ):
                    col.append(value)
                age_sum += age
                age_max = max(age_max, age)
                hist[age_bucket(age)] += 1
            if group[0]["uses"] < self.config.max_uses:
                keep.append(group)  # reused entries keep their place at the front
            else:
                retired += len(group)
                for rec in group:
                    self._note_left(rec["traj_id"], _RETIRED)
        for group in reversed(keep):
            self._groups.appendleft(group)
            self._size += len(group)
        self._counts["taken"] += plan.taken
        self._counts["retired"] += retired
        self._counts["dropped_stale"] += plan.dropped
        if plan.walked:
            self._cond.notify_all()
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
        )
        return Batch(torch.tensor(columns, dtype=torch.int64).reshape(8, plan.taken), make_metrics(stats))

    def _is_stale(self, group: List[dict], current_step: int) -> bool:
        return self.config.strategy == "drop" and current_step - group[0]["sample_step"] > self.config.max_age

    def _wait_blocked(self, current_step: int) -> bool:
        if not self._in_flight:
            return False
        oldest = min(rec[0] for rec in self._in_flight.values())
        return current_step - oldest >= self.config.max_age

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
    def evict_stale(self, current_step: int) -> int:
        current_step = as_step(current_step, "current_step")
        with self._cond:
            self._check_open()
            self._expire_due()
            self._check_clock(current_step)
            self._clock = current_step
            cutoff = current_step - self.config.max_age
            for group in self._groups:
                if group[0]["sample_step"] < cutoff:
                    for rec in group:
                        self._note_left(rec["traj_id"], _DROPPED_STALE)
            fresh = deque(g for g in self._groups if g[0]["sample_step"] >= cutoff)
            removed = self._size - sum(len(g) for g in fresh)
            self._groups, self._size = fresh, self._size - removed
            self._counts["dropped_stale"] += removed
            if removed:
                self._cond.notify_all()
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
        with self._cond:
            if max_age == self.config.max_age:
                return
            self.config = dataclasses.replace(self.config, max_age=max_age)
            self._counts["max_age_changes"] += 1
            self._cond.notify_all()  # under wait, a raised bound may unblock a waiting take

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
            self._cond.notify_all()

    def __repr__(self) -> str:
        c = self.config
        return (
            f"ReferenceBuffer(capacity={c.capacity}, max_age={c.max_age}, strategy='{c.strategy}', "
            f"max_uses={c.max_uses}, on_full='{c.on_full}', ready={self._size}, in_flight={len(self._in_flight)}, "
            f"clock={self._clock}{', closed=True' if self._closed else ''})"
        )

    def state_dict(self) -> Dict[str, Any]:
        with self._cond:
            self._expire_due()
            records = [(rec, len(g)) for g in self._groups for rec in g]
            entries = {k: [r[k] for r, _ in records] for k in state.ENTRY_COLUMNS if k != "group_len"}
            entries["group_len"] = [n for _, n in records]
            prompts = sorted(self._in_flight.items())
            now = self._lease_now()
            in_flight = {
                "prompt_id": [p for p, _ in prompts],
                "sample_step": [r[0] for _, r in prompts],
                "dispatch_ns": [r[1] for _, r in prompts],
                "lease_left_ns": [-1 if r[3] == _NO_LEASE else max(r[3] - now, 0) for _, r in prompts],
                "held_ns": [max(now - r[2], 0) for _, r in prompts],
            }
            return state.pack(self.config, entries, in_flight, self._counts, self._clock, self._evicted_unreported)

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
                groups.append(
                    [{k: cols[k][j] for k in state.ENTRY_COLUMNS if k != "group_len"} for j in range(i, i + n)]
                )
                i += n
            self._groups, self._size = groups, len(cols["traj_id"])
            self._live = live
            f = {k: v.tolist() for k, v in s["in_flight"].items()}
            now = self._lease_now()
            self._in_flight, self._leases = {}, {}
            for p, st, d, left, held in zip(
                f["prompt_id"], f["sample_step"], f["dispatch_ns"], f["lease_left_ns"], f["held_ns"]
            ):
                # A restored lease keeps the time it had left when saved; the time since dispatch likewise.
                deadline = _NO_LEASE if left < 0 else min(now + left, _NO_LEASE - 1)
                self._in_flight[p] = (st, d, now - min(held, now), deadline)
                if left >= 0:
                    self._leases[p] = deadline
            self._counts = dict(s["ledger"])
            self._clock = s["clock"]
            self._evicted_unreported = s["evicted_unreported"]
            self._cond.notify_all()
