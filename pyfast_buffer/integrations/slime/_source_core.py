"""``StalenessSourceCore``: slime's ``DataSource`` methods over our ``GroupStore``, with slime's own prompt source
passed in (so it runs, and is tested, without slime; ``_source.py`` binds it to slime's classes).

Every prompt group handed out is dispatched in our ledger at the current step (the rollout id being collected);
it leaves as trained, dropped stale, or failed (aborted, errored, or in flight at a save) and then goes back to
slime's buffer, so a prompt is never lost. A failed group goes back as the prompt it was when dispatched: slime's
``generate_and_rm`` keeps a finished sample's tokens and continues an aborted one's, so a group requeued with its
tokens would be stamped at its new dispatch while carrying older weight versions (issue 58). Thread-safe: slime's
rollout worker thread dispatches and completes while the RolloutManager's thread takes; a save holds the same lock
over slime's dataset position and our state, so the two describe one moment.

``train_async.py`` calls ``generate(k + 1)`` before ``save(k)`` on the RolloutManager (a sync actor, so in that
order): the batch taken for rollout ``k + 1`` is already out of our buffer when checkpoint ``k`` is written. The
save keeps the batches taken for rollouts after ``k``, and a resume hands them out again for the same rollout ids.
"""

from __future__ import annotations

import collections
import copy
import logging
import os
import pickle
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from pyfast_buffer.buffer import StalenessBuffer
from pyfast_buffer.integrations._common import ages_metrics, buffer_metrics
from pyfast_buffer.integrations._slime_family import GroupStore, iter_samples
from pyfast_buffer.integrations.slime._options import WHERE, read_options
from pyfast_buffer.integrations.slime._state import read_state, state_path, write_state

logger = logging.getLogger(__name__)

#: Key in ``Sample.metadata`` naming the ledger entry of a dispatched group (so ``add_samples`` can fail it).
GID_KEY = "pyfast_buffer_gid"
STATE_FORMAT = 1
METRICS = "pyfast_buffer/slime/"
#: How often a waiting take re-checks when nothing notifies it (it is woken at once by a complete or a fail).
POLL_S = 0.05
#: Taken batches kept for a save (the latest two rollout ids): train_async.py saves ``k`` after taking ``k + 1``.
KEEP_TAKEN = 2


class StalenessSourceCore:
    """A slime ``DataSource`` whose finished groups wait in our buffer under drop, wait or pace."""

    def __init__(self, args: Any, prompts: Any, buffer_class: Callable[..., Any] = StalenessBuffer) -> None:
        """``buffer_class``: StalenessBuffer, or ReferenceBuffer (the pure-Python model) for the tests on both."""
        self.args = args
        self.options = read_options(args)
        self.prompts = prompts  # slime's RolloutDataSourceWithBuffer: the dataset and its requeue buffer
        self.store = GroupStore(
            strategy=self.options.strategy,
            max_age=self.options.max_age,
            capacity=self.options.capacity,
            prompts_per_step=self.options.per_step,
            buffer_class=buffer_class,
        )
        self._changed = threading.Condition(threading.RLock())
        self._step = 0
        self._stamps: Dict[int, int] = {}  # gid -> dispatch step of a group in flight
        self._resubmit: Deque[List[Any]] = collections.deque()  # in flight at a save: handed out first
        self._listeners: List[Callable[[], None]] = []
        self.counts: Dict[str, int] = collections.Counter()
        self._taken: Dict[int, bytes] = {}  # rollout id -> its batch's (stamp, group) pairs, pickled when taken
        self._retake: Dict[int, List[Tuple[int, List[Any]]]] = {}  # after a load: batches saved past the checkpoint

    # ---- slime's DataSource ----------------------------------------------------------------------------------
    def get_samples(self, num_samples: int) -> List[List[Any]]:
        """Up to ``num_samples`` prompt groups, each dispatched at the current step. Fewer (even ``[]``) when our
        admission (pace) or the capacity refuses: the refused prompts stay in the dataset."""
        return [group for _, group in self.dispatch(num_samples)]

    def add_samples(self, samples: List[List[Any]]) -> None:
        """Groups back to slime's buffer. One we dispatched (tagged) is failed in the ledger first: slime's rollout
        functions call this for aborted groups, which are regenerated, not trained."""
        for group in samples:
            gid = self._untag(group)
            with self._changed:
                if gid is not None and gid in self._stamps:
                    group = self._fail(gid, "aborted_requeued")  # the prompt as dispatched, without old tokens
                self.prompts.add_samples([group])
                self._changed.notify_all()
        self._notify()

    def save(self, rollout_id: int) -> None:
        """slime's own data-source state, then ours (ready and in-flight groups, slime's requeue buffer, the
        ledger) into ``rollout/pyfast_buffer_state_{rollout_id}.pkl`` under ``--save``: the pickled state inside our
        checked format (``_state.write_state``), so a damaged file is refused before it is unpickled. Both under
        the lock the rollout worker dispatches under: a prompt is either before slime's saved dataset position and
        in our state, or after it and not."""
        root = getattr(self.args, "save", None)
        with self._changed:
            self.prompts.save(rollout_id)
            if root is None:
                return
            state = {
                "format": STATE_FORMAT,
                "store": self.store.state_dict(),
                "stamps": dict(self._stamps),
                "resubmit": list(self._resubmit),
                "slime_buffer": list(getattr(self.prompts, "buffer", ())),
                "step": self._step,
                "counts": dict(self.counts),
                "taken_after": {k: v for k, v in self._taken.items() if k > rollout_id},
            }
            data = pickle.dumps(state)
        write_state(state_path(root, rollout_id), data)

    def load(self, rollout_id: Optional[int] = None) -> None:
        """slime's own state, then ours if saved. Groups in flight at the save are failed in the ledger and handed
        out again before any new prompt. A damaged file is refused (CheckpointError) and a foreign one (ValueError),
        changing nothing; the plain pickle earlier builds wrote is still read."""
        self.prompts.load(rollout_id)
        root = getattr(self.args, "load", None)
        if root is None or rollout_id is None:
            return
        path = state_path(root, rollout_id)
        if not os.path.exists(path):
            logger.info("%s: no saved buffer state at %s; starting empty", WHERE, path)
            return
        state = pickle.loads(read_state(path))  # the file's checks pass before anything in it is unpickled
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"{WHERE}: {path} is not our saved state (format {STATE_FORMAT}); remove it or fix --load")
        try:  # every value read before anything changes
            resubmit, slime_buffer = list(state["resubmit"]), list(state["slime_buffer"])
            step, counts = int(state["step"]), collections.Counter[str](state["counts"])
            store = state["store"]
            retake = {int(k): pickle.loads(v) for k, v in state.get("taken_after", {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{WHERE}: {path} has a missing or malformed entry ({exc!r}); remove it or fix --load"
            ) from exc
        with self._changed:
            in_flight = self.store.load_state_dict(store)
            self._stamps = {}
            self._resubmit = collections.deque([*in_flight, *resubmit])
            if hasattr(self.prompts, "buffer"):
                self.prompts.buffer[:] = slime_buffer
            self._step = step
            self.counts = counts
            self.counts["failed_at_load"] += len(in_flight)
            self._retake, self._taken = retake, {}
            self._changed.notify_all()

    def __len__(self) -> int:
        # slime divides this by rollout_batch_size for the rollouts per epoch: the dataset's size, as its own.
        return len(self.prompts)

    # ---- what our rollout function drives --------------------------------------------------------------------
    @property
    def step(self) -> int:
        return self._step

    def begin_step(self, step: int) -> None:
        """Rollout ``step`` is being collected: dispatches are stamped ``step`` from now on."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"{WHERE}: rollout_id={step!r} must be an int >= 0 (slime's rollout ids are)")
        with self._changed:
            if step < self._step:
                raise ValueError(f"{WHERE}: rollout_id {step} is before {self._step}; rollout ids only go forward")
            self._step = step
        self._notify()

    def dispatch(self, num_samples: int) -> List[Tuple[int, List[Any]]]:
        """``get_samples`` with each group's ledger id (our rollout worker keeps it to complete or fail it)."""
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
            raise TypeError(f"{WHERE}.get_samples: num_samples={num_samples!r} must be an int >= 0")
        with self._changed:
            room = self.options.capacity - self.store.in_flight - len(self.store)
            allowed = max(0, min(num_samples, room, self.store.admissible(self._step)))
            if allowed < num_samples:
                self.counts["refused"] += num_samples - allowed
            groups: List[List[Any]] = []
            while self._resubmit and len(groups) < allowed:
                groups.append(self._resubmit.popleft())
            if len(groups) < allowed:
                groups += self.prompts.get_samples(allowed - len(groups))
            out = []
            for group in groups:
                # The prompt as dispatched, copied: a save mid-generation must store the prompt, not a half answer.
                gid = self.store.dispatch(copy.deepcopy(group), self._step)
                self._stamps[gid] = self._step
                self._tag(group, gid)
                out.append((gid, group))
            return out

    def complete(self, gid: int, group: List[Any]) -> None:
        """A dispatched group finished: it waits in our buffer for a take."""
        with self._changed:
            self._untag(group)
            self.store.complete(gid, (self._stamps.pop(gid), group))
            self._changed.notify_all()

    def requeue(self, gid: int, group: List[Any], why: str = "aborted_requeued") -> None:
        """A dispatched group will not be trained (aborted, errored): failed in the ledger, back to slime's buffer
        to be generated again."""
        with self._changed:
            self._untag(group)
            if gid in self._stamps:
                group = self._fail(gid, why)  # the prompt as dispatched: its new stamp must cover all its tokens
            self.prompts.add_samples([group])
            self._changed.notify_all()
        self._notify()

    def take_some(self, groups: int, step: int) -> List[Tuple[int, List[Any]]]:
        """Takes without waiting: under drop up to ``groups`` fresh groups (stale ones are discarded and counted),
        under wait and pace exactly ``groups`` or none, since pace's bound assumes the trainer takes
        rollout_batch_size groups each step. Returns ``(dispatch step, group)`` pairs."""
        with self._changed:
            if self.options.strategy != "drop" and len(self.store) < groups:
                return []
            got, dropped = self.store.take_now(groups, step)
            # drop: a stale group is discarded with its prompt, as drop means; the ledger counts it.
            self.counts["dropped_stale"] += len(dropped)
            self.counts["trained"] += len(got)
        if got or dropped:
            self._notify()  # room freed: the worker may dispatch again
        return got

    def take_batch(
        self,
        groups: int,
        step: int,
        timeout: Optional[float] = None,
        check: Optional[Callable[[], None]] = None,
    ) -> Tuple[List[List[Any]], Dict[str, float]]:
        """``groups`` whole groups trainable at ``step`` and this take's metrics. Waits (interruptibly, woken by
        every complete and fail; ``check`` is called meanwhile and may raise) at most ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        taken: List[Tuple[int, List[Any]]] = []
        with self._changed:
            saved = self._saved_batch(groups, step)
            if saved is not None:
                return [g for _, g in saved], self._metrics([step - stamp for stamp, _ in saved])
            while True:
                taken += self.take_some(groups - len(taken), step)
                if len(taken) >= groups:
                    self._taken[step] = pickle.dumps(taken)  # as handed out: slime may change the samples later
                    for old in sorted(self._taken)[:-KEEP_TAKEN]:
                        del self._taken[old]
                    return [g for _, g in taken], self._metrics([step - stamp for stamp, _ in taken])
                if check is not None:
                    check()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"{WHERE}: rollout {step} got {len(taken)} of {groups} groups in {timeout} s "
                        f"({self.store.in_flight} in flight, {len(self.store)} ready); raise "
                        "pyfast_buffer_take_timeout or check the rollout engines"
                    )
                self._changed.wait(POLL_S if left is None else min(POLL_S, left))

    def metrics(self) -> Dict[str, float]:
        with self._changed:
            return self._metrics([])

    def add_listener(self, fn: Callable[[], None]) -> None:
        """``fn()`` is called (from any thread) whenever admission may have opened: a take, a fail, a new step."""
        self._listeners.append(fn)

    # ---- internals -------------------------------------------------------------------------------------------
    def _saved_batch(self, groups: int, step: int) -> Optional[List[Tuple[int, List[Any]]]]:
        """The batch a loaded checkpoint saved as taken for rollout ``step`` (train_async.py's order), or None.
        Saved batches for earlier rollout ids were skipped by the resume: counted and logged, never handed."""
        for old in [k for k in self._retake if k < step]:
            skipped = self._retake.pop(old)
            self.counts["taken_after_save_skipped"] += len(skipped)
            logger.warning(
                "%s: the checkpoint held %d groups taken for rollout %d, but the resume asked for rollout %d first; "
                "they are not trained (resume from the checkpoint's next rollout id to train them)",
                WHERE,
                len(skipped),
                old,
                step,
            )
        saved = self._retake.pop(step, None)
        if saved is None or len(saved) != groups:
            if saved is not None:
                self.counts["taken_after_save_skipped"] += len(saved)
                logger.warning(
                    "%s: the checkpoint held %d groups taken for rollout %d, but this call takes %d; taking anew",
                    WHERE,
                    len(saved),
                    step,
                    groups,
                )
            return None
        self.counts["retaken_after_resume"] += len(saved)
        self._taken[step] = pickle.dumps(saved)
        return saved

    def _metrics(self, ages: List[int]) -> Dict[str, float]:
        out = buffer_metrics(self.store.buffer)
        out.update(ages_metrics(ages))
        out.update({f"{METRICS}{k}": float(v) for k, v in self.counts.items()})
        out[f"{METRICS}in_flight"] = float(self.store.in_flight)
        out[f"{METRICS}ready"] = float(len(self.store))
        return out

    def _fail(self, gid: int, why: str) -> List[Any]:
        """Fails a dispatched group in the ledger; returns its prompt as it was dispatched."""
        prompt = self.store.fail(gid)
        del self._stamps[gid]
        self.counts[why] += 1
        return prompt

    def _notify(self) -> None:
        for fn in list(self._listeners):
            fn()

    @staticmethod
    def _tag(group: List[Any], gid: int) -> None:
        for sample in iter_samples(group):
            if isinstance(getattr(sample, "metadata", None), dict):
                sample.metadata[GID_KEY] = gid

    @staticmethod
    def _untag(group: List[Any]) -> Optional[int]:
        gid = None
        for sample in iter_samples(group):
            meta = getattr(sample, "metadata", None)
            if isinstance(meta, dict) and GID_KEY in meta:
                gid = meta.pop(GID_KEY)
        return gid
