"""What the NeMo RL sampler knows of NeMo's replay buffer: each prompt group, its id in our core, its state.

NeMo's ``TQReplayBuffer`` holds one entry per prompt-group *attempt*, in parallel lists (``meta_list``,
``start_weight_list``, ``end_weight_list``, ``target_step_list``, ``ready_list``, and the private ``_group_ids``),
and tells the sampler nothing of what happens to them. So the book learns it two ways:

- **events**: the sampler wraps the buffer's ``reserve``, ``commit`` and ``remove_group`` (the rollout manager looks
  them up on the instance at call time), so every attempt is seen exactly: reserve -> ``dispatch`` (under pace, bound
  to a slot ``admit`` already admitted), commit -> ``complete`` (finish step = the end weight version), a removal of
  an unfinished attempt (a failure or a cancellation) -> ``fail``;
- **a diff of the lists** at every sampler call, for what no event announced: groups a checkpoint restored (ready,
  never reserved: a ``put``), and entries removed by someone else (counted ``vanished``).

One core entry per group: NeMo trains a group whole. Absolute imports only; no NeMo import.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from typing import Any, Dict, Iterable, List, Optional

from pyfast_buffer.errors import AdmissionError

logger = logging.getLogger("pyfast_buffer.nemo_rl")

RUNNING, READY, UNADMITTED = "running", "ready", "unadmitted"
NO_LEASE_S = 1e9  # a bound attempt's lease: never expires (its slot's lease only covers the wait for a prompt)


def group_id_of(meta: Any) -> Optional[str]:
    """A committed group's id from its meta: its rows are ``{group_id}_g{i}`` (or a ``group_id`` tag)."""
    ids = getattr(meta, "sample_ids", None)
    if ids:
        head = str(ids[0])
        return head.rsplit("_g", 1)[0] if "_g" in head else head
    tags = getattr(meta, "tags", None)
    return tags[0].get("group_id") if tags else None


class Group:
    __slots__ = ("pid", "stamp", "status")

    def __init__(self, pid: int, status: str, stamp: int) -> None:
        self.pid, self.status, self.stamp = pid, status, stamp


class GroupBook:
    """Every prompt group of NeMo's buffer that the sampler has seen, and the core calls that mirror it."""

    def __init__(self, buffer: Any, core: Any, paced: bool, slot_lease_s: float) -> None:
        self.buffer = buffer
        self.core = core
        self.paced = paced
        self.slot_lease_s = slot_lease_s
        self.groups: Dict[str, Group] = {}
        self.by_pid: Dict[int, str] = {}
        self.next_pid = 0
        self.slots: deque = deque()  # pace: admitted slots (core prompts in flight) no attempt has taken yet
        self.slot_stamps: Dict[int, int] = {}  # pace: each slot's admission stamp
        self.returned: set = set()  # pace: slots a failed attempt gave back, waiting for NeMo's retry
        self.to_evict: set = set()  # in NeMo's buffer, dropped by us: the next evict() removes and counts them
        self.ghosts = 0  # ready core entries whose group someone else removed from NeMo's buffer
        self.generation_version: Optional[int] = None  # the newest start weight seen (generation's version)
        self.counts: Counter = Counter()

    # ---- identities -----------------------------------------------------------------------------------
    def full_view(self) -> bool:
        """Whether every entry, unfinished ones included, can be named (NeMo's buffer keeps ``_group_ids``)."""
        ids = getattr(self.buffer, "_group_ids", None)
        return ids is not None and len(ids) == len(self.buffer.ready_list)

    def indices(self) -> Dict[str, int]:
        """group id -> its index in NeMo's lists now, for every entry that can be named."""
        if self.full_view():
            return {str(g): i for i, g in enumerate(self.buffer._group_ids)}
        out = {}
        for i, meta in enumerate(self.buffer.meta_list):
            gid = group_id_of(meta) if meta is not None else None
            if gid is not None:
                out[gid] = i
        return out

    def new_pids(self, n: int) -> List[int]:
        pids = list(range(self.next_pid, self.next_pid + n))
        self.next_pid += n
        return pids

    def _add(self, gid: str, status: str, stamp: int, pid: Optional[int] = None) -> Group:
        pid = self.new_pids(1)[0] if pid is None else pid
        group = self.groups[gid] = Group(pid, status, stamp)
        self.by_pid[pid] = gid
        return group

    def forget(self, gid: str) -> None:
        group = self.groups.pop(gid, None)
        if group is not None:
            self.by_pid.pop(group.pid, None)
        self.to_evict.discard(gid)

    # ---- events -----------------------------------------------------------------------------------------
    def on_reserve(self, gid: str, start: int) -> None:
        """An attempt started generating with weights ``start``."""
        if gid in self.groups:
            return
        self.generation_version = start if self.generation_version is None else max(self.generation_version, start)
        if self.paced:
            while self.slots:  # a slot admit() admitted; one whose lease ran out (expired) is gone from the core
                pid = self.slots.popleft()
                self.returned.discard(pid)
                try:
                    self.core.renew([pid], NO_LEASE_S)
                except ValueError:
                    continue
                stamp = self._slot_stamp(pid, start)
                self._add(gid, RUNNING, stamp, pid)
                return
            try:  # a retry after a failure, or a prompt admit() did not gate: admitted now, or not at all
                pid = self.new_pids(1)[0]
                self.core.dispatch([pid], start)
            except AdmissionError:
                self._add(gid, UNADMITTED, start, pid)
                self.counts["started_unadmitted"] += 1
                return
            self._add(gid, RUNNING, start, pid)
            return
        group = self._add(gid, RUNNING, start)
        self.core.dispatch([group.pid], start)

    def _slot_stamp(self, pid: int, start: int) -> int:
        stamp = self.slot_stamps.pop(pid, start)
        if start < stamp:  # generation began on older weights than admission planned for (counted, see docs)
            self.counts["started_before_admission"] += 1
        return stamp

    def on_commit(self, gid: str, start: int, end: int, length: Optional[float]) -> None:
        """A group finished: ``start``/``end`` weight versions, ``length`` its mean response length (or None)."""
        group = self.groups.get(gid)
        lengths = None if length is None else [int(length)]
        if group is not None and group.status == RUNNING:
            self.core.complete([group.pid], [group.pid], finish_step=max(end, group.stamp), lengths=lengths)
            group.status = READY
            return
        if group is not None and group.status == READY:
            return
        # Never reserved that we saw (restored by a checkpoint, or generated unadmitted): in through the rule.
        pid = group.pid if group is not None else self.new_pids(1)[0]
        try:
            self.core.put([pid], start, finish_step=max(end, start))
        except AdmissionError:
            self._add(gid, READY, start, pid)
            self.to_evict.add(gid)
            self.counts["evicted_unadmitted"] += 1
            logger.info("group %s (start weight %d) does not fit the pace rule: evicted", gid, start)
            return
        self._add(gid, READY, start, pid)
        self.counts["restored" if group is None else "admitted_late"] += 1

    def on_remove(self, gid: str) -> None:
        """NeMo removed an attempt itself (a failure or a cancellation of an unfinished one). Under pace the
        attempt's admitted slot goes back, first in line, for NeMo's retry of the prompt: failed, the slot was gone,
        the retry started unadmitted and was evicted, and a step at ``max_age: 0`` waited for it forever. A slot no
        retry takes is freed by the core when its lease (``slot_lease_s``) runs out."""
        group = self.groups.get(gid)
        if group is None:
            return
        if group.status == RUNNING and self.paced:
            try:
                self.core.renew([group.pid], self.slot_lease_s)
            except ValueError:  # its lease ran out meanwhile: the core freed it already
                pass
            else:
                self.slots.appendleft(group.pid)
                self.slot_stamps[group.pid] = group.stamp
                self.returned.add(group.pid)
                self.counts["slots_returned"] += 1
            self.by_pid.pop(group.pid, None)
            self.groups.pop(gid, None)
            self.to_evict.discard(gid)
            return
        if group.status == RUNNING:
            self.core.fail([group.pid])
        elif group.status == READY:
            self.ghosts += 1  # the core cannot drop one ready entry; a take that meets it skips it
        self.forget(gid)

    def give_up(self, n: int, step: int) -> int:
        """NeMo gave up on ``n`` prompts of the batch trained at ``step`` (it asked that step for fewer groups):
        their returned slots, which no retry will take, are failed so pace's gate stops waiting for them."""
        pids = [pid for pid in self.slots if pid in self.returned and self.slot_stamps.get(pid, step) <= step][:n]
        for pid in pids:
            self.slots.remove(pid)
            self.returned.discard(pid)
            self.slot_stamps.pop(pid, None)
            try:
                self.core.fail([pid])
            except ValueError:  # its lease ran out first: the core failed it already
                continue
        self.counts["given_up"] += len(pids)
        return len(pids)

    # ---- the diff ---------------------------------------------------------------------------------------------
    def observe(self) -> Dict[str, int]:
        """Applies what no event announced; returns group id -> index (for the caller's removals)."""
        buffer = self.buffer
        index = self.indices()
        end_weights = getattr(buffer, "end_weight_list", None)
        for gid, i in index.items():
            group = self.groups.get(gid)
            ready = bool(buffer.ready_list[i])
            start = int(buffer.start_weight_list[i])
            end = int(end_weights[i]) if end_weights is not None and end_weights[i] >= 0 else start
            if group is None:
                if ready:
                    self.on_commit(gid, start, end, None)
                else:
                    self.on_reserve(gid, start)
            elif ready and group.status == RUNNING:
                self.on_commit(gid, start, end, None)
        full = self.full_view()
        for gid in [g for g, group in self.groups.items() if g not in index and (full or group.status == READY)]:
            self.counts["vanished"] += 1
            self.on_remove(gid)
        return index

    def gids(self, pids: Iterable[int]) -> List[Optional[str]]:
        return [self.by_pid.get(int(pid)) for pid in pids]
