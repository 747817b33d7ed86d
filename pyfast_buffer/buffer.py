"""StalenessBuffer: the Python face of the native core."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core, _torch, bias, state
from ._args import (
    as_count,
    as_ids,
    as_lease,
    as_lengths,
    as_seconds,
    as_slots,
    as_step,
    as_steps,
    as_timeout,
    same_length,
)
from ._buffer_base import BufferBase, check_bounded
from .accounting import AccountingMethods
from .batch import Batch, log_record, make_metrics
from .config import SourceMaxAge, check_max_age_keeps_lookahead, pace_limits, resolve_pin_memory
from .errors import CLOSED_MESSAGE, BufferClosedError
from .released import Released

if TYPE_CHECKING:  # torch loads on the first tensor made or read, not with the package
    import torch

Ids = Union["torch.Tensor", np.ndarray, Sequence[int]]
_N_COLUMNS = _core.BATCH_COLUMNS
_INT64 = np.dtype(np.int64)
_INT64_MAX = int(np.iinfo(np.int64).max)


def _pinned_columns(capacity: int) -> tuple:
    torch = _torch.require()  # pinning means a CUDA torch, asked for already by resolve_pin_memory
    wide = [torch.empty(capacity, dtype=torch.int64, pin_memory=True) for _ in range(7)]
    narrow = [torch.empty(capacity, dtype=torch.int32, pin_memory=True) for _ in range(2)]
    return tuple(wide + narrow)


class StalenessBuffer(BufferBase, AccountingMethods):
    """A ring of step-stamped trajectory ids that hands out only what is fresh enough to train on.

    Args:
        capacity: ready trajectories the ring holds (> 0); its memory is allocated once, here.
        max_age: largest age (``current_step - sample_step``) that may be trained on.
        strategy: ``"drop"`` discards stale entries at take; ``"wait"`` drops nothing and refuses
            to take while an in-flight prompt has ``age >= max_age``; ``"pace"`` admits prompts at dispatch
            only while they can be trained within max_age, takes the stalest first, drops nothing, and waits at
            take only for an in-flight prompt that would otherwise pass max_age (docs/design.md, "pace").
        max_uses: times an entry may be taken before it retires (1 = pure on-policy).
        on_full: what a put/complete that does not fit does: ``"evict_oldest"`` (counted as
            evicted), ``"block"`` (wait for room, with a timeout) or ``"error"`` (BufferFullError).
        pin_memory: keep the ring and batches in pinned host memory; None pins iff CUDA is available.
        parameter_sync_step: trainer steps between weight pushes; stamps ``policy_version``.
        track_released: report every id that leaves, with why, through ``released()``.
        release_bound: records ``released()`` keeps between two calls (default ``2 * capacity + 65536``);
            past it the oldest are discarded and counted in ``ledger()["released_overflow"]``.
        unique_ids: refuse (ValueError) a trajectory id that is already ready in the ring; costs a hash
            set of the ready ids (about 40 bytes per entry) and one lookup per id put or taken.
        prompts_per_step: under pace (required there, refused elsewhere), the prompt groups one training step
            takes; the trainer is expected to take that many groups at every step.
        lookahead: under pace, how many steps generation may run ahead of training (default max_age,
            ``0 <= lookahead <= max_age``): at most ``(lookahead + 1) * prompts_per_step`` groups are in
            flight or ready.
        age_from: ``"start"`` measures age from the dispatch step, ``"finish"`` from each group's finish_step
            (see complete).
        max_attempts: with ``k``, a prompt's k-th (and any later) attempt is protected: under ``drop`` its
            group is never dropped for staleness, so no prompt is regenerated more than k times
            (docs/data-bias.md says which age a protected group can reach).
        source_max_age: ``{source: max_age}`` overriding ``max_age`` for prompts and trajectories tagged with
            that source (``dispatch``/``put`` ``source=``); settable between calls like ``max_age``.
        starvation_share: warn on the ``pyfast_buffer`` logger, once per window, when a source's share of the
            trajectories taken falls below this while it still had prompts dispatched.
    """

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
        prompts_per_step: Optional[int] = None,
        lookahead: Optional[int] = None,
        age_from: str = "start",
        max_attempts: Optional[int] = None,
        source_max_age: Optional[SourceMaxAge] = None,
        starvation_share: Optional[float] = None,
    ) -> None:
        self._configure(locals())
        self._config_lock = threading.Lock()  # keeps config.max_age in step with the core's under concurrent setters
        self.pin_memory = resolve_pin_memory(pin_memory)
        self._capacity = self.config.capacity
        # Pinned columns are allocated once by torch and borrowed by the core; this object keeps them alive.
        self._columns = _pinned_columns(capacity) if self.pin_memory else None
        self._ring = _core.Ring(
            capacity,
            max_age,
            strategy,
            max_uses,
            on_full,
            parameter_sync_step or 0,
            tuple(t.numpy() for t in self._columns) if self._columns else None,
            track_released=track_released,
            release_bound=release_bound or 0,
            unique_ids=unique_ids,
            prompts_per_step=pace_limits(self.config)[0],
            lookahead=pace_limits(self.config)[1],
            age_from=age_from,
            max_attempts=max_attempts or 0,
        )
        for source, age in self.config.source_bounds():
            self._ring.set_source_max_age(source, age)
        self._watch = bias.StarvationWatch(starvation_share)
        self._takes_seen = 0  # takes so far: every bias.WINDOW_TAKES-th logs the bias record

    def dispatch(
        self,
        prompt_ids: Ids,
        step: int,
        lease: Optional[float] = None,
        timeout: Optional[float] = None,
        *,
        source: Union[int, Ids, None] = None,
    ) -> None:
        """Marks prompts as in flight, generated with the weights of ``step``.

        With ``lease`` (seconds, > 0), a prompt neither completed, failed nor renewed within it is failed by
        the buffer (counted in ``failed`` and ``expired``) at the next call that looks at the in-flight table,
        or while a blocking take waits; see docs/reliability.md. ``source`` tags the prompts (one int in
        [0, 63] for all, or one per prompt): ``source_max_age`` and the per-source metrics key on it. A prompt
        dispatched again after its previous attempt left untrained counts as a retry (``starved()``).

        Under ``strategy="pace"`` the call admits all its prompts or none: without ``timeout`` one that does
        not fit raises AdmissionError (a BufferFullError), with one it waits (the GIL released, interruptible)
        until a take, fail, expiry or load frees room, or raises TimeoutError. Other strategies never wait.
        With ``max_attempts``, a call holding a prompt's max_attempts-th untrained attempt is admitted before
        any other: while it waits, other dispatches and puts are refused (without ``timeout``) or wait behind
        it; the limit itself is not raised (docs/design.md, "pace: protected attempts first").
        """
        prompts = as_ids(prompt_ids, "prompt_ids")
        slots = as_slots(source, len(prompts), "prompts")
        self._ring.dispatch(prompts, as_step(step, "step"), as_lease(lease), as_timeout(timeout), slots)
        self._watch.on_dispatch(None if slots is None else slots - 1, len(prompts))

    # ---- the awaitable API's hooks (aio.py): the core's wake fd and admission waiters ----------------------------
    def _set_wake_fd(self, fd: int) -> None:
        self._ring.set_wake_fd(fd)

    def _arm_wake(self) -> None:
        self._ring.arm_wake()

    def _next_lease_deadline_ns(self) -> int:
        return self._ring.next_lease_deadline_ns()

    def _begin_admission_wait(self, prompt_ids: Ids) -> bool:
        return self._ring.begin_admission_wait(as_ids(prompt_ids, "prompt_ids"))

    def _end_admission_wait(self, protected: bool) -> None:
        self._ring.end_admission_wait(protected)

    def admissible(self, step: int) -> int:
        """Returns how many prompts stamped ``step`` a dispatch may start now (strategy="pace" only)."""
        return self._ring.admissible(as_step(step, "step"))

    def renew(self, prompt_ids: Ids, lease: float) -> None:
        """Gives in-flight prompts a lease of ``lease`` seconds from now (also prompts dispatched without one)."""
        prompts = as_ids(prompt_ids, "prompt_ids")
        self._ring.renew(prompts, as_seconds(lease, "lease", False, "renew with a lease > 0"))

    def restamp_in_flight(self, step: int) -> int:
        """Under ``age_from="finish"``: the weights of ``step`` now write every in-flight prompt (an in-flight weight
        update reached the running generations), so each prompt stamped below ``step`` is stamped ``step``: its
        finish step can be no earlier. ``pace`` admission and the take gates judge in-flight prompts by it, and a
        batch row reports it as ``sample_step``. ``step`` may not pass the trainer's next step (pace's next take;
        else one past the largest step seen). Call it once the push reached the engines and what they finished
        before it was completed: a later ``complete`` with a ``finish_step`` below the stamp is refused. Returns
        how many prompts it raised (docs/design.md, "In-flight weight updates")."""
        return self._ring.restamp_in_flight(as_step(step, "step"))

    def expire_in_flight(self, older_than_s: float) -> int:
        """Fails, as expired, every in-flight prompt dispatched at least ``older_than_s`` seconds ago; returns
        how many prompts this call expired (leases that passed included). For callers without leases."""
        return self._ring.expire_in_flight(as_seconds(older_than_s, "older_than_s", True, "pass seconds >= 0"))

    def _set_lease_clock(self, now_ns: Optional[int]) -> None:
        """Test hook: freezes the lease clock at ``now_ns`` (None: the monotonic clock again)."""
        self._ring._set_lease_clock(now_ns)

    def complete(
        self,
        traj_ids: Ids,
        prompt_ids: Ids,
        timeout: Optional[float] = None,
        *,
        finish_step: Union[int, Ids, None] = None,
        lengths: Optional[Ids] = None,
    ) -> None:
        """Moves finished trajectories into the ring; ``prompt_ids[i]`` is the prompt of ``traj_ids[i]``.

        ``finish_step`` (one int or one per trajectory, each >= its prompt's dispatch step; default the dispatch
        step) is the step of the weights in force when the trajectory finished: the batch reports it and
        ``span = finish_step - sample_step``; under ``age_from="finish"`` age is measured from it. ``lengths``
        (optional, one token count per trajectory) feeds the bias monitor's length sketches (docs/data-bias.md).
        """
        trajs, prompts = as_ids(traj_ids, "traj_ids"), as_ids(prompt_ids, "prompt_ids")
        same_length(trajs, "traj_ids", prompts, "prompt_ids")
        finish = None if finish_step is None else as_steps(finish_step, "finish_step", len(trajs))
        self._ring.complete(trajs, prompts, as_timeout(timeout), finish, as_lengths(lengths, len(trajs)))

    def fail(self, prompt_ids: Ids) -> None:
        """Marks in-flight prompts as failed; nothing of theirs enters the ring."""
        self._ring.fail(as_ids(prompt_ids, "prompt_ids"))

    def put(
        self,
        traj_ids: Ids,
        sample_step: Union[int, Ids],
        group_ids: Optional[Ids] = None,
        timeout: Optional[float] = None,
        *,
        finish_step: Union[int, Ids, None] = None,
        source: Union[int, Ids, None] = None,
    ) -> None:
        """Dispatch + complete in one call; ``sample_step`` and ``finish_step`` (see complete) are one int or one
        per trajectory, ``source`` one tag or one per trajectory (a group shares one). Under pace each group is
        admitted as a dispatched prompt (``timeout`` bounds that wait too). Put entries are outside the bias
        monitor and the prompt-attempt table: the buffer never saw their rollout."""
        # The common call (ungrouped ids, one int stamp) goes straight to the core: numpy ids as they are, a CPU
        # int64 tensor through its data pointer (put_tensor declines anything else, which takes the general route).
        if (
            group_ids is None
            and finish_step is None
            and source is None
            and type(sample_step) is int
            and 0 <= sample_step <= _INT64_MAX
        ):
            if (
                type(traj_ids) is np.ndarray
                and traj_ids.dtype == _INT64
                and traj_ids.ndim == 1
                and traj_ids.flags.c_contiguous
            ):
                self._ring.put_one_stamp(traj_ids, sample_step, None if timeout is None else as_timeout(timeout))
                return
            torch = _torch.loaded()
            if torch is not None and type(traj_ids) is torch.Tensor:
                wait = None if timeout is None else as_timeout(timeout)
                if self._ring.put_tensor(traj_ids, torch.int64, sample_step, wait):
                    return
        trajs = as_ids(traj_ids, "traj_ids")
        if type(sample_step) is int and 0 <= sample_step <= _INT64_MAX:
            steps = np.array((sample_step,), _INT64)
        else:
            steps = as_steps(sample_step, "sample_step", len(trajs))
        groups = None
        if group_ids is not None:
            groups = as_ids(group_ids, "group_ids")
            same_length(trajs, "traj_ids", groups, "group_ids")
        finish = None if finish_step is None else as_steps(finish_step, "finish_step", len(trajs))
        slots = None if source is None else as_slots(source, len(trajs), "trajectories")
        self._ring.put(trajs, groups, steps, None if timeout is None else as_timeout(timeout), finish, slots)

    def take(
        self, batch_size: int, current_step: int, timeout: Optional[float] = None, *, bounded: bool = True
    ) -> Batch:
        """Takes up to ``batch_size`` trajectories, oldest first, in whole groups.

        Without a timeout it never blocks and may return fewer (``batch.blocked_by`` says
        why); with one it waits for a full batch or raises TimeoutError naming the cause.
        ``bounded=False`` takes without max_age for this call only: nothing is dropped stale, wait's in-flight
        gate does not hold it, and what it hands out past max_age counts in ``trained_over_age``; other threads'
        takes keep the bound (refused under pace, whose admission is the bound).
        """
        if bounded is not True:
            check_bounded(bounded, self.config.strategy)
        if type(batch_size) is int and 0 < batch_size <= _INT64_MAX:  # plain ints skip the general checks
            n = batch_size
        else:
            n = as_count(batch_size, "batch_size", 1)
        step = (
            current_step
            if type(current_step) is int and 0 <= current_step <= _INT64_MAX
            else as_step(current_step, "current_step")
        )
        wait = None if timeout is None else as_timeout(timeout)
        rows = n if n < self._capacity else self._capacity  # a batch never holds more than the ring
        columns: Union[torch.Tensor, np.ndarray]
        if self.pin_memory:
            torch = _torch.require()
            out = torch.empty(_N_COLUMNS * rows, dtype=torch.int64, pin_memory=True)
            stats = self._ring.take(out.numpy(), n, step, wait, bounded)
            taken = stats[0]
            if 2 * taken < rows:  # much smaller than requested: copy, so the batch owns only the rows it returned
                owned = torch.empty(_N_COLUMNS * taken, dtype=torch.int64, pin_memory=True)
                out = owned.copy_(out[: _N_COLUMNS * taken])
            columns = out[: _N_COLUMNS * taken].view(_N_COLUMNS, taken)
        else:  # numpy allocates and reshapes for less than torch; one from_numpy shares the memory
            flat = np.empty(_N_COLUMNS * rows, _INT64)
            stats = self._ring.take(flat, n, step, wait, bounded)
            taken = stats[0]
            if taken == rows:
                kept = flat
            else:  # much smaller than requested: copy, so the batch owns only the rows it returned
                kept = flat[: _N_COLUMNS * taken].copy() if 2 * taken < rows else flat[: _N_COLUMNS * taken]
            columns = kept.reshape(_N_COLUMNS, taken)  # Batch wraps it in a tensor on first access
        # The core wrote the batch field by field at stride `taken`: rows of a (BATCH_COLUMNS, taken) contiguous block.
        log_record(stats)  # the log record is written per take; the metrics dict is built on first access
        self._watch_take(stats)
        return Batch(columns, stats=stats)

    def evict_stale(self, current_step: int) -> int:
        """Drops every ready entry with age > max_age (counted as dropped_stale); returns how many."""
        stats = self._ring.evict_stale(as_step(current_step, "current_step"))
        make_metrics(stats)
        return stats[1]

    def evict_oldest(self, groups: int = 1) -> int:
        """Evicts the oldest ``groups`` whole groups now (all if fewer are ready), counted as evicted, as
        ``on_full="evict_oldest"`` does for a put that does not fit; returns how many entries left."""
        return self._ring.evict_oldest(as_count(groups, "groups", 0))

    def released(self) -> Released:
        """Returns every id that left the buffer since the previous call, oldest first, with its reason code
        (see ``RELEASE_REASONS``); needs ``track_released=True`` (ValueError otherwise)."""
        ids, reasons = self._ring.released()
        return Released(ids, reasons)

    def ledger(self) -> Dict[str, int]:
        """Returns the cumulative counters; see docs/design.md, "The ledger", for the two invariants they satisfy."""
        return self._ring.ledger()

    def __len__(self) -> int:
        return len(self._ring)

    @property
    def max_age(self) -> int:
        """The largest age that may be trained on, in force now.

        Settable between calls (``buf.max_age = k``, an int >= 0, thread-safe): the next take or
        evict_stale applies the new cutoff to every ready entry; entries already dropped stay dropped.
        Each change is counted in ``ledger()["max_age_changes"]`` and ``config`` follows it.
        """
        return self._ring.max_age

    @max_age.setter
    def max_age(self, value: int) -> None:
        max_age = as_count(value, "max_age", 0)
        check_max_age_keeps_lookahead(self.config, max_age)
        with self._config_lock:
            self._ring.max_age = max_age
            self.config = dataclasses.replace(self.config, max_age=max_age)

    @property
    def in_flight(self) -> int:
        """Number of prompts dispatched and neither completed nor failed."""
        return self._ring.in_flight

    @property
    def closed(self) -> bool:
        return self._ring.closed

    def close(self) -> None:
        """Closes the buffer and wakes every blocked take/put at once with BufferClosedError."""
        self._ring.close()

    def __repr__(self) -> str:
        return repr(self._ring)

    def _attempts_now(self) -> Tuple[Tuple[int, ...], Dict[int, int]]:
        return self._ring.attempts()

    def _starved_now(self, min_attempts: int) -> Dict[int, int]:
        return self._ring.starved(min_attempts)

    def _source_counts_now(self) -> np.ndarray:
        return self._ring.source_counts()

    def _bias_now(self) -> Optional[tuple]:
        return self._ring.bias()

    def _apply_source_max_age(self, source: int, max_age: int) -> None:
        self._ring.set_source_max_age(source, max_age)

    def state_dict(self) -> Dict[str, Any]:
        """Returns the whole state (entries, in-flight prompts, ledger, clock) as torch tensors."""
        return packed_state(self.config, self._ring.export_state())

    def _journal_delta(self, full: bool = False) -> Dict[str, Any]:
        """What changed since the previous call, as numpy columns (the Ray index's journal, ``ray/_ring_replay``):
        everything on the first call or with ``full``. Expires nothing."""
        return self._ring.export_delta(full)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Replaces the contents and ledger with a state_dict's; this buffer keeps its own configuration."""
        if self._ring.closed:
            raise BufferClosedError(CLOSED_MESSAGE)
        s = state.unpack(state_dict, self.config.capacity, self.config.max_uses)
        flat = {k: v for k, v in s["entries"].items()}
        flat["uses"] = flat["uses"].astype(np.int32)
        flat["group_len"] = flat["group_len"].astype(np.int32)
        flat.update(
            in_flight_prompt=s["in_flight"]["prompt_id"],
            in_flight_step=s["in_flight"]["sample_step"],
            in_flight_dispatch_ns=s["in_flight"]["dispatch_ns"],
            in_flight_lease_left_ns=s["in_flight"]["lease_left_ns"],
            in_flight_held_ns=s["in_flight"]["held_ns"],
            in_flight_meta=s["in_flight"]["meta"],
            attempts=s["attempts"],
            attempt_counters=s["attempt_counters"],
            source_counts=s["source_counts"],
            ledger=s["ledger"],
            clock=s["clock"],
            evicted_unreported=s["evicted_unreported"],
            next_take=s["next_take"],
        )
        self._ring.import_state(flat)


def packed_state(config: Any, s: Dict[str, Any]) -> Dict[str, Any]:
    """The state_dict of the core's flat export (``export_state``, or a journal replay's)."""
    entries = {k: s[k] for k in state.ENTRY_COLUMNS + state.LATER_ENTRY_COLUMNS}
    in_flight = {
        "prompt_id": s["in_flight_prompt"],
        "sample_step": s["in_flight_step"],
        "dispatch_ns": s["in_flight_dispatch_ns"],
        "lease_left_ns": s["in_flight_lease_left_ns"],
        "held_ns": s["in_flight_held_ns"],
        "meta": s["in_flight_meta"],
    }
    return state.pack(
        config,
        entries,
        in_flight,
        s["ledger"],
        s["clock"],
        s["evicted_unreported"],
        s["next_take"],
        attempts=s["attempts"],
        attempt_counters=s["attempt_counters"],
        source_counts=s["source_counts"],
    )
