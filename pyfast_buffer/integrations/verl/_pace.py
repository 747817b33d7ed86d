"""pace inside verl, the sampler's side: admission, the ready ring, the gated take (docs/verl.md, "pace").

verl's trainer writes each prompt's ``pending`` tag and hands the batch to its agent-loop manager.
``PacedAgentLoopManager`` (``_manager.py``) holds the prompts and calls ``admit`` here: the native core's pace
rule (docs/design.md, "pace: the admission rule") decides how many may start now, they are dispatched in the
core and re-stamped with the trainer's current step, in TransferQueue and in this sampler's view, before the
manager hands them to generation. Finished groups enter the core's ring in stamp order; ``sample`` takes the
stalest through the core's take gate, so nothing is dropped and nothing is trained past ``max_age`` (the
trainer takes ``train_batch_size`` groups every step, as the proof asks).

``LINK`` is how the sampler and the manager of one process find each other: it lives in this module, which is
imported once however verl loaded the sampler (by ``pkg://`` or by file path).

Absolute imports only: verl may load the sampler package by file path, outside the package.
"""

from __future__ import annotations

import bisect
import logging
import threading
import weakref
from typing import Any, Callable, Optional

import transfer_queue as tq

from pyfast_buffer.errors import AdmissionError
from pyfast_buffer.integrations.verl._state import VerlState

logger = logging.getLogger("pyfast_buffer.verl")

TRAIN = "train"  # verl's training partition: the one verl's trainer samples and the one pace admits into


class PaceLink:
    """The paced sampler and the manager of this process (weak references: the trainer owns both)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sampler: Optional[Callable[[], Any]] = None
        self._manager: Optional[Callable[[], Any]] = None

    def attach_sampler(self, sampler: Any) -> None:
        with self._lock:
            self._sampler = weakref.ref(sampler)

    def attach_manager(self, manager: Any) -> None:
        with self._lock:
            self._manager = weakref.ref(manager)

    def sampler(self) -> Any:
        """The paced sampler of this process, or None (no sampler, or one that does not pace)."""
        sampler = self._sampler() if self._sampler is not None else None
        return sampler if sampler is not None and sampler.paced else None

    def release(self) -> None:
        """Lets the manager start whatever admission allows now (called after a take or an eviction)."""
        manager = self._manager() if self._manager is not None else None
        if manager is not None:
            manager.release()


LINK = PaceLink()


class PacedSampling(VerlState):
    """The pace half of the verl sampler (mixed into ``ReplayBuffer``; uses ``VerlState``'s views)."""

    @property
    def paced(self) -> bool:
        """Whether this sampler paces its training partition (async trainer, ``max_off_policy_strategy=pace``)."""
        return self._pace is not None

    @property
    def trainer_step(self) -> int:
        """The trainer's step as this sampler last saw it (a submitted batch's global_steps, or a sample's)."""
        return self._trainer_step

    def observe_step(self, step: int) -> None:
        """The trainer is at ``step``; never goes back."""
        with self._lock:
            self._trainer_step = max(self._trainer_step, int(step))

    def admit(self, uids: list, step: int) -> int:
        """Admits the first ``k`` of ``uids`` (pending prompts of ``train``, in order), stamped ``step``; returns k.

        ``k`` is as many as the pace rule lets start now. Lists TransferQueue first, so groups that reached it
        without admission (a restored checkpoint, the rollout-skip cache) count before anything is admitted;
        then dispatches the ``k`` prompts in the core and re-stamps their prompt tags with ``step``. When the rule
        has no room even before listing, it returns 0 at once (a listing only finds more to count; the failures
        it could find free room at the next poll, which calls the manager back).
        """
        self.observe_step(step)
        with self._lock:
            book = self._book(TRAIN)
            if not uids or book.core.admissible(step) == 0:
                return 0
            self._sync_metadata_from_transfer_queue(TRAIN)
            pending = self.pending_keys[TRAIN]
            unknown = [uid for uid in uids if uid not in pending or uid in book.core_id]
            if unknown:
                raise RuntimeError(
                    f"admit: prompts {unknown[:5]} are not pending unadmitted prompts of partition 'train'; the "
                    "manager may only submit prompts that verl's trainer has just tagged pending"
                )
            k = min(book.core.admissible(step), len(uids))
            if k == 0:
                return 0
            ids = list(range(book.next_id, book.next_id + k))
            book.core.dispatch(ids, step)  # the rule said k fit and nothing else moves under this lock
            book.next_id += k
            book.clock = max(book.clock, step)
            admitted = uids[:k]
            tag = {"is_prompt": True, "status": "pending", "global_steps": step}
            tq.kv_batch_put(keys=admitted, partition_id=TRAIN, tags=[dict(tag) for _ in admitted])
            steps = self.prompt_global_steps[TRAIN]
            for uid, cid in zip(admitted, ids):
                book.core_id[uid] = cid
                steps[uid] = step
            book.ledger["admitted"] += k
            return k

    def _after_listing(self, partition_id: str) -> None:
        """Finished groups that reached TransferQueue without admission (restored, or injected by verl's rollout
        skip cache) enter the core through the same rule; one the rule refuses is evicted (``evicted_unadmitted``),
        and so is one already older than ``max_age`` at the trainer's step (a checkpoint restored under a smaller
        threshold: admitted at its stamp, it was trained past the bound, issue 59)."""
        book = self._book(partition_id)
        steps = self.prompt_global_steps[partition_id]
        oldest_trainable = self._trainer_step - book.core.max_age
        for uid in sorted(self.finished_keys[partition_id] - book.core_id.keys(), key=lambda u: (steps[u], u)):
            if uid in book.refused:
                continue
            try:
                if steps[uid] < oldest_trainable:
                    raise AdmissionError(f"stamped {steps[uid]}, older than max_age at step {self._trainer_step}")
                book.core.dispatch([book.next_id], steps[uid])
            except AdmissionError:
                book.refused.add(uid)
                logger.warning(
                    "partition %s: finished group %s (step %d) reached TransferQueue without admission and does not "
                    "fit the pace rule; it is evicted and refilled",
                    partition_id,
                    uid,
                    steps[uid],
                )
                continue
            book.core_id[uid] = book.next_id
            book.next_id += 1
            book.clock = max(book.clock, steps[uid])
            book.ledger["admitted"] += 1

    def _complete_ready(self, partition_id: str, sampleable: set) -> None:
        """Moves this poll's newly finished, kept groups into the core's ring, oldest first."""
        book = self._book(partition_id)
        steps = self.prompt_global_steps[partition_id]
        fresh = [(steps[u], u) for u in sampleable if u in book.core_id and book.core_id[u] not in book.cid_uid]
        if not fresh:
            return
        fresh.sort()
        ids = [book.core_id[u] for _, u in fresh]
        book.core.complete(ids, ids)
        for (stamp, uid), cid in zip(fresh, ids):
            book.cid_uid[cid] = uid
            bisect.insort(book.ready, (stamp, book.arrivals, cid))
            book.arrivals += 1

    def _take_paced(self, partition_id: str, global_steps: int, count: int) -> Optional[list]:
        """The ``count`` stalest ready groups, taken through the core's gate, or None (too few, or gated: the
        reason is kept in ``book.waiting_for``)."""
        book = self._book(partition_id)
        real = prefix = 0
        for _, _, cid in book.ready:
            prefix += 1
            real += cid in book.cid_uid
            if real == count:
                break
        if real < count:
            book.waiting_for = f"{real} groups ready in stamp order of {count}"
            return None
        try:
            batch = book.core.take(prefix, global_steps, timeout=0)
        except TimeoutError as exc:  # timeout=0: the core's take gate (or too few ready): nothing was taken
            book.waiting_for = str(exc)
            return None
        taken = batch.traj_ids.tolist()
        expected = [cid for _, _, cid in book.ready[:prefix]]
        if taken != expected:  # the ring is the core's, in (stamp, arrival) order: a mismatch is a bug here
            raise RuntimeError(f"pyfast_buffer: paced core took {taken}, expected {expected}")
        del book.ready[:prefix]
        return [book.cid_uid[cid] for cid in taken if cid in book.cid_uid]
