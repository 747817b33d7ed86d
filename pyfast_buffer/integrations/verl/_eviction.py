"""verl's three eviction reasons (stale under ``drop``, DAPO-filtered, failed), one eviction pass, and refills.

A group's age is counted from its prompt's ``global_steps`` (verl's dispatch tag) or, with
``sampler_kwargs.age_from``, from the weight versions its trajectories were generated with (verl's agent loop
writes ``min_global_steps``/``max_global_steps`` on each trajectory tag; docs/verl.md, "Staleness from
generation versions").

Absolute imports only: verl may load the sampler package by file path, outside the package.
"""

from __future__ import annotations

import logging
from collections import Counter

import transfer_queue as tq

from pyfast_buffer.integrations.verl._metrics import (
    VAL,
    _accumulate_eviction_metrics,
    eviction_metrics,
    metric_field,
    metric_value,
    missing_metric_message,
)
from pyfast_buffer.integrations.verl._state import VerlState, uid_of

logger = logging.getLogger("pyfast_buffer.verl")

Reasons = tuple[set[str], set[str], set[str], Counter]  # (stale, DAPO-filtered, failed, filtered value counts)
#: The trajectory tag a generation-based age reads, by ``age_from``.
VERSION_TAG = {"generation_start": "min_global_steps", "generation_finish": "max_global_steps"}


class Eviction(VerlState):
    """The eviction half of the verl sampler (mixed into ``ReplayBuffer``; uses ``VerlState``'s views)."""

    def _age_stamp(self, partition_id: str, uid: str, default: int = 0) -> int:
        """The step a group's age counts from: its dispatch tag, or ``version + 1`` of the oldest (generation_start)
        or newest (generation_finish) weights its trajectories were generated with; the dispatch tag when its
        trajectories carry no version. ``version + 1`` is the step that version's weights serve: verl pushes the
        weights trained at step v as version v, and the prompts dispatched at step v + 1 are generated with them.
        ``default`` for a uid this sampler does not hold (verl's own helper tests pass such sets)."""
        step = self.prompt_global_steps[partition_id].get(uid, default)
        tag_name = VERSION_TAG.get(self.options.age_from)
        if tag_name is None:
            return step
        stamps = self._book(partition_id).age_stamps
        if uid not in stamps:
            part = self.partitions[partition_id]
            tagged = [part[key].get(tag_name) for key in self._group_keys(partition_id, [uid])]
            versions: list[int] = [v for v in tagged if isinstance(v, int) and not isinstance(v, bool)]
            stamps[uid] = min(versions) + 1 if versions else step
        return stamps[uid]

    def _stale_groups(self, global_steps: int, partition_id: str) -> set[str]:
        """Finished groups with ``global_steps - age_stamp + 1 > threshold`` (async ``drop`` with a threshold)."""
        if (
            self.on_policy
            or partition_id == VAL
            or self.max_off_policy_strategy != "drop"
            or self.max_off_policy_threshold is None
        ):
            return set()
        cutoff = global_steps + 1 - self.max_off_policy_threshold  # stale iff age stamp < cutoff
        finished = self.finished_keys[partition_id]
        if self.options.age_from != "dispatch":
            return {uid for uid in finished if self._age_stamp(partition_id, uid) < cutoff}
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
        missing = set(fresh) - {uid_of(key) for key in keys}
        if keys:
            field = metric_field(metric)
            data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=[field])
            for key, raw in zip(keys, list(data[field]), strict=True):
                value = metric_value(raw, metric)
                if value is None:
                    missing.add(uid_of(key))
                else:
                    values[uid_of(key)].append(value)
        if missing:
            raise RuntimeError(missing_metric_message(metric, list(missing)))
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
        """(stale, DAPO-filtered, failed, filtered value counts) of one snapshot; the sets may overlap.

        Under pace a finished group that reached TransferQueue without admission and did not fit the rule
        (``book.refused``) counts as stale: it could not be trained within the bound."""
        if partition_id == VAL:
            return set(), set(), set(), Counter()
        stale = self._stale_groups(global_steps, partition_id)
        book = self._book(partition_id)
        if book.paced:
            stale |= book.refused & self.finished_keys[partition_id]
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
        spans = [float(global_steps - self._age_stamp(partition_id, uid, global_steps) + 1) for uid in stale]
        metrics = eviction_metrics(partition_id, spans, len(filtered), counts, len(failed))
        book = self._book(partition_id)
        book.ledger["evicted_stale"] += len(stale)
        book.ledger["evicted_filtered"] += len(filtered)
        book.ledger["evicted_failure"] += len(failed)
        if book.paced and book.refused & evicted:
            book.ledger["evicted_unadmitted"] += len(book.refused & evicted)
            book.refused -= evicted
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
