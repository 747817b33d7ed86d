"""verl's ``trainer.v1`` replay buffers over pyfast_buffer: ``ReplayBuffer``, ``ReplayBufferAsync`` and
``FastReplayBuffer`` (the package's ``__init__`` says how to point verl at them).

The semantics are verl 0.9.1's (docs/verl.md has the versions matched): groups are evicted before selection
for staleness (async ``drop``), for failure (async, or sync with ``sync_refill_failed_groups``) and by DAPO
group filtering; ``refill_fn(k)`` asks the trainer for exactly the ``k`` prompts evicted; ``wait`` blocks while
an in-flight prompt has reached the threshold; a null threshold turns both off; the ``val`` partition never
evicts. ``pace`` (ours) admits prompts through ``PacedAgentLoopManager`` and takes through the core's gate.
The metrics dict carries verl's keys only (our ledger goes to the ``pyfast_buffer.verl`` log, and into the
dict with ``sampler_kwargs.ledger_metrics: true``).

Absolute imports only: verl may load the sampler package by file path, outside the package.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any, Callable, Optional

try:
    from transfer_queue import KVBatchMeta
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    # ModuleNotFoundError (an ImportError): "a dependency is missing", which pytest.importorskip and
    # callers probing optional extras treat as absent rather than broken.
    raise ModuleNotFoundError(
        "pyfast_buffer.integrations.verl needs TransferQueue; install it with: pip install 'pyfast_buffer[verl]'",
        name=exc.name,
    ) from exc

from pyfast_buffer.integrations.verl import _options as options
from pyfast_buffer.integrations.verl._eviction import Eviction
from pyfast_buffer.integrations.verl._metrics import LEDGER_PREFIX, VAL, metrics_prefix
from pyfast_buffer.integrations.verl._pace import LINK, PacedSampling

logger = logging.getLogger("pyfast_buffer.verl")  # under the package's "pyfast_buffer" logger


def rollout_skip_aware(sample: Callable) -> Callable:
    """Wraps ``sample`` with verl's ``SkipManager.annotate_tq(role="rollout_tq", phase="sample")`` when verl's
    rollout-skip module is loaded (inside verl it is; elsewhere the call goes straight through), as verl wraps
    its own buffers' ``sample``: with ``skip.rollout_tq`` on, the sampled batch is saved for later runs."""

    @functools.wraps(sample)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        skip_manager = getattr(sys.modules.get("verl.utils.skip"), "SkipManager", None)
        if skip_manager is None:
            return sample(self, *args, **kwargs)
        return skip_manager.annotate_tq(role="rollout_tq", phase="sample")(sample)(self, *args, **kwargs)

    return wrapper


class ReplayBuffer(PacedSampling, Eviction):
    """verl's sync (on-policy) replay buffer: ``max_off_policy_strategy`` is a no-op.

    Failed groups stay sampleable (verl pads their missing trajectories) unless
    ``sync_refill_failed_groups``, which evicts failed groups with no trajectory and refills them.
    With ``filter_groups_metric`` (DAPO), each filtered group earns two refill credits, dispatched in
    multiples of ``gen_batch_size`` while pending + running stays under
    ``max_inflight_gen_batches * train_batch_size``; once a batch is sampleable the in-flight prompts
    are drained and the surplus discarded.

    Args are verl's. Inside verl, DAPO (``algorithm.filter_groups``), ``sync_refill_failed_groups`` and the
    batch sizes are read from the trainer ``refill_fn`` is bound to; built by hand, from these arguments or
    ``sampler_kwargs``. ``sampler_kwargs`` may also carry ``timeout`` (s, default 600: a sample that waits
    longer raises TimeoutError), ``poll_backoff_max`` (s, cap of our poll backoff, default 0.05), ``capacity``
    (largest batch_size, default 65536), ``ledger_metrics`` (bool), ``age_from`` (``dispatch``,
    ``generation_start`` or ``generation_finish``) and, under pace, ``prompts_per_step`` and ``lookahead``.
    ``poll_interval`` stays verl's value (its separate_async trainer reads it to tell an idle step).
    """

    _ON_POLICY: Optional[bool] = True  # None: decided by trainer_mode (FastReplayBuffer)

    def __init__(
        self,
        trainer_mode: str,
        trainer_config: Any,
        max_off_policy_threshold: Optional[int],
        max_off_policy_strategy: str,
        sampler_kwargs: Any = None,
        poll_interval: float = 2.0,
        refill_fn: Optional[Callable[[int], Any]] = None,
        filter_groups_metric: Optional[str] = None,
        train_batch_size: Optional[int] = None,
        gen_batch_size: Optional[int] = None,
        max_inflight_gen_batches: int = 1,
        sync_refill_failed_groups: bool = False,
    ) -> None:
        self.on_policy = trainer_mode == "sync" if self._ON_POLICY is None else self._ON_POLICY
        opts = options.parse(
            self.on_policy,
            max_off_policy_threshold,
            max_off_policy_strategy,
            sampler_kwargs,
            poll_interval,
            refill_fn,
            filter_groups_metric,
            train_batch_size,
            gen_batch_size,
            max_inflight_gen_batches,
            sync_refill_failed_groups,
        )
        self.options = opts
        self.trainer_mode = trainer_mode
        self.trainer_config = trainer_config
        self.max_off_policy_threshold = opts.max_off_policy_threshold
        self.max_off_policy_strategy = opts.max_off_policy_strategy
        self.sampler_kwargs = sampler_kwargs
        self.poll_interval = poll_interval
        self.refill_fn = refill_fn
        self.filter_groups_metric = opts.filter_groups_metric
        self.train_batch_size = opts.train_batch_size
        self.gen_batch_size = opts.gen_batch_size
        self.max_inflight_gen_batches = opts.max_inflight_gen_batches
        self.sync_refill_failed_groups = opts.sync_refill_failed_groups
        self.timeout = opts.timeout
        self.poll_backoff_max = opts.poll_backoff_max
        paced = opts.max_off_policy_strategy == "pace" and not self.on_policy
        pace = (opts.max_age, opts.prompts_per_step, opts.lookahead) if paced else None
        self._init_state(opts.capacity, pace)
        if opts.max_off_policy_threshold is None:
            logger.info(
                "off-policy version control disabled (max_off_policy_threshold is null): nothing is "
                "dropped or awaited for staleness"
            )
        if paced:
            LINK.attach_sampler(self)

    def _pause(self, partition_id: str, backoff: float, deadline: float) -> float:
        """Sleeps before the next poll: 1 ms doubling to ``poll_backoff_max``, never shorter than the last
        listing took (so a waiting sampler keeps TransferQueue's controller busy at most about half the time)."""
        last_list = self._book(partition_id).last_list_s
        time.sleep(max(0.0, min(max(backoff, last_list), deadline - time.monotonic())))
        return min(backoff * 2, self.poll_backoff_max)

    def _timeout(self, call: str, global_steps: int, partition_id: str, wanted: int, why: str) -> TimeoutError:
        return TimeoutError(
            f"{call}(global_steps={global_steps}, partition_id={partition_id!r}) timed out after {self.timeout:g} s "
            f"wanting {wanted} groups: {why}. Check the rollout workers, or raise "
            "trainer.v1.sampler.sampler_kwargs.timeout"
        )

    def _check_call(self, global_steps: Any, partition_id: Any, count: Any, name: str) -> None:
        if isinstance(global_steps, bool) or not isinstance(global_steps, int) or global_steps < 0:
            raise ValueError(f"global_steps={global_steps!r} must be an int >= 0 (the trainer's step)")
        if not isinstance(partition_id, str) or not partition_id:
            raise ValueError(f"partition_id={partition_id!r} must be a non-empty str such as 'train' or 'val'")
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= self.options.capacity:
            raise ValueError(
                f"{name}={count!r} must be an int in [1, {self.options.capacity}] (prompts; raise "
                "sampler_kwargs.capacity for more)"
            )

    def _held_summary(self, partition_id: str) -> str:
        steps = self.prompt_global_steps[partition_id]
        waiting = sorted(
            self.pending_keys[partition_id] | self.running_keys[partition_id], key=lambda u: (steps.get(u, 0), u)
        )
        shown = ", ".join(f"{u}@{steps.get(u)}" for u in waiting[:8]) + (
            f" and {len(waiting) - 8} more" if len(waiting) > 8 else ""
        )
        return f"in-flight prompts (uid@step): {shown or 'none'}"

    def _finish(
        self, global_steps: int, partition_id: str, keys: list[str], tags: list[dict], metrics: dict
    ) -> tuple[KVBatchMeta, dict]:
        ledger = self.ledger(partition_id)
        logger.info(
            "partition=%s step=%d " + " ".join(f"{k}=%d" for k in ledger), partition_id, global_steps, *ledger.values()
        )
        if self.options.ledger_metrics:
            prefix = f"{metrics_prefix(partition_id)}/{LEDGER_PREFIX}"
            metrics.update({f"{prefix}/{k}": v for k, v in ledger.items()})
        return KVBatchMeta(partition_id=partition_id, keys=keys, tags=tags), metrics

    # ---- verl's interface ----------------------------------------------------------------------
    @rollout_skip_aware
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """Returns ``batch_size`` whole groups (oldest ``global_steps`` first) and verl's eviction metrics.

        Blocks until they are sampleable, polling TransferQueue; raises TimeoutError after
        ``sampler_kwargs.timeout`` naming the in-flight prompts, and RuntimeError (verl's) when every
        selected group is a failed one without trajectories.
        """
        if not self.on_policy:
            return self._sample_async(global_steps, partition_id, batch_size)
        self._check_call(global_steps, partition_id, batch_size, "batch_size")
        dapo = partition_id != VAL and self.filter_groups_metric is not None
        inflight_cap = self.max_inflight_gen_batches * (self.train_batch_size or 0) if dapo else 0
        acc: dict = {}
        credit, draining = 0, False
        deadline, backoff = time.monotonic() + self.timeout, 0.001
        while True:
            refill = 0
            with self._lock:
                reasons, _, items = self._eviction_pass(global_steps, partition_id, acc)
                sampleable = self._sampleable(partition_id, reasons)
                enough = len(sampleable) >= batch_size
                in_flight = len(self.pending_keys[partition_id]) + len(self.running_keys[partition_id])
                failed = len(reasons[2])
                if not dapo and failed and not enough:
                    refill = failed
                elif dapo:
                    if enough:  # stop dispatching; drain what is already running under this policy
                        draining, credit = True, 0
                    elif not draining:
                        credit += 2 * len(reasons[1]) + failed
                    if not draining and credit > 0:
                        refill = min(credit, max(0, inflight_cap - in_flight))
                        refill -= refill % (self.gen_batch_size or 1)
                        credit -= refill
                if not refill and enough and (not dapo or in_flight == 0):
                    chosen = self._oldest(partition_id, sampleable, batch_size)
                    if partition_id != VAL and not any(self._has_trajectories(partition_id, u) for u in chosen):
                        message = (
                            "Sync replay buffer selected terminal groups with no materializable "
                            f"trajectories ({len(chosen)} failed groups, none written)."
                        )
                        if not self.sync_refill_failed_groups:
                            message += " Enable trainer.v1.sampler.sync_refill_failed_groups to replace failed groups."
                        raise RuntimeError(message)
                    if dapo:  # sync stays bufferless: the drained surplus is discarded
                        surplus = sampleable - set(chosen)
                        if surplus:
                            self._book(partition_id).ledger["discarded_surplus"] += len(surplus)
                            self._clear_groups(partition_id, surplus)
                            key = f"{metrics_prefix(partition_id)}/filter_groups/discarded_surplus_samples"
                            acc[key] = acc.get(key, 0) + len(surplus)
                    keys, tags = self._take_groups(partition_id, chosen, items)
                    return self._finish(global_steps, partition_id, keys, tags, acc)
            if refill:
                self._refill(partition_id, refill)
                continue
            if time.monotonic() >= deadline:
                raise self._timeout(
                    "sample",
                    global_steps,
                    partition_id,
                    batch_size,
                    f"{len(sampleable)} sampleable; {self._held_summary(partition_id)}",
                )
            backoff = self._pause(partition_id, backoff, deadline)

    def get_sampleable_count(self, global_steps: int, partition_id: str) -> int:
        """How many terminal groups could be sampled now (one listing; evicts nothing, consumes nothing)."""
        with self._lock:
            self._sync_metadata_from_transfer_queue(partition_id)
            return len(self._sampleable(partition_id, self._terminal_eviction_reasons(global_steps, partition_id)))

    def wait_for_sampleable(self, global_steps: int, partition_id: str, target_count: int) -> tuple[set[str], dict]:
        """Polls until ``target_count`` groups are sampleable, evicting and refilling meanwhile (async rules).

        Returns the sampleable uids and the eviction metrics of the wait; raises TimeoutError after
        ``sampler_kwargs.timeout``.
        """
        self._check_call(global_steps, partition_id, target_count, "target_count")
        ready, metrics, _ = self._wait(global_steps, partition_id, target_count, take=False, call="wait_for_sampleable")
        return ready, metrics

    # ---- async -----------------------------------------------------------------------------------
    def _blocked_by_wait(self, global_steps: int, partition_id: str) -> list[str]:
        """Under async ``wait``: the in-flight prompts with ``global_steps - step + 1 >= threshold``."""
        if self.on_policy or self.max_off_policy_strategy != "wait" or self.max_off_policy_threshold is None:
            return []
        steps = self.prompt_global_steps[partition_id]
        limit = global_steps + 1 - self.max_off_policy_threshold  # blocking iff prompt_step <= limit
        return [u for u in self.pending_keys[partition_id] | self.running_keys[partition_id] if steps[u] <= limit]

    def _wait(
        self, global_steps: int, partition_id: str, count: int, take: bool, call: str
    ) -> tuple[set[str], dict, Optional[tuple[KVBatchMeta, dict]]]:
        acc: dict = {}
        deadline, backoff = time.monotonic() + self.timeout, 0.001
        paced = self._book(partition_id).paced
        if paced:
            self.observe_step(global_steps)
        sampleable: set[str] = set()
        blocked: list[str] = []
        while True:
            result = None
            with self._lock:
                reasons, evicted, items = self._eviction_pass(global_steps, partition_id, acc)
                if not evicted:
                    sampleable = self._sampleable(partition_id, reasons)
                    blocked = self._blocked_by_wait(global_steps, partition_id)
                    if paced:
                        self._complete_ready(partition_id, sampleable)
                    if len(sampleable) >= count and not blocked:
                        if not take:
                            return sampleable, acc, None
                        chosen = self._choose(global_steps, partition_id, sampleable, count)
                        if chosen is not None:
                            keys, tags = self._take_groups(partition_id, chosen, items)
                            result = sampleable, acc, self._finish(global_steps, partition_id, keys, tags, acc)
            if paced:  # a take or an eviction may have made room: let the manager start what now fits
                LINK.release()
            if result is not None:
                return result
            if evicted:
                self._refill(partition_id, len(evicted))
                continue
            if time.monotonic() >= deadline:
                why = self._why_waiting(partition_id, sampleable, blocked)
                raise self._timeout(call, global_steps, partition_id, count, why)
            backoff = self._pause(partition_id, backoff, deadline)

    def _choose(self, global_steps: int, partition_id: str, sampleable: set[str], count: int) -> Optional[list[str]]:
        """The groups to hand out now: the oldest sampleable, or under pace what the core's gated take gives."""
        if self._book(partition_id).paced:
            return self._take_paced(partition_id, global_steps, count)
        chosen = self._oldest(partition_id, sampleable, count)
        self._check_fresh(global_steps, partition_id, chosen)
        return chosen

    def _why_waiting(self, partition_id: str, sampleable: set[str], blocked: list[str]) -> str:
        if blocked:
            return f"in-flight prompts at the staleness threshold under wait: {sorted(blocked)[:8]}"
        book = self._book(partition_id)
        why = f"{len(sampleable)} sampleable; {self._held_summary(partition_id)}"
        if book.paced:
            awaiting = self.ledger(partition_id)["awaiting_admission"]
            why += f"; pace: {book.waiting_for or 'nothing ready'}; {awaiting} prompts await admission"
        return why

    def _check_fresh(self, global_steps: int, partition_id: str, chosen: list[str]) -> None:
        """Under drop, a selected group past the threshold is a bug here (verl asserts the same)."""
        if partition_id == VAL or self.max_off_policy_strategy != "drop" or self.max_off_policy_threshold is None:
            return
        spans = [global_steps - self._age_stamp(partition_id, u) + 1 for u in chosen]
        if any(span > self.max_off_policy_threshold for span in spans):
            raise RuntimeError(
                f"pyfast_buffer: drop strategy selected stale prompts: spans={spans}, "
                f"threshold={self.max_off_policy_threshold}"
            )

    def _sample_async(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        self._check_call(global_steps, partition_id, batch_size, "batch_size")
        _, _, result = self._wait(global_steps, partition_id, batch_size, take=True, call="sample")
        assert result is not None
        return result


class ReplayBufferAsync(ReplayBuffer):
    """verl's async replay buffer: stale (``drop``), failed and DAPO-filtered groups are evicted before
    selection and ``refill_fn`` is asked for exactly as many; ``wait`` blocks while an in-flight prompt
    has ``global_steps - step + 1 >= max_off_policy_threshold``. Same arguments as ``ReplayBuffer``."""

    _ON_POLICY: Optional[bool] = False


class FastReplayBuffer(ReplayBufferAsync):
    """The name for ``custom_sampler.name``: verl's sync buffer when ``trainer_mode == "sync"``, else its
    async buffer (verl's own choice). Same arguments as ``ReplayBuffer``."""

    _ON_POLICY = None
