"""verl's ``trainer.v1`` replay buffers over pyfast_buffer: ``ReplayBuffer``, ``ReplayBufferAsync`` and
``FastReplayBuffer``.

Point verl at this file (``FastReplayBuffer`` acts as verl's sync or async buffer by ``trainer_mode``,
as verl itself chooses)::

    trainer.v1.sampler.custom_sampler.path=$(python -c "import pyfast_buffer.integrations.verl as m; print(m.__file__)")
    trainer.v1.sampler.custom_sampler.name=FastReplayBuffer

The semantics are verl's (main branch, 2026-08): groups are evicted before selection for staleness
(async ``drop``), for failure (async, or sync with ``sync_refill_failed_groups``) and by DAPO group
filtering; ``refill_fn(k)`` asks the trainer for exactly the ``k`` prompts evicted; ``wait`` blocks
while an in-flight prompt has reached the threshold; the ``val`` partition never evicts. The metrics
dict carries verl's keys only (our ledger goes to the ``pyfast_buffer.verl`` log, and into the dict
with ``sampler_kwargs.ledger_metrics: true``). Where verl differs, see docs/verl.md.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any, Callable

try:
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    # ModuleNotFoundError (an ImportError): "a dependency is missing", which pytest.importorskip and
    # callers probing optional extras treat as absent rather than broken.
    raise ModuleNotFoundError(
        "pyfast_buffer.integrations.verl needs TransferQueue; install it with: pip install 'pyfast_buffer[verl]'",
        name=exc.name,
    ) from exc

from pyfast_buffer.integrations import _verl_options as options
from pyfast_buffer.integrations._verl_options import VerlConfigError
from pyfast_buffer.integrations._verl_state import VerlState

__all__ = [
    "DAPO_FILTERED_REWARD_COUNTS_KEY",
    "LEDGER_PREFIX",
    "FastReplayBuffer",
    "ReplayBuffer",
    "ReplayBufferAsync",
    "VerlConfigError",
]

logger = logging.getLogger("pyfast_buffer.verl")  # under the package's "pyfast_buffer" logger

DAPO_FILTERED_REWARD_COUNTS_KEY = "_dapo_filtered_reward_counts"  # verl's name; a dict {metric value: groups}
LEDGER_PREFIX = "pyfast_buffer"  # ledger metrics: {training|validation}/pyfast_buffer/<counter>
VAL = "val"  # verl's validation partition: never evicts

Reasons = tuple[set[str], set[str], set[str], Counter]  # (stale, DAPO-filtered, failed, filtered value counts)


def metrics_prefix(partition_id: str) -> str:
    """verl reports the ``train`` partition under ``training/`` and every other under ``validation/``."""
    return "training" if partition_id == "train" else "validation"


def _accumulate_eviction_metrics(acc: dict, new: dict, stale_count: int) -> None:
    """Adds one eviction pass's metrics to ``acc``: counts add, value counts merge, and the staleness
    mean stays a mean over every stale group (weighted by ``stale_count``, this pass's stale groups)."""
    count_key = next((k for k in new if k.endswith("/off_policy/evicted_samples")), None)
    before = acc.get(count_key, 0) if count_key else 0
    for key, value in new.items():
        if key.endswith("/evicted_samples_staleness/mean"):
            total = before + stale_count
            acc[key] = (acc.get(key, 0.0) * before + value * stale_count) / total if total else value
        elif key.endswith("/evicted_samples_staleness/max"):
            acc[key] = max(acc.get(key, value), value)
        elif key.endswith("/evicted_samples_staleness/min"):
            acc[key] = min(acc.get(key, value), value)
        elif key == DAPO_FILTERED_REWARD_COUNTS_KEY:
            merged = Counter(acc.get(key, {}))
            merged.update(value)
            acc[key] = dict(merged)
        else:
            acc[key] = acc.get(key, 0) + value


def _reward_value(extra_fields: Any, metric: str) -> float | None:
    extra_fields = getattr(extra_fields, "data", extra_fields)  # TransferQueue may wrap non-tensor values
    info = extra_fields.get("reward_extra_info", {}) if hasattr(extra_fields, "get") else {}
    return float(info[metric]) if hasattr(info, "get") and metric in info else None


class ReplayBuffer(VerlState):
    """verl's sync (on-policy) replay buffer: ``max_off_policy_strategy`` is a no-op.

    Failed groups stay sampleable (verl pads their missing trajectories) unless
    ``sync_refill_failed_groups``, which evicts failed groups with no trajectory and refills them.
    With ``filter_groups_metric`` (DAPO), each filtered group earns two refill credits, dispatched in
    multiples of ``gen_batch_size`` while pending + running stays under
    ``max_inflight_gen_batches * train_batch_size``; once a batch is sampleable the in-flight prompts
    are drained and the surplus discarded.

    Args are verl's. ``sampler_kwargs`` may also carry ``filter_groups_metric``,
    ``sync_refill_failed_groups``, ``train_batch_size``, ``gen_batch_size``, ``max_inflight_gen_batches``
    (verl passes these to its own buffer only), ``timeout`` (s, default 600: a sample that waits longer
    raises TimeoutError), ``poll_backoff_max`` (s, cap of our poll backoff, default 0.05), ``capacity``
    (largest batch_size, default 65536) and ``ledger_metrics`` (bool). ``poll_interval`` stays verl's
    value (its separate_async trainer reads it to tell an idle step).
    """

    _ON_POLICY: bool | None = True  # None: decided by trainer_mode (FastReplayBuffer)

    def __init__(
        self,
        trainer_mode: str,
        trainer_config: Any,
        max_off_policy_threshold: int,
        max_off_policy_strategy: str,
        sampler_kwargs: Any = None,
        poll_interval: float = 2.0,
        refill_fn: Callable[[int], Any] | None = None,
        filter_groups_metric: str | None = None,
        train_batch_size: int | None = None,
        gen_batch_size: int | None = None,
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
        self._init_state(opts.capacity)

    # ---- eviction (verl's three reasons) ---------------------------------------------------------
    def _stale_groups(self, global_steps: int, partition_id: str) -> set[str]:
        """Finished groups with ``global_steps - prompt_step + 1 > threshold`` (async ``drop`` only)."""
        if self.on_policy or partition_id == VAL or self.max_off_policy_strategy != "drop":
            return set()
        cutoff = global_steps + 1 - self.max_off_policy_threshold  # stale iff prompt_step < cutoff
        finished = self.finished_keys[partition_id]
        stale = set()
        for step, uid in self._book(partition_id).order:  # sorted by step: the stale ones come first
            if step >= cutoff:
                break
            if uid in finished:
                stale.add(uid)
        return stale

    def _dapo_filtered_keys(self, partition_id: str) -> tuple[set[str], Counter]:
        """Finished groups whose ``filter_groups_metric`` is the same on every (>= 2) trajectory, and a
        count of the groups per shared value. Each group is read once: finished groups never change."""
        metric = self.filter_groups_metric
        if partition_id == VAL or metric is None:
            return set(), Counter()
        finished = self.finished_keys[partition_id]
        cache = self._dapo_classification_cache[partition_id]
        for uid in cache.keys() - finished:
            del cache[uid]
        fresh = finished - cache.keys()
        keys = self._group_keys(partition_id, fresh)
        values: dict[str, list[float]] = {uid: [] for uid in fresh}
        missing = set(fresh) - {key.split("_", 1)[0] for key in keys}
        if keys:
            data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["extra_fields"])
            for key, extra in zip(keys, list(data["extra_fields"]), strict=True):
                value = _reward_value(extra, metric)
                if value is None:
                    missing.add(key.split("_", 1)[0])
                else:
                    values[key.split("_", 1)[0]].append(value)
        if missing:
            raise RuntimeError(
                f"Finished groups are missing DAPO metric {metric!r} in "
                f"extra_fields.reward_extra_info: {sorted(missing)[:5]}; the reward function must "
                f"write it, or unset filter_groups_metric"
            )
        for uid in fresh:
            group = values[uid]
            cache[uid] = group[0] if len(group) > 1 and all(v == group[0] for v in group) else None
        filtered = {uid: value for uid, value in cache.items() if value is not None}
        return set(filtered), Counter(filtered.values())

    def _failed_groups(self, partition_id: str) -> set[str]:
        """Async: every failed group. Sync: failed groups without a trajectory, with sync_refill_failed_groups."""
        failure = self.failure_keys[partition_id]
        if not self.on_policy:
            return set(failure)
        if not self.sync_refill_failed_groups:
            return set()
        return {uid for uid in failure if not self._has_trajectories(partition_id, uid)}

    def _terminal_eviction_reasons(self, global_steps: int, partition_id: str) -> Reasons:
        """(stale, DAPO-filtered, failed, filtered value counts) of one snapshot; the sets may overlap."""
        if partition_id == VAL:
            return set(), set(), set(), Counter()
        stale = self._stale_groups(global_steps, partition_id)
        filtered, counts = self._dapo_filtered_keys(partition_id)
        return stale, filtered, self._failed_groups(partition_id), counts

    def _sampleable(self, partition_id: str, reasons: Reasons) -> set[str]:
        stale, filtered, failed, _ = reasons
        return (self.finished_keys[partition_id] | self.failure_keys[partition_id]) - (stale | filtered | failed)

    def _evict_terminal_groups(
        self, global_steps: int, partition_id: str, eviction_reasons: Reasons
    ) -> tuple[set[str], int, int, dict]:
        """Evicts the union of the reasons once; returns (evicted uids, stale count, filtered count, verl's metrics)."""
        stale, filtered, failed, counts = eviction_reasons
        evicted = stale | filtered | failed
        if not evicted:
            return set(), 0, 0, {}
        prefix = metrics_prefix(partition_id)
        metrics: dict = {}
        if stale:
            steps = self.prompt_global_steps[partition_id]
            spans = [float(global_steps - steps.get(uid, global_steps) + 1) for uid in stale]
            metrics[f"{prefix}/off_policy/evicted_samples"] = len(stale)
            metrics[f"{prefix}/off_policy/evicted_samples_staleness/mean"] = sum(spans) / len(spans)
            metrics[f"{prefix}/off_policy/evicted_samples_staleness/max"] = max(spans)
            metrics[f"{prefix}/off_policy/evicted_samples_staleness/min"] = min(spans)
        if filtered:
            metrics[f"{prefix}/filter_groups/evicted_samples"] = len(filtered)
            metrics[DAPO_FILTERED_REWARD_COUNTS_KEY] = dict(counts)
        if failed:
            metrics[f"{prefix}/rollout_failure/evicted_samples"] = len(failed)
        ledger = self._book(partition_id).ledger
        ledger["evicted_stale"] += len(stale)
        ledger["evicted_filtered"] += len(filtered)
        ledger["evicted_failure"] += len(failed)
        self._clear_groups(partition_id, evicted)
        logger.info(
            "evicted %d groups from partition %s (stale %d, filtered %d, failed %d)",
            len(evicted),
            partition_id,
            len(stale),
            len(filtered),
            len(failed),
        )
        return evicted, len(stale), len(filtered), metrics

    # ---- one poll ------------------------------------------------------------------------------
    def _eviction_pass(self, global_steps: int, partition_id: str, acc: dict) -> tuple[Reasons, set[str], dict]:
        """List, evict and accumulate the metrics (the caller holds the lock); returns (reasons, evicted, listing)."""
        items = self._sync_metadata_from_transfer_queue(partition_id)[partition_id]
        reasons = self._terminal_eviction_reasons(global_steps, partition_id)
        evicted, stale_count, _, metrics = self._evict_terminal_groups(global_steps, partition_id, reasons)
        if evicted:
            _accumulate_eviction_metrics(acc, metrics, stale_count)
        return reasons, evicted, items

    def _refill(self, partition_id: str, count: int) -> None:
        """Asks ``refill_fn`` for ``count`` prompts and books the answer; an exception is logged and raised."""
        with self._lock:  # the call itself runs unlocked: it may take long, or call back into this sampler
            ledger = self._book(partition_id).ledger
            if self.refill_fn is None:
                ledger["unrefilled"] += count
                return
            ledger["refill_calls"] += 1
            ledger["refill_requested"] += count
        try:
            answer = self.refill_fn(count)
        except BaseException:
            with self._lock:
                ledger["refill_failed"] += count
            logger.error(
                "refill_fn(%d) raised for partition %s; %d evicted groups are not replaced", count, partition_id, count
            )
            raise
        # verl's contract: refill_fn submits exactly ``count``; an int answer is what it submitted.
        delivered = count if not isinstance(answer, int) or isinstance(answer, bool) else max(answer, 0)
        with self._lock:
            ledger["refill_delivered"] += min(delivered, count)
            ledger["refill_short"] += max(count - delivered, 0)
        if delivered < count:
            logger.warning("refill_fn(%d) submitted only %d prompts for partition %s", count, delivered, partition_id)
        elif delivered > count:
            logger.warning("refill_fn(%d) submitted %d prompts for partition %s", count, delivered, partition_id)

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
        if self.on_policy or self.max_off_policy_strategy != "wait":
            return []
        steps = self.prompt_global_steps[partition_id]
        limit = global_steps + 1 - self.max_off_policy_threshold  # blocking iff prompt_step <= limit
        return [u for u in self.pending_keys[partition_id] | self.running_keys[partition_id] if steps[u] <= limit]

    def _wait(
        self, global_steps: int, partition_id: str, count: int, take: bool, call: str
    ) -> tuple[set[str], dict, tuple[KVBatchMeta, dict] | None]:
        acc: dict = {}
        deadline, backoff = time.monotonic() + self.timeout, 0.001
        while True:
            with self._lock:
                reasons, evicted, items = self._eviction_pass(global_steps, partition_id, acc)
                if not evicted:
                    sampleable = self._sampleable(partition_id, reasons)
                    blocked = self._blocked_by_wait(global_steps, partition_id)
                    if len(sampleable) >= count and not blocked:
                        if not take:
                            return sampleable, acc, None
                        chosen = self._oldest(partition_id, sampleable, count)
                        self._check_fresh(global_steps, partition_id, chosen)
                        keys, tags = self._take_groups(partition_id, chosen, items)
                        return sampleable, acc, self._finish(global_steps, partition_id, keys, tags, acc)
            if evicted:
                self._refill(partition_id, len(evicted))
                continue
            if time.monotonic() >= deadline:
                why = (
                    f"in-flight prompts at the staleness threshold under wait: {sorted(blocked)[:8]}"
                    if blocked
                    else f"{len(sampleable)} sampleable; {self._held_summary(partition_id)}"
                )
                raise self._timeout(call, global_steps, partition_id, count, why)
            backoff = self._pause(partition_id, backoff, deadline)

    def _check_fresh(self, global_steps: int, partition_id: str, chosen: list[str]) -> None:
        """Under drop, a selected group past the threshold is a bug here (verl asserts the same)."""
        if partition_id == VAL or self.max_off_policy_strategy != "drop":
            return
        steps = self.prompt_global_steps[partition_id]
        spans = [global_steps - steps[u] + 1 for u in chosen]
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

    _ON_POLICY: bool | None = False


class FastReplayBuffer(ReplayBufferAsync):
    """The name for ``custom_sampler.name``: verl's sync buffer when ``trainer_mode == "sync"``, else its
    async buffer (verl's own choice). Same arguments as ``ReplayBuffer``."""

    _ON_POLICY = None
