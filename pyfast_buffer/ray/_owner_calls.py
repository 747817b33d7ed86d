"""The index actor's calls about payload owners: starting one per node (detached, named in the buffer's
namespace), finding them again after a restart, and learning of an owner's death, from a client or from Ray
itself (each owner holds a lifeline call of the index that only its death ends). A part of ``BufferActor``
(``_actor``), which holds the attributes named below.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import ray
from ray.exceptions import RayActorError

from ._calls import actor_state

#: Longest the owners' watch sleeps between two looks at the list of lifelines (new owners join at the next look).
OWNER_WATCH_S = 1.0


class OwnerCalls:
    """Starting, finding and burying payload owners (a part of BufferActor, which has these attributes)."""

    _lock: threading.RLock
    _name: str
    _namespace: str
    _task_events: bool
    _capacity_bytes: Optional[int]
    _owner_nodes: List[str]
    _owners: List[Any]
    _lifelines: Dict[Any, int]
    _where: Any
    _sizes: Any
    _bytes_held: int
    _reserved: Dict[int, int]
    _reserved_by: Dict[int, int]
    _journal: Any
    _announce: Callable[[], None]

    def _owner_name(self, slot: int) -> str:
        return f"{self._name}.payloads.{slot}"

    def _find_owner(self, slot: int) -> Optional[Any]:
        try:
            return ray.get_actor(self._owner_name(slot), namespace=self._namespace)
        except ValueError:
            return None

    def owner_for(self, node_id: str) -> Tuple[int, Any]:
        """The slot and handle of the payload owner of ``node_id``, started (detached, pinned there) if needed."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from ._owner import PayloadOwner

        with self._lock:
            for slot, node in enumerate(self._owner_nodes):
                if node == node_id:
                    return slot, self._owners[slot]
            slot = len(self._owner_nodes)
            owner = (
                ray.remote(PayloadOwner)
                .options(
                    name=self._owner_name(slot),
                    namespace=self._namespace,
                    lifetime="detached",  # owned by Ray's control store: outlives this index and its creator
                    num_cpus=0,
                    max_concurrency=64,
                    enable_task_events=self._task_events,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                )
                .remote(ray.get_runtime_context().current_actor, slot, self._capacity_bytes is not None)
            )
            self._owner_nodes.append(node_id)
            self._owners.append(owner)
            self._lifelines[cast(Any, owner).lifeline.remote()] = slot
            version = self._journal.mark()
        self._journal.wait(version)
        return slot, owner

    def owner_died(self, slot: int) -> None:
        """A client found this owner dead: its node gets a new owner (and slot) at the next put from there.

        Its payloads died with it: their bytes leave the byte budget now (their ids stay, mapped to the dead
        slot, so a take counts them ``payload_lost``, unless a retried put moves them to the new owner), and so
        does the room it had reserved; admissions it still has waiting here are refused."""
        with self._lock:
            if not (0 <= slot < len(self._owners) and self._owner_nodes[slot]):
                return
            self._owner_nodes[slot], self._owners[slot] = "", None
            gone = [k for k, at in self._where.items() if at == slot]
            if gone:
                self._bytes_held -= sum(self._sizes.pop_many(gone, 0))
            for request in [r for r, at in self._reserved_by.items() if at == slot]:
                del self._reserved_by[request]
                self._reserved.pop(request, None)
            self._announce()  # room may have been freed
            version = self._journal.mark()
        self._journal.wait(version)

    def _watch_owners(self) -> None:
        """Marks an owner dead as soon as Ray reports it dead (its lifeline call fails), so that a dead owner's
        bytes and reservations leave the byte budget, and its waiting admissions are refused, even when no client
        is left to report it (the owner and its producer both killed)."""
        while True:
            with self._lock:
                refs = list(self._lifelines)
            if not refs:
                time.sleep(OWNER_WATCH_S)
                continue
            ready, _ = ray.wait(refs, num_returns=1, timeout=OWNER_WATCH_S, fetch_local=False)
            for ref in ready:
                with self._lock:
                    slot = self._lifelines.pop(ref, None)
                if slot is None:
                    continue
                try:
                    ray.get(ref, timeout=0)
                    continue  # replaced by a newer lifeline call: the owner lives
                except RayActorError:
                    pass
                owner = self._owners[slot] if slot < len(self._owners) else None
                if owner is None:
                    continue
                if actor_state(owner) == "DEAD":
                    self.owner_died(slot)
                else:  # unreachable for a moment: watch it again
                    with self._lock:
                        self._lifelines[owner.lifeline.remote()] = slot

    def owners(self) -> List[Any]:
        with self._lock:
            return list(self._owners)
