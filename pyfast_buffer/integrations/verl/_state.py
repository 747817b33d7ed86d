"""What the verl sampler knows of TransferQueue: verl's own state layout, kept up to date by diffs.

verl's rollout side writes a tag-only prompt key ``{uid}`` (``is_prompt``, ``status``,
``global_steps``) and trajectory keys ``{uid}_{session}_{index}``. verl's sampler rebuilds its view
from every tag on every poll; this one keeps the same attributes (``partitions``, ``pending_keys``,
``running_keys``, ``finished_keys``, ``failure_keys``, ``prompt_global_steps``, each
``{partition_id: ...}``) but applies only what changed between two listings: the key sets are diffed
in C, and only new keys and the tags of in-flight prompts are read.

Beside verl's dicts, each partition has a ``PartitionBook``: the listing the diff starts from, an
index uid -> trajectory keys (so clearing or returning a group never scans the partition), the
terminal groups sorted by ``(global_steps, uid)`` (oldest-first selection without a sort per call),
and a ``StalenessBuffer`` whose native in-flight table and ledger count every prompt: dispatched
when first listed, completed and taken when sampled, failed when evicted or cleared by someone else.
Under ``pace`` (async ``train`` partitions) the core is a pace buffer instead: a pending prompt is only
*submitted* until the agent-loop manager asks for its admission (``_pace.py``), finished groups wait in its
ring, and its take gate decides when a batch may go (docs/verl.md, "pace inside verl").

Absolute imports only: verl may load the sampler package by file path, outside the package.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any, Optional

import transfer_queue as tq

from pyfast_buffer import StalenessBuffer, sample_step_from_tag
from pyfast_buffer.integrations.verl._metrics import VAL

logger = logging.getLogger("pyfast_buffer.verl")

IN_FLIGHT = ("pending", "running")
TERMINAL = ("finished", "failure")
NO_AGE_CUT = 1 << 62  # the core never cuts by age here: staleness is decided with verl's formula, in steps

LEDGER_KEYS = (
    "seen",
    "taken",
    "evicted",
    "evicted_stale",
    "evicted_filtered",
    "evicted_failure",
    "discarded_surplus",
    "vanished",
    "reissued",
    "refill_calls",
    "refill_requested",
    "refill_delivered",
    "refill_short",
    "refill_failed",
    "unrefilled",
    "admitted",
    "evicted_unadmitted",
)
#: The manager key to name when a prompt reaches generation without admission under pace.
UNADMITTED_FIX = (
    "under max_off_policy_strategy=pace every prompt must reach generation through "
    "pyfast_buffer.integrations.verl.PacedAgentLoopManager: set "
    "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=pyfast_buffer.integrations.verl.PacedAgentLoopManager"
)


def uid_of(key: str) -> str:
    """verl's rule: a trajectory key's prompt uid is the text before its first ``_``."""
    return key.split("_", 1)[0]


class PartitionBook:
    """The per-partition state that is ours alone (see the module docstring).

    ``pace`` is ``(max_age, prompts_per_step, lookahead)`` for a paced partition, else None.
    """

    def __init__(self, capacity: int, pace: Optional[tuple] = None) -> None:
        self.known: set[str] = set()  # keys applied from the listings so far
        self.groups: dict[str, dict[str, None]] = {}  # uid -> its trajectory keys, in listing order
        self.indexed = 0  # trajectory keys in ``groups``; differs from len(partitions[pid]) after an outside edit
        self.order: list[tuple[int, str]] = []  # terminal groups, sorted by (global_steps, uid)
        self.consumed: set[str] = set()  # prompt keys we cleared; ignored while TransferQueue still lists them
        self.core_id: dict[str, int] = {}  # uid -> id in the core, while the prompt is held (under pace: admitted)
        self.next_id = 0
        self.clock = 0  # the core's clock: it refuses a step below one it has seen
        self.paced = pace is not None
        if pace is None:
            self.core = StalenessBuffer(
                capacity, max_age=NO_AGE_CUT, strategy="drop", on_full="error", pin_memory=False
            )
        else:
            max_age, per_step, lookahead = pace
            self.core = StalenessBuffer(
                capacity,
                max_age=max_age,
                strategy="pace",
                prompts_per_step=per_step,
                lookahead=lookahead,
                on_full="error",
                pin_memory=False,
            )
        # pace: the core's ready groups in its take order (age stamp, arrival), as (stamp, arrival, core id);
        # a core id no longer in ``cid_uid`` is a ghost (its group vanished from TransferQueue while ready).
        self.ready: list[tuple[int, int, int]] = []
        self.cid_uid: dict[int, str] = {}
        self.arrivals = 0
        self.age_stamps: dict[str, int] = {}  # age_from=generation_*: a finished group's stamp, read once
        self.refused: set[str] = set()  # pace: finished groups that bypassed admission and did not fit: evicted
        self.waiting_for = ""  # pace: why the last take attempt did not go (for the timeout message)
        self.ledger: Counter = Counter({k: 0 for k in LEDGER_KEYS})
        self.last_list_s = 0.0  # how long the last kv_list took: polling pauses at least that long


def is_prompt_tag(tag: dict) -> bool:
    """Whether a listed tag is a prompt's. verl's agent loop writes ``status="success"`` on every trajectory row
    and never on a prompt, so such a row is a trajectory even when its tag also says ``is_prompt``: TransferQueue
    0.1.10 merges a new row's tag into whatever its reused global index still holds, and a cleared prompt's
    ``is_prompt`` was seen surviving that way (CI, 7 Dec 2026: verl's own sampler raises on it too)."""
    return bool(tag.get("is_prompt", False)) and tag.get("status") != "success"


def _parse_prompt(partition_id: str, key: str, tag: Any) -> tuple[str, int]:
    status = tag.get("status")
    if status not in IN_FLIGHT + TERMINAL:
        raise ValueError(
            f"Unknown status {status!r} of prompt {key!r} in partition {partition_id!r}; the rollout "
            f"side must write one of {list(IN_FLIGHT + TERMINAL)}"
        )
    try:
        return status, sample_step_from_tag(tag)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"partition {partition_id!r}: prompt {key!r}: {exc}") from None


class VerlState:
    """verl's sampler state, refreshed incrementally; the samplers (``_sampler.py``) build on it, with the
    eviction (``_eviction.py``) and pace (``_pace.py``) halves."""

    # Set by the samplers' __init__ (``_sampler.ReplayBuffer``); declared here for the halves that read them.
    options: Any
    on_policy: bool
    refill_fn: Any
    filter_groups_metric: Optional[str]
    sync_refill_failed_groups: bool
    max_off_policy_threshold: Optional[int]
    max_off_policy_strategy: str

    def _init_state(self, capacity: int, pace: Optional[tuple] = None) -> None:
        """``pace``: ``(max_age, prompts_per_step, lookahead)`` when the training partitions are paced."""
        self.partitions: dict[str, dict[str, dict]] = defaultdict(dict)
        self.pending_keys: dict[str, set[str]] = defaultdict(set)
        self.running_keys: dict[str, set[str]] = defaultdict(set)
        self.finished_keys: dict[str, set[str]] = defaultdict(set)
        self.failure_keys: dict[str, set[str]] = defaultdict(set)
        self.prompt_global_steps: dict[str, dict[str, int]] = defaultdict(dict)
        self._dapo_classification_cache: dict[str, dict[str, float | None]] = defaultdict(dict)
        self._capacity = capacity
        self._pace = pace
        self._trainer_step = 0  # pace: the trainer's step as last seen (PacedSampling.observe_step)
        self._books: dict[str, PartitionBook] = {}
        self._lock = threading.RLock()  # one poll (list -> apply -> evict -> take -> clear) at a time

    def _book(self, partition_id: str) -> PartitionBook:
        book = self._books.get(partition_id)
        if book is None:
            pace = self._pace if partition_id != VAL else None  # validation is never paced
            book = self._books[partition_id] = PartitionBook(self._capacity, pace)
        return book

    def _status_sets(self, partition_id: str) -> dict[str, set[str]]:
        return {
            "pending": self.pending_keys[partition_id],
            "running": self.running_keys[partition_id],
            "finished": self.finished_keys[partition_id],
            "failure": self.failure_keys[partition_id],
        }

    # ---- listing -------------------------------------------------------------------------------
    def _sync_metadata_from_transfer_queue(self, partition_id: str | None = None) -> dict[str, dict]:
        """Refreshes one partition (or, without an argument, every partition listed and every one known).

        Returns the listing applied, ``{partition_id: {key: tag}}``. A tag that cannot be read raises a
        ValueError naming its partition and key, and changes nothing of that partition.
        """
        with self._lock:
            if partition_id is not None:
                book = self._book(partition_id)
                started = time.monotonic()
                items = (tq.kv_list(partition_id=partition_id) or {}).get(partition_id) or {}
                book.last_list_s = time.monotonic() - started
                self._apply_listing(partition_id, items)
                return {partition_id: items}
            listing = tq.kv_list() or {}
            for pid in sorted(set(listing) | set(self._books)):
                self._apply_listing(pid, listing.get(pid) or {})
            return listing

    def _after_listing(self, partition_id: str) -> None:
        """Hook run after a listing is applied (the pace half dispatches groups that bypassed admission)."""

    def _apply_listing(self, partition_id: str, items: dict[str, dict]) -> None:
        book = self._book(partition_id)
        sets = self._status_sets(partition_id)
        steps = self.prompt_global_steps[partition_id]
        listed = set(items)  # set against set: about 3x faster than diffing against the dict's key view
        new, gone = listed - book.known, book.known - listed
        # Read and check first: a bad tag raises before anything changes.
        updates: dict[str, tuple[str, int]] = {}
        new_trajectories: list[str] = []
        applied = set()
        for key in new:
            tag = items[key]
            if not tag:  # listed before its tag was written: read it on a later poll
                continue
            applied.add(key)
            if key in book.consumed:
                continue
            if is_prompt_tag(tag):
                updates[key] = _parse_prompt(partition_id, key, tag)
            else:
                new_trajectories.append(key)
        for status in IN_FLIGHT:  # an in-flight prompt's tag changes when it runs, ends or is re-issued
            for uid in sets[status]:
                tag_now = items.get(uid)
                if tag_now and uid not in updates:
                    status_now, step_now = _parse_prompt(partition_id, uid, tag_now)
                    if status_now != status or step_now != steps.get(uid):
                        updates[uid] = (status_now, step_now)
        if book.paced:
            for uid, (status, step) in updates.items():
                restamped = uid in book.core_id and step != steps.get(uid) and status in IN_FLIGHT
                if status == "running" and (uid not in book.core_id or restamped):
                    raise RuntimeError(
                        f"partition {partition_id!r}: prompt {uid!r} (step {step}) is running but was never admitted; "
                        + UNADMITTED_FIX
                    )
        # Apply.
        vanished = []
        for key in gone:
            if key in book.consumed:
                book.consumed.discard(key)
            elif key in steps:
                vanished.append(key)
            else:
                self._forget_trajectory(partition_id, book, key)
        if vanished:  # cleared by someone else while we held it: nobody will train on it
            self._forget_groups(partition_id, vanished)
            book.ledger["vanished"] += len(vanished)
            logger.warning(
                "%d held prompts vanished from partition %s (cleared outside this sampler)", len(vanished), partition_id
            )
        book.known -= gone
        book.known |= applied
        part = self.partitions[partition_id]
        for key in new_trajectories:
            part[key] = items[key]
            book.groups.setdefault(uid_of(key), {})[key] = None
            book.indexed += 1
        self._apply_prompts(partition_id, book, updates)
        if book.paced:
            self._after_listing(partition_id)

    def _apply_prompts(self, partition_id: str, book: PartitionBook, updates: dict[str, tuple[str, int]]) -> None:
        sets = self._status_sets(partition_id)
        steps = self.prompt_global_steps[partition_id]
        dispatch: dict[int, list[int]] = defaultdict(list)
        failed: list[int] = []
        for uid, (status, step) in updates.items():
            old_step = steps.get(uid)
            if old_step is None:
                book.ledger["seen"] += 1
            else:
                for held in sets.values():
                    held.discard(uid)
                if old_step != step and uid in book.core_id:  # re-issued: the old attempt failed, a new one runs
                    book.ledger["reissued"] += 1
                    cid = book.core_id.pop(uid)
                    book.cid_uid.pop(cid, None)
                    failed.append(cid)
            # Without pace every listed prompt is in flight in the core; under pace only what was admitted.
            if uid not in book.core_id and not book.paced:
                book.core_id[uid] = book.next_id
                dispatch[step].append(book.next_id)
                book.next_id += 1
            steps[uid] = step
            sets[status].add(uid)
            if status in TERMINAL:
                bisect.insort(book.order, (step, uid))
        if failed:
            book.core.fail(failed)
        for step, ids in dispatch.items():
            book.core.dispatch(ids, step)
            book.clock = max(book.clock, step)

    def _forget_trajectory(self, partition_id: str, book: PartitionBook, key: str) -> None:
        if self.partitions[partition_id].pop(key, None) is None:
            return
        group = book.groups.get(uid_of(key))
        if group is not None and key in group:
            del group[key]
            book.indexed -= 1
            if not group:
                del book.groups[uid_of(key)]

    def _forget_groups(self, partition_id: str, uids: Iterable[str]) -> int:
        """Removes held prompts from every view and fails them in the core; returns how many were held."""
        book = self._book(partition_id)
        steps = self.prompt_global_steps[partition_id]
        sets = self._status_sets(partition_id)
        cache = self._dapo_classification_cache[partition_id]
        failed = []
        held = 0
        for uid in uids:
            for status, members in sets.items():
                if uid in members:
                    members.discard(uid)
                    held += 1
                    if status in TERMINAL:
                        self._unorder(book, steps.get(uid), uid)
            steps.pop(uid, None)
            cache.pop(uid, None)
            book.age_stamps.pop(uid, None)
            core_id = book.core_id.pop(uid, None)
            if core_id is not None and book.cid_uid.pop(core_id, None) is None:
                failed.append(core_id)  # in flight in the core (a ready one stays there as a ghost, see PartitionBook)
        if failed:
            book.core.fail(failed)
        return held

    @staticmethod
    def _unorder(book: PartitionBook, step: int | None, uid: str) -> None:
        if step is None:
            return
        i = bisect.bisect_left(book.order, (step, uid))
        if i < len(book.order) and book.order[i] == (step, uid):
            del book.order[i]

    # ---- groups --------------------------------------------------------------------------------
    def _group_keys(self, partition_id: str, uids: Iterable[str]) -> list[str]:
        """The trajectory keys of ``uids``, group by group; rebuilds the index if ``partitions`` was edited outside."""
        book = self._book(partition_id)
        part = self.partitions[partition_id]
        if book.indexed != len(part):
            book.groups = {}
            for key in part:
                book.groups.setdefault(uid_of(key), {})[key] = None
            book.indexed = len(part)
        return [key for uid in uids for key in book.groups.get(uid, ())]

    def _has_trajectories(self, partition_id: str, uid: str) -> bool:
        return bool(self._group_keys(partition_id, [uid]))

    def _clear_groups(self, partition_id: str, uids: set[str]) -> None:
        """Clears prompt groups (prompt keys and trajectories) from TransferQueue and from every view.

        The groups are gone from this sampler even if ``kv_clear`` fails (it is retried once, then
        logged): their keys are then ignored while TransferQueue still lists them.
        """
        if not uids:
            return
        book = self._book(partition_id)
        trajectories = self._group_keys(partition_id, uids)
        clear(partition_id, [*uids, *trajectories], "evicted group")
        for key in trajectories:
            self._forget_trajectory(partition_id, book, key)
        book.consumed.update(uid for uid in uids if uid in book.known)
        book.ledger["evicted"] += self._forget_groups(partition_id, uids)

    def _take_groups(self, partition_id: str, uids: list[str], items: dict[str, dict]) -> tuple[list[str], list[dict]]:
        """Hands ``uids`` out: clears their prompt keys, takes them from the core; returns their rows.

        Tags come from ``items`` (this poll's listing) when it has them, so they are the newest written.
        """
        book = self._book(partition_id)
        part = self.partitions[partition_id]
        keys = self._group_keys(partition_id, uids)
        tags = [items.get(key) or part[key] for key in keys]
        clear(partition_id, list(uids), "sampled prompt")
        ids = [book.core_id[uid] for uid in uids if uid in book.core_id]
        if book.paced:
            for uid in uids:
                book.cid_uid.pop(book.core_id.pop(uid, -1), None)
        elif ids:
            book.core.complete(ids, ids)
            book.clock = max(book.clock, max(self.prompt_global_steps[partition_id][u] for u in uids))
            taken = book.core.take(len(ids), book.clock).traj_ids.tolist()
            if taken != ids:  # the core's ring holds nothing between two calls: a mismatch is a bug here
                raise RuntimeError(f"pyfast_buffer: core took {taken}, expected {ids}")
            for uid in uids:
                book.core_id.pop(uid, None)
        book.consumed.update(uid for uid in uids if uid in book.known)
        steps = self.prompt_global_steps[partition_id]
        sets = self._status_sets(partition_id)
        for uid in uids:
            for status in TERMINAL:
                if uid in sets[status]:
                    sets[status].discard(uid)
                    book.ledger["taken"] += 1
            self._unorder(book, steps.pop(uid, None), uid)
            self._dapo_classification_cache[partition_id].pop(uid, None)
            book.age_stamps.pop(uid, None)
        return keys, tags

    def _oldest(self, partition_id: str, sampleable: set[str], count: int) -> list[str]:
        """The ``count`` sampleable groups with the smallest ``(global_steps, uid)``."""
        book = self._book(partition_id)
        chosen = []
        for _, uid in book.order:
            if uid in sampleable:
                chosen.append(uid)
                if len(chosen) == count:
                    return chosen
        if len(chosen) < min(count, len(sampleable)):  # the status sets were edited outside: sort them afresh
            steps = self.prompt_global_steps[partition_id]
            book.order = sorted(
                (steps.get(u, 0), u) for u in self.finished_keys[partition_id] | self.failure_keys[partition_id]
            )
            return sorted(sampleable, key=lambda u: (steps.get(u, 0), u))[:count]
        return chosen

    # ---- the ledger ----------------------------------------------------------------------------
    def ledger(self, partition_id: str) -> dict[str, int]:
        """Prompt-group accounting of one partition; ``seen == taken + evicted + vanished + held`` always.

        ``held`` counts the prompts listed and not yet handed out (``in_flight`` pending or running,
        ``ready`` finished or failed); under pace ``awaiting_admission`` of the in-flight ones wait for the
        manager. ``refill_requested == refill_delivered + refill_short + refill_failed``;
        ``unrefilled`` counts evictions made without a ``refill_fn``. ``core_*`` are the native core's
        counters (``core_dispatched == core_completed + core_failed + core_in_flight``); without pace
        ``core_in_flight == held``; under pace ``core_dispatched == admitted`` and
        ``held == awaiting_admission + unadmitted_ready + core_in_flight + core_ready - ghosts``.
        """
        with self._lock:
            book = self._book(partition_id)
            sets = self._status_sets(partition_id)
            out = dict(book.ledger)
            out["in_flight"] = len(sets["pending"]) + len(sets["running"])
            out["ready"] = len(sets["finished"]) + len(sets["failure"])
            out["held"] = out["in_flight"] + out["ready"]
            # pace: submitted prompts the manager holds until admission (the rest of in_flight is generating)
            out["awaiting_admission"] = (
                sum(1 for uid in sets["pending"] if uid not in book.core_id) if book.paced else 0
            )
            # pace: finished or failed groups that never went through admission (restored, injected), until evicted
            out["unadmitted_ready"] = (
                sum(1 for status in TERMINAL for uid in sets[status] if uid not in book.core_id) if book.paced else 0
            )
            core = book.core.ledger()
            for key in ("dispatched", "completed", "failed", "in_flight", "taken", "trained_over_age"):
                out[f"core_{key}"] = core[key]
            out["core_ready"] = core["buffer_left"]  # pace: finished groups waiting in the core's ring
            out["ghosts"] = len(book.ready) - len(book.cid_uid)  # pace: ready groups that vanished meanwhile
            return out


def clear(partition_id: str, keys: list[str], what: str) -> None:
    """``kv_clear`` that never loses a batch: retried once, then logged; the keys stay in TransferQueue."""
    if not keys:
        return
    for attempt in (1, 2):
        try:
            tq.kv_clear(keys=keys, partition_id=partition_id)
            return
        except Exception as exc:
            if attempt == 2:
                logger.error(
                    "kv_clear of %d %s keys in partition %s failed twice (%r); they stay in "
                    "TransferQueue (this sampler ignores them) until cleared",
                    len(keys),
                    what,
                    partition_id,
                    exc,
                )
