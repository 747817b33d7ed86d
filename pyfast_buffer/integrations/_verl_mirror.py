"""One TransferQueue partition mirrored into a StalenessBuffer.

verl's rollout side writes a tag-only prompt key ``{uid}`` (``is_prompt``, ``status``,
``global_steps``) and trajectory keys ``{uid}_{session}_{index}``. Each refresh diffs one
``kv_list`` answer against what the mirror already knows and turns the changes into
``dispatch`` / ``fail`` calls, so the native core owns the in-flight table, the age cut, the clock
and the ledger. One ring entry stands for one prompt (its whole GRPO group), because verl's
``batch_size`` counts prompts; a terminal prompt without trajectories is a group like any other
(it takes a batch slot and contributes no trajectory keys, as in verl).

Order: a finished group is held here ("waiting", still in flight in the core) and completed into
the ring only just before the take that returns it, oldest ``(global_steps, uid)`` first. The ring
is FIFO, so this is what makes the order hold across refreshes: a group of an old step that
finishes after newer ones is still served before them. ``order()`` is exactly the order ``take``
serves (ring leftovers first, then the waiting groups sorted), so the sampleable views agree with it.

Callers serialise ``kv_list -> refresh -> drop/take -> kv_clear`` with ``poll_lock`` (answers are
applied in the order they were listed) and guard the state with ``lock``.

Absolute imports only: verl loads ``verl.py`` by file path, outside the package.
"""

from __future__ import annotations

import itertools

import threading
from collections import deque
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from pyfast_buffer import StalenessBuffer, sample_step_from_tag

IN_FLIGHT_STATUSES = ("pending", "running")
TERMINAL_STATUSES = ("finished", "failure")
STATUSES = IN_FLIGHT_STATUSES + TERMINAL_STATUSES


@dataclass
class Prompt:
    pid: int
    step: int
    state: str  # in_flight | waiting (ready, outside the ring) | ring | gone (taken or dropped)


@dataclass
class Taken:
    """One take: the prompt keys to clear, the batch rows (trajectory keys and tags) and the core's batch."""
    uids: List[str]
    keys: List[str]
    tags: List[dict]
    batch: object


def parse_prompt(partition_id: str, key: str, tag: dict) -> Tuple[str, int]:
    """Returns a prompt tag's (status, global_steps), or raises a ValueError naming the partition and key."""
    status = tag.get("status")
    if status not in STATUSES:
        raise ValueError(
            f"partition {partition_id!r}: prompt {key!r} has status={status!r}; "
            f"the rollout side must write one of {list(STATUSES)}"
        )
    try:
        return status, sample_step_from_tag(tag)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"partition {partition_id!r}: prompt {key!r}: {exc}") from None


class PartitionMirror:
    """The buffer, the uid <-> id map and the latest tags of one partition; guarded by ``lock``."""

    def __init__(self, partition_id: str, buffer_kwargs: dict) -> None:
        self.partition_id = partition_id
        self.buf = StalenessBuffer(on_full="error", pin_memory=False, **buffer_kwargs)
        self.capacity = self.buf.config.capacity
        self.max_age = self.buf.config.max_age
        self.strategy = self.buf.config.strategy
        self.lock = threading.Lock()
        self.poll_lock = threading.Lock()  # held across kv_list -> apply -> kv_clear (see the module docstring)
        self.last_list_s = 0.0  # duration of the last kv_list, read to pace polling
        self.prompts: Dict[str, Prompt] = {}
        self.uid_of: Dict[int, str] = {}
        self.in_flight: set = set()
        self.waiting: set = set()  # finished groups not yet completed into the ring
        self._waiting_sorted: Optional[List[str]] = None  # cache of _sorted_waiting(); None when stale
        self.ring: deque = deque()  # uids completed into the ring, in the core's (FIFO) order
        self.known_keys: set = set()
        self.traj_keys: Dict[str, Dict[str, None]] = {}  # uid -> ordered set of trajectory keys
        self.items: Dict[str, dict] = {}  # the latest kv_list answer, read for batch tags and views
        self.clock = 0  # the core's clock: max of dispatched steps and take/evict steps
        self._next_pid = 0

    def core_step(self, global_steps: int) -> int:
        """The step passed to the core: never below its clock.

        verl computes a negative staleness when the trainer's step is below a step already seen
        (a prompt stamped ahead of it, or a call with an older step); the core refuses a clock that
        goes back, so the step is clamped to the partition's clock instead of failing the sample.
        """
        return max(global_steps, self.clock)

    # ---- refresh -------------------------------------------------------------------------
    def refresh(self, items: Dict[str, dict]) -> None:
        """Applies one kv_list answer (the caller holds ``poll_lock``, so answers arrive in order).

        Only what changed is parsed: the key sets are diffed in C, then new keys and the tags of
        in-flight prompts are read. Every tag read is checked before any state changes.
        """
        keys = items.keys()
        new, gone = keys - self.known_keys, self.known_keys - keys
        new_prompts: Dict[str, Tuple[str, int]] = {}
        new_trajs: List[str] = []
        untagged = set()
        for key in new:
            tag = items[key]
            if not tag:  # TransferQueue lists a key before its tag is written: look again next refresh
                untagged.add(key)
            elif tag.get("is_prompt", False):
                new_prompts[key] = parse_prompt(self.partition_id, key, tag)
            else:
                new_trajs.append(key)
        updates = {uid: parse_prompt(self.partition_id, uid, items[uid])
                   for uid in self.in_flight if uid in items and uid not in new_prompts}
        updates.update(new_prompts)
        self.items = items
        self.known_keys |= new - untagged
        self.known_keys -= gone
        for key in sorted(new_trajs):
            self.traj_keys.setdefault(key.split("_", 1)[0], {})[key] = None
        self._forget(gone)
        self._apply(updates)

    def _apply(self, updates: Dict[str, Tuple[str, int]]) -> None:
        dispatch: Dict[int, List[int]] = {}
        done: List[Tuple[int, str]] = []
        fail: List[int] = []
        for uid, (status, step) in updates.items():
            p = self.prompts.get(uid)
            if p is None:
                p = self._new_prompt(uid, step)
                dispatch.setdefault(step, []).append(p.pid)
            elif p.state != "in_flight":
                continue  # taken, dropped or ready: a key TransferQueue still lists is not a new prompt
            elif p.step != step:  # verl re-issued the prompt at another step: a new dispatch attempt
                fail.append(p.pid)
                p.step = step
                dispatch.setdefault(step, []).append(p.pid)
            if status in TERMINAL_STATUSES:
                done.append((step, uid))
        if fail:
            self.buf.fail(fail)
        for step, pids in dispatch.items():
            self.buf.dispatch(pids, step)
            self.clock = max(self.clock, step)
        room = self.capacity - len(self.ring) - len(self.waiting)
        for _, uid in sorted(done)[:max(room, 0)]:
            # Beyond capacity the rest stays in flight here and in TransferQueue; a later refresh takes it in.
            self.prompts[uid].state = "waiting"
            self.in_flight.discard(uid)
            self.waiting.add(uid)
            self._waiting_sorted = None

    def _forget(self, gone: set) -> None:
        """Drops what TransferQueue no longer lists; an in-flight or waiting prompt that vanished is failed."""
        failed = []
        for key in gone:
            p = self.prompts.get(key)
            if p is None:  # a trajectory key
                uid = key.split("_", 1)[0]
                group = self.traj_keys.get(uid)
                if group is not None:
                    group.pop(key, None)
                    if not group and uid not in self.prompts:
                        del self.traj_keys[uid]
                continue
            if p.state == "ring":
                continue  # cleared behind our back after it entered the ring: taken with what is left
            if p.state in ("in_flight", "waiting"):
                failed.append(p.pid)
                self.in_flight.discard(key)
                self.waiting.discard(key)
                self._waiting_sorted = None
            del self.prompts[key]
            del self.uid_of[p.pid]
            self.traj_keys.pop(key, None)
        if failed:
            self.buf.fail(failed)

    def _new_prompt(self, uid: str, step: int) -> Prompt:
        p = Prompt(self._next_pid, step, "in_flight")
        self._next_pid += 1
        self.prompts[uid] = p
        self.uid_of[p.pid] = uid
        self.in_flight.add(uid)
        return p

    def group_keys(self, uid: str) -> List[str]:
        """The group's trajectory keys TransferQueue still lists, in key order, each once."""
        return [k for k in self.traj_keys.get(uid, ()) if k in self.items]

    # ---- order, drop and take ------------------------------------------------------------
    def _sorted_waiting(self) -> List[str]:
        """The waiting groups by (step, uid); cached until the waiting set changes (callers must not mutate it)."""
        if self._waiting_sorted is None:
            self._waiting_sorted = sorted(self.waiting, key=lambda u: (self.prompts[u].step, u))
        return self._waiting_sorted

    def order(self, global_steps: int, limit: Optional[int] = None) -> List[str]:
        """Ready groups in the order ``take`` serves them (under drop, fresh ones only), at most ``limit``."""
        out = itertools.chain(self.ring, self._sorted_waiting())
        if self.strategy == "drop":
            cutoff = self.core_step(global_steps) - self.max_age
            out = (u for u in out if self.prompts[u].step >= cutoff)
        return list(itertools.islice(out, limit))

    def _complete(self, uids: List[str]) -> None:
        if uids:
            pids = [self.prompts[u].pid for u in uids]
            self.buf.complete(pids, pids)
            for u in uids:
                self.prompts[u].state = "ring"
                self.waiting.discard(u)
            self._waiting_sorted = None
            self.ring.extend(uids)

    def drop_stale(self, global_steps: int) -> List[Tuple[str, int, List[str]]]:
        """Under drop, removes every ready group with age > max_age; returns (uid, step, traj keys)."""
        if self.strategy != "drop":
            return []
        step = self.core_step(global_steps)
        cutoff = step - self.max_age  # a group is stale when its step < cutoff
        stale_ring = [u for u in self.ring if self.prompts[u].step < cutoff]
        stale_waiting = list(itertools.takewhile(lambda u: self.prompts[u].step < cutoff, self._sorted_waiting()))
        if not stale_ring and not stale_waiting:
            return []
        self._complete(stale_waiting)  # into the ring, so that the core counts them as dropped_stale
        n = self.buf.evict_stale(step)
        self.clock = step
        stale = stale_ring + stale_waiting
        if n != len(stale):  # the mirror and the core disagree: a bug, never a user error
            raise RuntimeError(f"pyfast_buffer: core dropped {n} groups, mirror expected {len(stale)}")
        gone = set(stale)
        self.ring = deque(u for u in self.ring if u not in gone)
        dropped = []
        for uid in stale:
            p = self.prompts[uid]
            p.state = "gone"
            dropped.append((uid, p.step, self.group_keys(uid)))
        return dropped

    def waited_on(self, global_steps: int) -> List[str]:
        """In-flight prompts this sampler is waiting for: those at max_age under wait, else all."""
        in_flight = [(self.prompts[uid].step, uid) for uid in self.in_flight]
        if self.strategy == "wait":
            step = self.core_step(global_steps)
            in_flight = [(s, u) for s, u in in_flight if step - s >= self.max_age]
        return [uid for _, uid in sorted(in_flight)]

    def take(self, batch_size: int, global_steps: int) -> Tuple[Optional[Taken], str]:
        """Takes the first ``batch_size`` groups of ``order()`` at once, or nothing; returns (Taken or None, why)."""
        step = self.core_step(global_steps)
        if self.strategy == "wait" and self.waited_on(step):
            return None, "in-flight prompts at max_age"
        chosen = self.order(step, limit=batch_size)
        if len(chosen) < batch_size:
            return None, f"{len(chosen)} of {batch_size} groups ready"
        waiting = self._sorted_waiting()
        n = max(batch_size - len(self.ring), 0)
        if self.strategy == "wait":
            # Waiting groups are in flight for the core, which refuses to take while one is at max_age:
            # complete those too (they are the oldest, a prefix of the sorted order) and keep them in the ring.
            n = max(n, sum(1 for u in waiting if step - self.prompts[u].step >= self.max_age))
        self._complete(waiting[:n])
        batch = self.buf.take(batch_size, step, timeout=0)
        self.clock = step
        pids = batch.traj_ids.tolist()
        if pids != [self.prompts[u].pid for u in chosen]:
            raise RuntimeError(f"pyfast_buffer: core took {pids}, mirror expected {chosen}")
        keys, tags = [], []
        for uid in chosen:
            self.ring.popleft()
            self.prompts[uid].state = "gone"
            for key in self.group_keys(uid):
                keys.append(key)
                tags.append(self.items[key])
        return Taken([u for u in chosen if u in self.items], keys, tags, batch), ""

    # ---- read-only views (verl's attribute names) ---------------------------------------
    def sampleable(self, global_steps: int) -> List[str]:
        """Ready groups a take could return now, in the order it would return them."""
        return self.order(global_steps)

    def ready_count(self) -> int:
        return len(self.ring) + len(self.waiting)

    def prompt_tags(self) -> Dict[str, dict]:
        return {k: t for k, t in self.items.items() if t.get("is_prompt", False)}

    def keys_with_status(self, status: str) -> set:
        return {k for k, t in self.prompt_tags().items() if t.get("status") == status}
