"""``StalenessDataBuffer``: Miles's fully-async ``DataBuffer`` contract over our ``StalenessBuffer``.

Loaded by ``--custom-async-data-buffer-path pyfast_buffer.integrations.miles.StalenessDataBuffer``. It keeps the
default buffer's behaviour where Miles defines it (aborted and dynamic-filter groups rejected on put, the
unused-group handler applied to aborted and stale groups, ``put`` blocking at the capacity, the
``rollout/fully_async/...`` metrics) and adds what the default lacks: an exact ledger, our metrics, and state to
save and load. Miles is not imported: the class follows the contract by shape, so it loads without Miles too.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import pickle
from typing import Any, Callable, Deque, Dict, List, Optional

import numpy as np

from pyfast_buffer import checkpoint, durable
from pyfast_buffer.buffer import StalenessBuffer
from pyfast_buffer.integrations._common import buffer_metrics
from pyfast_buffer.integrations._slime_family import (
    UNBOUNDED,
    GroupStore,
    group_oldest_version,
    is_aborted,
    load_by_path,
    resolve_strategy,
)

logger = logging.getLogger(__name__)

#: Environment variable choosing the strategy when ``args`` has no ``pyfast_buffer_strategy``.
STRATEGY_ENV = "PYFAST_BUFFER_STRATEGY"
METRICS = "rollout/fully_async/"
WHERE = "pyfast_buffer.integrations.miles.StalenessDataBuffer"
ROLLOUT_FN = "pyfast_buffer.integrations.miles.StalenessRolloutFn"
#: The ``format`` of the tree ``save`` writes.
STATE_FORMAT = "pyfast_buffer.miles.data_buffer/2"
PICKLE_START = b"\x80"  # the PROTO opcode every pickle of protocol 2 or later starts with


def group_budget(args: Any) -> int:
    """Miles's fully-async group budget (its ``_max_in_flight_groups``): whole groups' worth of samples in flight."""
    samples = getattr(args, "async_max_concurrent_samples", None)
    return max(1, samples // args.n_samples_per_prompt) if samples is not None else int(args.rollout_batch_size)


def in_flight_budget(args: Any) -> int:
    """The most groups Miles's fully-async producer can have in flight at once. Submitting by group
    (``--rollout-submission-granularity group``) that is the group budget; by sample (the fully-async default) a
    group may start whenever a group's worth of samples has finished, so up to budget x ``n_samples_per_prompt``
    groups can be in flight, each with one sample left."""
    granularity = getattr(args, "rollout_submission_granularity", None) or "sample"
    per_group = int(args.n_samples_per_prompt) if granularity == "sample" else 1
    return group_budget(args) * per_group


def check_args(args: Any, strategy: str, clock: str) -> int:
    """Refuses, naming the flag, what cannot work with ``strategy`` on ``clock``; returns the buffer's capacity in
    groups. ``StalenessRolloutFn`` calls it at construction, so a bad launch fails before any engine starts."""
    if clock == "version" and strategy != "drop":
        raise ValueError(
            f"{WHERE}: strategy {strategy!r} must see every submission; load the rollout function too: "
            f"--rollout-function-path {ROLLOUT_FN} (or use strategy 'drop')"
        )
    factor = args.async_data_buffer_capacity_factor
    if not factor > 0:
        raise ValueError(f"{WHERE}: --async-data-buffer-capacity-factor={factor!r} must be > 0")
    capacity = int(factor * args.rollout_batch_size)
    if capacity < 1:
        raise ValueError(
            f"{WHERE}: capacity floor({factor} * rollout_batch_size={args.rollout_batch_size}) is 0; "
            "raise --async-data-buffer-capacity-factor"
        )
    if strategy in ("wait", "pace") and capacity < int(args.rollout_batch_size):
        # Each train call takes its whole batch at once under wait and pace; the producer stops submitting at the
        # capacity, so a batch larger than it would never be complete: the run would hang at its first take.
        raise ValueError(
            f"{WHERE}: --async-data-buffer-capacity-factor={factor} holds {capacity} groups, fewer than one "
            f"--rollout-batch-size={args.rollout_batch_size}, which {strategy} takes at once; use a factor >= 1 "
            "(or strategy 'drop', which hands groups out one by one as Miles's own buffer does)"
        )
    max_age = args.max_weight_staleness
    if max_age is None and strategy != "drop":
        raise ValueError(f"{WHERE}: strategy {strategy!r} needs --max-weight-staleness (the bound)")
    if max_age is not None and (isinstance(max_age, bool) or not isinstance(max_age, int) or max_age < 0):
        raise ValueError(f"{WHERE}: --max-weight-staleness={max_age!r} must be an int >= 0")
    return capacity


def chosen_strategy(args: Any, default: str) -> str:
    value = getattr(args, "pyfast_buffer_strategy", None) or os.environ.get(STRATEGY_ENV) or default
    return resolve_strategy(value, WHERE)


class StalenessDataBuffer:
    """Miles ``DataBuffer`` (``put``/``get``/``get_metrics``) whose groups live in our ``StalenessBuffer``.

    With Miles's own rollout function it runs ``drop``: a group's age is ``current_version`` minus its oldest
    weight version, exactly Miles's staleness, and a group older than ``--max-weight-staleness`` is never handed
    out (it goes to ``--async-unused-samples-handler``: drop discards, retry recycles). ``wait`` and ``pace``
    need to see each submission, so they run under ``StalenessRolloutFn`` (``clock="rollout"``), which
    dispatches through ``dispatch`` and steps the clock with ``begin_step``.
    """

    def __init__(
        self,
        input: Any,
        *,
        strategy: Optional[str] = None,
        clock: str = "version",
        buffer_class: Callable[..., Any] = StalenessBuffer,
    ) -> None:
        args = input.args
        self._args = args
        if clock not in ("version", "rollout"):
            raise ValueError(f"{WHERE}: clock={clock!r} must be 'version' or 'rollout'")
        self.strategy = resolve_strategy(strategy, WHERE) if strategy else chosen_strategy(args, "drop")
        self._capacity = check_args(args, self.strategy, clock)
        max_age = args.max_weight_staleness
        self._clock_kind = clock
        self._per_step = int(args.rollout_batch_size)
        # Under the rollout clock a dispatched group's put never waits, so the ring also holds what is in flight;
        # can_admit keeps what is in flight within that budget whatever Miles's scheduler counts (it frees a
        # group's slots when its samples finish, and --group-rm keeps the group running after that).
        self._in_flight_room = in_flight_budget(args) if clock == "rollout" else UNBOUNDED
        room = self._capacity + (self._in_flight_room if clock == "rollout" else 0)
        self._store = GroupStore(
            strategy=self.strategy,
            max_age=max_age,
            capacity=room,
            prompts_per_step=self._per_step,
            buffer_class=buffer_class,
        )
        self._unused_handler_fn = input.unused_handler_fn
        self._dynamic_filter = load_by_path(args.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path")
        self._gids: Dict[int, int] = {}  # id(prompt_group) -> gid, for groups dispatched through us
        self._stash: Deque[Any] = collections.deque()  # a paced take's groups, handed out one per get
        self._step = 0  # under clock="rollout": the rollout id of the current (or next) take
        self._current_version: Optional[int] = None
        self._cond: Optional[asyncio.Condition] = None
        self._admission: Optional[asyncio.Event] = None
        self._reset_window()
        self._totals = {"aborted_groups": 0, "dynamic_filter_groups": 0, "stale_groups": 0, "recycled_groups": 0}

    # ---- the producer's side (StalenessRolloutFn) -------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Under ``clock="rollout"``: the train call for rollout ``step`` starts; submissions are stamped ``step``
        from now on and the next take is at ``step``."""
        self._step = int(step)
        self._signal_admission()

    def can_admit(self) -> bool:
        """Whether the producer may start one more group now: our admission (pace), Miles's capacity, and the
        groups in flight (at most ``in_flight_budget``: the ring's room for them). Under the rollout clock the
        capacity holds back submission, not a finished group's put: a take that waits for an in-flight group
        (wait, pace) must be able to receive it even when the buffer is full."""
        return (
            len(self._store) < self._capacity
            and self._store.in_flight < self._in_flight_room
            and self._store.admissible(self._step) >= 1
        )

    def dispatch(self, prompt_group: Any) -> None:
        """Records a submission (stamped with the current rollout step); call only after ``can_admit()``."""
        self._gids[id(prompt_group)] = self._store.dispatch(prompt_group, self._step)

    async def admission_changed(self) -> None:
        """Returns once a take, failure or step may have freed admission."""
        event = self._admission_event()
        await event.wait()
        event.clear()

    # ---- DataBuffer -----------------------------------------------------------------------------------------
    async def put(self, input: Any) -> None:
        gid = self._gids.pop(id(input.prompt_group), None)
        if is_aborted(input.group):
            self._window["aborted"] += 1
            self._totals["aborted_groups"] += 1
            self._reject(gid, input.prompt_group, recycle=True)
            return
        keep, reason = self._filter(input.group)
        if not keep:
            # Dropped, not recycled: as the default, a filtered group has no usable gradient signal.
            if reason:
                self._window["filter_reasons"][reason] += 1
            self._totals["dynamic_filter_groups"] += 1
            self._reject(gid, input.prompt_group, recycle=False)
            return
        cond = self._condition()
        async with cond:
            while gid is None and len(self._store) >= self._capacity:
                await cond.wait()
            if gid is not None:
                self._store.complete(gid, input)
            elif self._clock_kind == "rollout":
                # Not dispatched through us (put by hand): it is as fresh as the rollout now running.
                self._store.put(input, self._step)
            else:
                # A group without a weight version (Miles calls its staleness unknown and never filters it) is
                # stamped with the trainer's version now: it ages from here, one version per weight update.
                self._store.put(
                    input,
                    self._unversioned_stamp() if (oldest := group_oldest_version(input.group)) is None else oldest,
                )
            cond.notify_all()

    async def get(self, current_version: Optional[int] = None, **_: Any) -> Any:
        if current_version is not None:
            self._current_version = current_version
        if not self._stash:
            await self._take(current_version)
        entry = self._stash.popleft()
        staleness = self._staleness(entry.group, current_version)
        if staleness is not None:
            self._window["consumed"].append(staleness)
        return entry

    def get_metrics(self) -> Dict[str, float]:
        """Miles's ``rollout/fully_async/...`` and ``rollout/dynamic_filter/drop_<reason>`` (window counters,
        reset here) plus our ledger and totals under the library's prefix."""
        w = self._window
        metrics: Dict[str, float] = {
            f"{METRICS}queue_size": len(self._store) + len(self._stash),
            f"{METRICS}aborted_groups_filtered": w["aborted"],
            f"{METRICS}stale_groups_filtered": w["stale"],
            **{f"rollout/dynamic_filter/drop_{r}": c for r, c in w["filter_reasons"].items()},
        }
        if w["consumed"]:
            metrics[f"{METRICS}avg_staleness"] = sum(w["consumed"]) / len(w["consumed"])
            metrics[f"{METRICS}max_staleness"] = max(w["consumed"])
        waiting = [e.group for e in self._stash] + [e.group for e in self._store.ready_payloads()]
        buffered = [s for g in waiting if (s := self._staleness(g, self._current_version)) is not None]
        if buffered:
            metrics[f"{METRICS}buffer_avg_staleness"] = sum(buffered) / len(buffered)
            metrics[f"{METRICS}buffer_max_staleness"] = max(buffered)
        ours = buffer_metrics(self._store.buffer)
        prefix = next(iter(ours)).rsplit("/", 1)[0] + "/" if ours else "buffer/"
        ours.update({f"{prefix}miles/{k}": float(v) for k, v in self._totals.items()})
        ours[f"{prefix}miles/in_flight_groups"] = float(self._store.in_flight)
        metrics.update(ours)
        self._reset_window()
        return metrics

    # ---- save / load ----------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Everything a resumed run needs: the ring, the ready groups (a paced take's undelivered groups first),
        the groups in flight (to submit again) and the totals."""
        if self._stash:
            raise ValueError(f"{WHERE}: save between train calls, not while a paced batch is being handed out")
        return {
            "strategy": self.strategy,
            "store": self._store.state_dict(),
            "totals": dict(self._totals),
            "step": self._step,
            "current_version": self._current_version,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> List[Any]:
        """Restores ``state_dict()``; returns the prompt groups that were in flight (failed in the ledger), for
        the caller to submit again (``StalenessRolloutFn`` gives them back to the data source)."""
        if state.get("strategy") != self.strategy:
            raise ValueError(f"{WHERE}: the state was saved under {state.get('strategy')!r}, not {self.strategy!r}")
        lost = self._store.load_state_dict(state["store"])
        self._totals = dict(state["totals"])
        self._step = int(state["step"])
        self._current_version = state["current_version"]
        self._gids = {}
        return lost

    def save(self, path: str, state: Optional[Dict[str, Any]] = None) -> None:
        """Writes ``state_dict()`` (or ``state``, one it returned earlier) to ``path`` in our checked checkpoint
        format (``checkpoint.save_state``: atomic and durable, docs/checkpoints.md). Only the groups' payloads
        (Miles's ``Sample`` objects) are pickled, as Miles's own checkpoints do; the ring, ledger and counters are
        plain numbers and text."""
        state = self.state_dict() if state is None else state
        store = dict(state["store"])
        pickled = sorted(k for k, v in store.items() if isinstance(v, bytes))
        for key in pickled:  # the payloads the store pickled: stored as raw bytes, under the file's checksum
            store[key] = np.frombuffer(store[key], dtype=np.uint8)
        durable.make_directories(os.path.dirname(os.path.abspath(path)))
        checkpoint.save_state({**state, "format": STATE_FORMAT, "store": store, "pickled": pickled}, path)

    def load(self, path: str) -> List[Any]:
        """Restores what ``save`` wrote (or the whole-state pickle of earlier builds); returns the prompt groups that
        were in flight, as ``load_state_dict``. The file's checks (length, sha256) pass before anything in it is
        unpickled."""
        with open(path, "rb") as f:
            if f.read(1) == PICKLE_START:  # earlier builds pickled the whole state_dict
                f.seek(0)
                return self.load_state_dict(pickle.load(f))
        tree = checkpoint.load_state(path)
        if not isinstance(tree, dict) or tree.get("format") != STATE_FORMAT:
            raise checkpoint.CheckpointError(
                path,
                f"is not a Miles buffer state ({STATE_FORMAT}); pass the file StalenessDataBuffer.save wrote "
                "(state_path(root, rollout_id))",
            )
        store = dict(tree["store"])
        for key in tree["pickled"]:
            store[key] = np.asarray(store[key]).tobytes()
        state = {k: v for k, v in tree.items() if k not in ("format", "pickled")}
        state["store"] = store
        return self.load_state_dict(state)

    # ---- internals ------------------------------------------------------------------------------------------
    async def _take(self, current_version: Optional[int]) -> None:
        if self._clock_kind == "rollout" and self.strategy != "drop":
            # One take of a whole step's groups per train call: pace's proof assumes P groups taken per step. Nothing
            # is dropped, and a finished group's put never waits, so what this take waits for always arrives.
            taken, dropped = await self._store.take(self._per_step, self._step)
            await self._after_take(taken, dropped, current_version)
            return
        cond = self._condition()
        while True:
            async with cond:
                while not len(self._store):
                    await cond.wait()
            # No await from here to the take: no put can slip in a stamp above the step taken at.
            # Drop takes what is fresh now and hands the stale to the unused handler at once: the capacity they
            # held frees the producer, which a blocking take holding them until it is full could never do.
            if self._clock_kind == "rollout":
                taken, dropped = self._store.take_now(1, self._step)
            elif current_version is None:
                # Before the first weight update Miles's staleness is unknown, and the default filters nothing.
                taken, dropped = self._store.take_now(1, self._store.largest_stamp, bounded=False)
            else:
                taken, dropped = self._store.take_now(1, max(current_version, self._store.largest_stamp))
            await self._after_take(taken, dropped, current_version)
            if taken:
                return

    async def _after_take(self, taken: List[Any], dropped: List[Any], current_version: Optional[int]) -> None:
        for entry in dropped:
            staleness = self._staleness(entry.group, current_version)
            logger.info("Filtered stale group (staleness=%s > max=%s)", staleness, self._args.max_weight_staleness)
            if staleness is not None:
                self._window["consumed"].append(staleness)
            self._window["stale"] += 1
            self._totals["stale_groups"] += 1
            self._hand_back(entry.prompt_group)
        self._stash.extend(taken)
        self._signal_admission()
        cond = self._condition()
        async with cond:
            cond.notify_all()  # wake producers blocked on a full buffer

    def _reject(self, gid: Optional[int], prompt_group: Any, recycle: bool) -> None:
        if gid is not None:
            self._store.fail(gid)
            self._signal_admission()
        if recycle:
            self._hand_back(prompt_group)

    def _hand_back(self, prompt_group: Any) -> None:
        if getattr(self._args, "async_unused_samples_handler", "drop") == "retry":
            self._totals["recycled_groups"] += 1
        self._unused_handler_fn(prompt_group)

    def _filter(self, group: Any) -> Any:
        if self._dynamic_filter is None:
            return True, None
        out = self._dynamic_filter(self._args, group)
        if not hasattr(out, "keep"):  # the legacy form: the verdict itself, as Miles reads it
            return bool(out), None
        return bool(out.keep), getattr(out, "reason", None)

    def _unversioned_stamp(self) -> int:
        known = self._store.largest_stamp
        return known if self._current_version is None else max(known, self._current_version)

    @staticmethod
    def _staleness(group: Any, current_version: Optional[int]) -> Optional[int]:
        oldest = group_oldest_version(group)
        if oldest is None or current_version is None:
            return None
        return current_version - oldest

    def _reset_window(self) -> None:
        self._window: Dict[str, Any] = {
            "aborted": 0,
            "stale": 0,
            "consumed": [],
            "filter_reasons": collections.Counter(),
        }

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:  # made on first use, inside the running loop (Python 3.9 binds it at creation)
            self._cond = asyncio.Condition()
        return self._cond

    def _admission_event(self) -> asyncio.Event:
        if self._admission is None:
            self._admission = asyncio.Event()
        return self._admission

    def _signal_admission(self) -> None:
        if self._admission is not None:
            self._admission.set()
