"""What the slime and Miles adapters share: reading their ``Sample`` groups and a store of finished groups kept in
our ``StalenessBuffer`` (one ring entry per group, so a take hands out whole groups and the ledger counts groups).

Miles is a fork of slime; both ``Sample`` types carry ``status`` (an Enum whose value is ``"aborted"`` for an
aborted sample) and ``weight_versions`` (the engine weight version of each generation turn, as strings). Nothing
here imports either framework.
"""

from __future__ import annotations

import importlib
import pickle
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from pyfast_buffer.buffer import StalenessBuffer

#: max_age standing for "no bound" (``--max-weight-staleness`` unset): far above any weight version.
UNBOUNDED = 1 << 40
STRATEGIES = ("drop", "wait", "pace")
#: Version of the pickled state ``GroupStore.state_dict`` writes; ``load_state_dict`` refuses others.
STATE_FORMAT = 1


def iter_samples(group: Any) -> Iterator[Any]:
    """The samples of a group: ``list[Sample]``, or ``list[list[Sample]]`` for multi-sample trajectories."""
    for item in group:
        if isinstance(item, list):
            yield from item
        else:
            yield item


def sample_oldest_version(sample: Any) -> Optional[int]:
    numeric = [int(v) for v in (getattr(sample, "weight_versions", None) or ()) if str(v).isdigit()]
    return min(numeric) if numeric else None


def group_oldest_version(group: Any) -> Optional[int]:
    """The smallest weight version over every sample and turn of ``group`` (None when none carries one): the
    stamp our buffer ages the group from, as Miles's ``group_oldest_weight_version`` does."""
    versions = [v for s in iter_samples(group) if (v := sample_oldest_version(s)) is not None]
    return min(versions) if versions else None


def is_aborted(group: Any) -> bool:
    return any(getattr(getattr(s, "status", None), "value", None) == "aborted" for s in iter_samples(group))


def load_by_path(path: Optional[str], what: str) -> Optional[Callable[..., Any]]:
    """Imports ``module.attr`` as the frameworks' ``load_function`` does (None for an empty path)."""
    if not path:
        return None
    module, _, name = str(path).rpartition(".")
    if not module:
        raise ValueError(f"{what}={path!r} must be a dotted path 'module.attribute'")
    return getattr(importlib.import_module(module), name)


def resolve_strategy(value: Optional[str], where: str) -> str:
    if value not in STRATEGIES:
        raise ValueError(f"{where}: strategy={value!r} is unknown; use one of {', '.join(STRATEGIES)}")
    return value


class GroupStore:
    """Finished groups (any payload) behind a ``StalenessBuffer``: group ``gid`` is ring entry ``gid``.

    ``dispatch``/``complete``/``fail`` follow a group the producer announced; ``put`` enters one the buffer never
    saw start (stamped with its oldest weight version). ``take`` returns the payloads trained and those the
    strategy dropped stale, so the adapter can hand the dropped ones to the framework's unused-group handler.
    """

    def __init__(
        self,
        *,
        strategy: str,
        max_age: Optional[int],
        capacity: int,
        prompts_per_step: Optional[int] = None,
        buffer_class: Callable[..., Any] = StalenessBuffer,
    ) -> None:
        self.strategy = strategy
        bound = UNBOUNDED if max_age is None else max_age
        pace = strategy == "pace"
        # Under pace at most (max_age + 1) * P groups are outstanding; the ring holds them all.
        room = max(capacity, (bound + 1) * prompts_per_step) if pace and prompts_per_step else capacity
        # buffer_class: StalenessBuffer, or ReferenceBuffer (the pure-Python model) for the tests on both.
        self.buffer = buffer_class(
            room,
            max_age=bound,
            strategy=strategy,
            on_full="error",  # the adapters bound what they put themselves (Miles's capacity blocks the producer)
            track_released=True,
            pin_memory=False,
            prompts_per_step=prompts_per_step if pace else None,
        )
        self.max_age = bound
        self._ready: Dict[int, Any] = {}  # gid -> payload of a finished group in the ring
        self._in_flight: Dict[int, Any] = {}  # gid -> what the producer dispatched (kept to recycle it on resume)
        self._next_gid = 0
        self.largest_stamp = 0  # the largest stamp seen: the take step when the framework gives none

    def __len__(self) -> int:
        return len(self._ready)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def admissible(self, step: int) -> int:
        return self.buffer.admissible(step) if self.strategy == "pace" else UNBOUNDED

    def dispatch(self, prompt: Any, step: int) -> int:
        gid = self._new_gid()
        self.buffer.dispatch([gid], step)
        self._in_flight[gid] = prompt
        self.largest_stamp = max(self.largest_stamp, step)
        return gid

    def complete(self, gid: int, payload: Any) -> None:
        # The payload is in place before the ring can hand its group out: a take on another thread may take it
        # the moment complete returns in the core.
        self._ready[gid] = payload
        try:
            self.buffer.complete([gid], [gid])
        except BaseException:
            del self._ready[gid]
            raise
        del self._in_flight[gid]

    def fail(self, gid: int) -> Any:
        """Fails a dispatched group in the ledger; returns what was dispatched (the prompt, before generation)."""
        self.buffer.fail([gid])
        return self._in_flight.pop(gid)

    def put(self, payload: Any, stamp: int) -> int:
        gid = self._new_gid()
        self._ready[gid] = payload  # before the ring holds it (see complete)
        try:
            self.buffer.put([gid], stamp, group_ids=[gid])
        except BaseException:
            del self._ready[gid]
            raise
        self.largest_stamp = max(self.largest_stamp, stamp)
        return gid

    async def take(self, groups: int, step: int) -> Tuple[List[Any], List[Any]]:
        """Awaits ``groups`` groups trainable at ``step``; returns (taken payloads, payloads dropped stale).
        Every stamp put while it waits must be <= ``step`` (the steps are the producer's own clock)."""
        return self._collect(await self.buffer.atake(groups, step))

    def take_now(self, groups: int, step: int, bounded: bool = True) -> Tuple[List[Any], List[Any]]:
        """Takes up to ``groups`` groups trainable at ``step`` without waiting (fewer, even none, when not ready);
        returns (taken, dropped stale). ``bounded=False`` takes without the age bound (Miles before its first
        weight update, when a group's staleness is unknown): a property of this one take, so the buffer's max_age
        (and every other take's bound) never changes for it."""
        return self._collect(self.buffer.take(groups, step, bounded=bounded))

    def _collect(self, batch: Any) -> Tuple[List[Any], List[Any]]:
        taken = [self._ready.pop(int(g)) for g in batch.group_ids.tolist()]
        dropped = [self._ready.pop(int(g)) for g in self.buffer.released().of("dropped_stale").tolist()]
        return taken, dropped

    def ready_payloads(self) -> List[Any]:
        return list(self._ready.values())

    def state_dict(self) -> Dict[str, Any]:
        """Our ring's state plus every payload, ready and in flight (pickled: the frameworks' Samples)."""
        return {
            "format": STATE_FORMAT,
            "buffer": self.buffer.state_dict(),
            "ready": pickle.dumps(self._ready),
            "in_flight": pickle.dumps(self._in_flight),
            "next_gid": self._next_gid,
            "largest_stamp": self.largest_stamp,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> List[Any]:
        """Restores a saved store; the groups that were in flight cannot finish in this process, so they are
        failed (counted in the ledger) and returned for the caller to submit again."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"state is not a GroupStore state of format {STATE_FORMAT}; pass what state_dict wrote")
        self.buffer.load_state_dict(state["buffer"])
        self._ready = pickle.loads(state["ready"])
        in_flight = pickle.loads(state["in_flight"])
        self._next_gid = int(state["next_gid"])
        self.largest_stamp = int(state["largest_stamp"])
        self._in_flight = {}
        if in_flight:
            self.buffer.fail(list(in_flight))
        return list(in_flight.values())

    def _new_gid(self) -> int:
        gid = self._next_gid
        self._next_gid += 1
        return gid
