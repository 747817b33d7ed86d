"""One TransferQueue partition mirrored into a StalenessBuffer.

verl's rollout side writes a tag-only prompt key ``{uid}`` (``is_prompt``, ``status``,
``global_steps``) and trajectory keys ``{uid}_{session}_{index}``. Each refresh diffs one
``kv_list`` answer against what the mirror already knows and turns the changes into
``dispatch`` / ``complete`` / ``fail`` calls, so the native core owns the in-flight table, the
age cut and the selection. One ring entry stands for one prompt (its whole GRPO group), because
verl's ``batch_size`` counts prompts.

Absolute imports only: verl loads ``verl.py`` by file path, outside the package.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from pyfast_buffer import StalenessBuffer, sample_step_from_tag

IN_FLIGHT_STATUSES = ("pending", "running")
TERMINAL_STATUSES = ("finished", "failure")
STATUSES = IN_FLIGHT_STATUSES + TERMINAL_STATUSES


@dataclass
class Prompt:
    pid: int
    step: int
    state: str  # in_flight | ready | gone (taken, dropped or empty: ignored until TQ forgets the key)
    keys: List[str] = field(default_factory=list)


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
        self.max_age = self.buf.config.max_age
        self.strategy = self.buf.config.strategy
        self.lock = threading.Lock()
        self.prompts: Dict[str, Prompt] = {}
        self.uid_of: Dict[int, str] = {}
        self.ready_by_step: Dict[int, set] = {}
        self.in_flight: set = set()
        self.known_keys: set = set()
        self.traj_keys: Dict[str, List[str]] = {}
        self.items: Dict[str, dict] = {}  # the latest kv_list answer, read for batch tags and views
        self._next_pid = 0

    # ---- refresh -------------------------------------------------------------------------
    def refresh(self, items: Dict[str, dict]) -> List[str]:
        """Applies one kv_list answer; returns prompt keys to clear from TransferQueue (empty groups).

        Only what changed is parsed: the key sets are diffed in C, then new keys and the tags of
        in-flight prompts are read. Every tag read is checked before any state changes.
        """
        keys = items.keys()
        new, gone = keys - self.known_keys, self.known_keys - keys
        new_prompts: Dict[str, Tuple[str, int]] = {}
        new_trajs: Dict[str, List[str]] = {}
        for key in new:
            tag = items[key]
            if tag.get("is_prompt", False):
                new_prompts[key] = parse_prompt(self.partition_id, key, tag)
            else:
                new_trajs.setdefault(key.split("_", 1)[0], []).append(key)
        updates = {uid: parse_prompt(self.partition_id, uid, items[uid])
                   for uid in self.in_flight if uid in items and uid not in new_prompts}
        updates.update(new_prompts)
        self.items = items
        self.known_keys |= new
        self.known_keys -= gone
        for uid, traj_keys in new_trajs.items():
            self.traj_keys.setdefault(uid, []).extend(traj_keys)
        self._forget(gone)
        return self._apply(updates)

    def _apply(self, updates: Dict[str, Tuple[str, int]]) -> List[str]:
        dispatch: Dict[int, List[int]] = {}
        complete: List[Tuple[int, str]] = []
        fail: List[int] = []
        for uid, (status, step) in updates.items():
            p = self.prompts.get(uid)
            if p is None:
                p = self._new_prompt(uid, step)
                dispatch.setdefault(step, []).append(p.pid)
            elif p.state != "in_flight":
                continue
            elif p.step != step:  # verl re-issued the prompt at a later step: a new dispatch attempt
                fail.append(p.pid)
                p.step = step
                dispatch.setdefault(step, []).append(p.pid)
            if status in TERMINAL_STATUSES:
                complete.append((step, uid))
        if fail:
            self.buf.fail(fail)
        for step, pids in dispatch.items():
            self.buf.dispatch(pids, step)
        return self._complete(sorted(complete))

    def _forget(self, gone: set) -> None:
        """Drops what TransferQueue no longer lists; an in-flight prompt that vanished is failed."""
        vanished = []
        for key in gone:
            p = self.prompts.get(key)
            if p is None:
                if key.split("_", 1)[0] not in self.prompts:
                    self.traj_keys.pop(key.split("_", 1)[0], None)
                continue
            if p.state == "ready":
                continue  # cleared behind our back; skipped when taken (see take)
            if p.state == "in_flight":
                vanished.append(p.pid)
                self.in_flight.discard(key)
            del self.prompts[key]
            del self.uid_of[p.pid]
            self.traj_keys.pop(key, None)
        if vanished:
            self.buf.fail(vanished)

    def _new_prompt(self, uid: str, step: int) -> Prompt:
        p = Prompt(self._next_pid, step, "in_flight")
        self._next_pid += 1
        self.prompts[uid] = p
        self.uid_of[p.pid] = uid
        self.in_flight.add(uid)
        return p

    def _forget_missing(self, prompts: dict) -> None:
        gone_in_flight = []
        for uid in [u for u in self.prompts if u not in prompts]:
            p = self.prompts[uid]
            if p.state == "ready":
                continue  # cleared behind our back; skipped when taken (see take)
            if p.state == "in_flight":
                gone_in_flight.append(p.pid)
            del self.prompts[uid]
            del self.uid_of[p.pid]
        if gone_in_flight:
            self.buf.fail(gone_in_flight)

    def _complete(self, done: List[Tuple[int, str]]) -> List[str]:
        room = self.buf.config.capacity - len(self.buf)
        traj_pids, empty, to_clear = [], [], []
        for step, uid in done:
            keys = sorted(k for k in self.traj_keys.get(uid, ()) if k in self.items)
            p = self.prompts[uid]
            if not keys:  # a group with nothing to train on would only waste a batch slot
                empty.append(p.pid)
                p.state = "gone"
                self.in_flight.discard(uid)
                to_clear.append(uid)
                continue
            if room == 0:
                break  # the rest stays in flight here and in TransferQueue; a later refresh takes it in
            room -= 1
            p.state, p.keys = "ready", keys
            self.in_flight.discard(uid)
            self.ready_by_step.setdefault(step, set()).add(uid)
            traj_pids.append(p.pid)
        if empty:
            self.buf.fail(empty)
        if traj_pids:
            self.buf.complete(traj_pids, traj_pids)
        return to_clear

    # ---- drop and take -------------------------------------------------------------------
    def drop_stale(self, global_steps: int) -> List[Tuple[str, int, List[str]]]:
        """Under drop, removes every ready group with age > max_age; returns (uid, step, traj keys)."""
        if self.strategy != "drop":
            return []
        cutoff = global_steps - self.max_age  # a group is stale when its step < cutoff
        stale_steps = [s for s in self.ready_by_step if s < cutoff]
        if not stale_steps:
            return []
        dropped = []
        for step in stale_steps:
            for uid in self.ready_by_step.pop(step):
                p = self.prompts[uid]
                p.state = "gone"
                dropped.append((uid, step, p.keys))
        n = self.buf.evict_stale(global_steps)
        if n != len(dropped):  # the mirror and the core disagree: a bug, never a user error
            raise RuntimeError(f"pyfast_buffer: core dropped {n} groups, mirror expected {len(dropped)}")
        return dropped

    def take(self, batch_size: int, global_steps: int) -> Tuple[Optional[List[str]], Any]:
        """Takes ``batch_size`` whole groups at once or nothing; returns (uids or None, batch or TimeoutError)."""
        try:
            batch = self.buf.take(batch_size, global_steps, timeout=0)
        except TimeoutError as exc:
            return None, exc
        uids = []
        for pid in batch.traj_ids.tolist():
            uid = self.uid_of[pid]
            p = self.prompts[uid]
            self.ready_by_step[p.step].discard(uid)
            if not self.ready_by_step[p.step]:
                del self.ready_by_step[p.step]
            p.state = "gone"
            if uid in self.items:
                uids.append(uid)
        return uids, batch

    def batch_rows(self, uids: List[str]) -> Tuple[List[str], List[dict]]:
        """Trajectory keys and their latest tags for the given groups, group by group."""
        keys, tags = [], []
        for uid in uids:
            for key in self.prompts[uid].keys:
                tag = self.items.get(key)
                if tag is not None:
                    keys.append(key)
                    tags.append(tag)
        return keys, tags

    # ---- read-only views (verl's attribute names) ---------------------------------------
    def waited_on(self, global_steps: int) -> List[str]:
        """In-flight prompts this sampler is waiting for: those at max_age under wait, else all."""
        in_flight = [(self.prompts[uid].step, uid) for uid in self.in_flight]
        if self.strategy == "wait":
            in_flight = [(s, u) for s, u in in_flight if global_steps - s >= self.max_age]
        return [uid for _, uid in sorted(in_flight)]

    def sampleable(self, global_steps: int) -> List[str]:
        """Ready groups a take could return now, oldest first (under drop, fresh ones only)."""
        cutoff = global_steps - self.max_age if self.strategy == "drop" else None
        steps = sorted(s for s in self.ready_by_step if cutoff is None or s >= cutoff)
        return [uid for s in steps for uid in sorted(self.ready_by_step[s])]

    def prompt_tags(self) -> Dict[str, dict]:
        return {k: t for k, t in self.items.items() if t.get("is_prompt", False)}

    def keys_with_status(self, status: str) -> set:
        return {k for k, t in self.prompt_tags().items() if t.get("status") == status}
