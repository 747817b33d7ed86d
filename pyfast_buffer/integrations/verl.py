"""``FastReplayBuffer``: a drop-in for verl's ``trainer.v1`` ReplayBuffer, backed by the native core.

Point verl at this file::

    trainer.v1.sampler.custom_sampler.path=$(python -c "import pyfast_buffer.integrations.verl as m; print(m.__file__)")
    trainer.v1.sampler.custom_sampler.name=FastReplayBuffer

It keeps verl's constructor, ``sample(global_steps, partition_id, batch_size) -> (KVBatchMeta,
metrics)``, tags and metric names, and differs where verl's ReplayBuffer is wrong or slow: stale
groups are dropped before selection, waits poll briefly under ``sampler_kwargs.timeout``, concurrent
calls never share a prompt, bad configs and tags are ValueErrors at their source, and each
partition is listed and validated on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

try:
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "pyfast_buffer.integrations.verl needs TransferQueue; install it with: pip install 'pyfast_buffer[verl]'"
    ) from exc

from pyfast_buffer import config_from_verl
from pyfast_buffer.batch import metric_key
from pyfast_buffer._args import MAX_TIMEOUT
from pyfast_buffer.integrations._verl_mirror import PartitionMirror, Taken

logger = logging.getLogger("pyfast_buffer.verl")  # under the package's "pyfast_buffer" logger

DEFAULT_TIMEOUT_S = 600.0  # verl waits forever (verl issue #7155); a stuck rollout should fail a run, not hang it
DEFAULT_POLL_CAP_S = 0.05  # TransferQueue has no change notification, so poll: 1 ms, doubling, capped here
LEDGER_PREFIX = "pyfast_buffer"


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    """Reads ``key`` from a dict or an omegaconf DictConfig (both have ``get``); None counts as absent."""
    if cfg is None:
        return default
    value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if value is None else value


def _seconds(value: Any, name: str, maximum: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= maximum:
        raise ValueError(f"sampler_kwargs.{name}={value!r} must be a number of seconds in (0, {maximum:g}]")
    return float(value)


def metrics_prefix(partition_id: str) -> str:
    """verl reports the ``train`` partition under ``training/`` and every other under ``validation/``."""
    return "training" if partition_id == "train" else "validation"


class FastReplayBuffer:
    """verl's ReplayBuffer interface over ``StalenessBuffer``; see the module docstring.

    Args:
        trainer_mode: verl's trainer mode (kept for interface parity; the strategy decides).
        trainer_config: ``trainer.v1.<mode>``; ``parameter_sync_step`` is read from it (1 if absent).
        max_off_policy_threshold: int >= 1; staleness ``(g - s + 1) / parameter_sync_step`` above it is stale.
        max_off_policy_strategy: ``"drop"`` or ``"wait"``.
        sampler_kwargs: ``timeout`` (s, default 600), ``poll_interval`` (s, cap of the poll backoff,
            default 0.05) and ``capacity`` (ready prompts held per partition, default 65536).
        poll_interval: verl's argument; used as the poll cap only when below the default cap.
    """

    def __init__(self, trainer_mode: str, trainer_config: Any, max_off_policy_threshold: int,
                 max_off_policy_strategy: str, sampler_kwargs: Any = None, poll_interval: float = 2.0,
                 **kwargs: Any) -> None:
        self.trainer_mode = trainer_mode
        self.trainer_config = trainer_config
        self.max_off_policy_threshold = max_off_policy_threshold
        self.max_off_policy_strategy = max_off_policy_strategy
        self.sampler_kwargs = sampler_kwargs
        self.extra_kwargs = kwargs  # newer verl passes refill_fn etc.; accepted, not used
        sampler_cfg = {"max_off_policy_threshold": max_off_policy_threshold,
                       "max_off_policy_strategy": max_off_policy_strategy,
                       "sampler_kwargs": sampler_kwargs}
        self._buffer_kwargs = config_from_verl(sampler_cfg, trainer_config)  # raises on bad threshold/sync/strategy
        self.parameter_sync_step = self._buffer_kwargs["parameter_sync_step"]
        self.timeout = _seconds(_get(sampler_kwargs, "timeout", DEFAULT_TIMEOUT_S), "timeout", MAX_TIMEOUT)
        cap = _get(sampler_kwargs, "poll_interval", min(poll_interval, DEFAULT_POLL_CAP_S))
        self.poll_interval = _seconds(cap, "poll_interval", 1.0)
        self._mirrors: Dict[str, PartitionMirror] = {}
        self._mirrors_lock = threading.Lock()

    # ---- verl's interface --------------------------------------------------------------------
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> Tuple[KVBatchMeta, dict]:
        """Returns ``batch_size`` whole prompt groups of ``partition_id`` (oldest ``global_steps`` first) and metrics.

        Blocks until the strategy allows a full batch, polling TransferQueue (see ``_pause``), and
        raises TimeoutError after ``sampler_kwargs.timeout`` naming the prompts it waited on.
        """
        self._check_sample_args(global_steps, partition_id, batch_size)
        mirror = self._mirror(partition_id)
        start = time.monotonic()
        deadline, backoff, polls = start + self.timeout, 0.001, 0
        drop_metrics: dict = {}
        while True:
            polls += 1
            taken, why = self._poll(mirror, global_steps, batch_size, drop_metrics)
            if taken is not None:
                break
            if time.monotonic() >= deadline:
                raise self._timeout_error(mirror, global_steps, partition_id, batch_size, why)
            backoff = self._pause(mirror, backoff, deadline)
        metrics = dict(drop_metrics)
        metrics.update(self._ledger_metrics(mirror, partition_id, taken.batch.metrics, time.monotonic() - start, polls))
        return KVBatchMeta(partition_id=partition_id, keys=taken.keys, tags=taken.tags), metrics

    def _sync_metadata_from_transfer_queue(self, partition_id: Optional[str] = None) -> None:
        """Refreshes one partition, or every partition TransferQueue lists, from one ``kv_list``.

        Each partition is refreshed on its own: a bad tag raises a ValueError naming its partition
        after the others were refreshed, so it never hides another partition's data. A refresh
        only reads: it clears nothing in TransferQueue.
        """
        if partition_id is not None:
            mirror = self._mirror(partition_id)
            with mirror.poll_lock:
                items = self._list(mirror)
                with mirror.lock:
                    mirror.refresh(items)
            return
        with self._mirrors_lock:
            known = sorted(self._mirrors.items())
        errors: List[str] = []
        held = [m for _, m in known]
        for m in held:  # always in partition order: no deadlock between two such calls
            m.poll_lock.acquire()
        try:
            listing = tq.kv_list() or {}
            for pid, items in sorted(listing.items()):
                with self._mirrors_lock:
                    mirror = self._mirrors.get(pid)
                    if mirror is None:  # new here: nobody can poll it before this answer is applied
                        mirror = self._mirrors[pid] = PartitionMirror(pid, self._buffer_kwargs)
                        mirror.poll_lock.acquire()
                        held.append(mirror)
                    elif mirror not in held:
                        continue  # created by another call after this listing began: it may hold a newer answer
                try:
                    with mirror.lock:
                        mirror.refresh(items or {})
                except ValueError as exc:
                    errors.append(str(exc))
        finally:
            for m in held:
                m.poll_lock.release()
        if errors:
            raise ValueError("; ".join(errors))

    def _has_enough_samples(self, global_steps: int, partition_id: str, batch_size: int) -> bool:
        """Whether ``sample`` could return a full batch now, on the last refreshed view."""
        mirror = self._mirror(partition_id)
        with mirror.lock:
            if mirror.strategy == "wait" and mirror.waited_on(global_steps):
                return False
            return len(mirror.sampleable(global_steps)) >= batch_size

    def _drop_max_off_policy_samples(self, global_steps: int, partition_id: str,
                                     batch: Optional[KVBatchMeta] = None) -> Tuple[Optional[KVBatchMeta], dict]:
        """Under drop, removes stale groups from the buffer and TransferQueue; returns (batch, metrics).

        Without ``batch`` it drops every stale ready group (what ``sample`` does before selecting).
        With a ``KVBatchMeta`` it filters that batch the way verl does, by each trajectory tag's
        ``global_steps`` (a tag without it is a ValueError), and clears the stale keys.
        """
        if batch is not None:
            return self._filter_batch(global_steps, partition_id, batch)
        mirror = self._mirror(partition_id)
        with mirror.poll_lock:
            with mirror.lock:
                dropped = mirror.drop_stale(global_steps)
            return None, self._clear_dropped(partition_id, global_steps, dropped)

    def get_sampleable_count(self, global_steps: int, partition_id: str) -> int:
        """Refreshes ``partition_id``, drops stale groups and returns how many groups are ready."""
        mirror = self._mirror(partition_id)
        self._poll(mirror, global_steps, None, {})
        with mirror.lock:
            return len(mirror.sampleable(global_steps))

    def wait_for_sampleable(self, global_steps: int, partition_id: str, target_count: int) -> Tuple[set, dict]:
        """Waits (under the timeout) until ``target_count`` groups are sampleable; returns (uids, drop metrics)."""
        self._check_sample_args(global_steps, partition_id, target_count)
        mirror = self._mirror(partition_id)
        deadline, backoff, metrics = time.monotonic() + self.timeout, 0.001, {}
        while True:
            self._poll(mirror, global_steps, None, metrics)
            with mirror.lock:
                ready = mirror.sampleable(global_steps)
                blocked = mirror.strategy == "wait" and bool(mirror.waited_on(global_steps))
            if len(ready) >= target_count and not blocked:
                return set(ready), metrics
            if time.monotonic() >= deadline:
                raise self._timeout_error(mirror, global_steps, partition_id, target_count, None)
            backoff = self._pause(mirror, backoff, deadline)

    # ---- verl's attribute views, read from the last refresh ------------------------------------
    def _mirror_list(self) -> List[Tuple[str, PartitionMirror]]:
        with self._mirrors_lock:
            return list(self._mirrors.items())

    def _status_view(self, status: str) -> Dict[str, set]:
        return {pid: m.keys_with_status(status) for pid, m in self._mirror_list()}

    pending_keys = property(lambda self: self._status_view("pending"))
    running_keys = property(lambda self: self._status_view("running"))
    finished_keys = property(lambda self: self._status_view("finished"))
    failure_keys = property(lambda self: self._status_view("failure"))

    @property
    def prompt_global_steps(self) -> Dict[str, Dict[str, int]]:
        return {pid: {u: t.get("global_steps") for u, t in m.prompt_tags().items()} for pid, m in self._mirror_list()}

    @property
    def partitions(self) -> Dict[str, Dict[str, dict]]:
        return {pid: {k: t for k, t in m.items.items() if not t.get("is_prompt", False)}
                for pid, m in self._mirror_list()}

    def ledger(self, partition_id: str) -> Dict[str, int]:
        """The partition's buffer ledger (counts prompt groups: one ring entry per prompt)."""
        return self._mirror(partition_id).buf.ledger()

    # ---- internals ------------------------------------------------------------------------------
    def _check_sample_args(self, global_steps: Any, partition_id: Any, batch_size: Any) -> None:
        if isinstance(global_steps, bool) or not isinstance(global_steps, int) or global_steps < 0:
            raise ValueError(f"global_steps={global_steps!r} must be an int >= 0 (the trainer's step)")
        if not isinstance(partition_id, str) or not partition_id:
            raise ValueError(f"partition_id={partition_id!r} must be a non-empty str such as 'train' or 'val'")
        capacity = self._buffer_kwargs["capacity"]
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 0 < batch_size <= capacity:
            raise ValueError(f"batch_size={batch_size!r} must be an int in [1, {capacity}] (prompts per batch; "
                             "raise sampler_kwargs.capacity for larger batches)")

    def _mirror(self, partition_id: str) -> PartitionMirror:
        with self._mirrors_lock:
            mirror = self._mirrors.get(partition_id)
            if mirror is None:
                mirror = self._mirrors[partition_id] = PartitionMirror(partition_id, self._buffer_kwargs)
            return mirror

    def _list(self, mirror: PartitionMirror) -> Dict[str, dict]:
        """One ``kv_list`` of the partition (the caller holds its ``poll_lock``); times it to pace polling."""
        t0 = time.monotonic()
        items = (tq.kv_list(partition_id=mirror.partition_id) or {}).get(mirror.partition_id) or {}
        mirror.last_list_s = time.monotonic() - t0
        return items

    def _pause(self, mirror: PartitionMirror, backoff: float, deadline: float) -> float:
        """Sleeps between polls; returns the next backoff.

        The backoff starts at 1 ms and doubles up to ``poll_interval``; the pause is never shorter
        than the last ``kv_list`` took, so a waiting sampler keeps TransferQueue's controller busy
        at most about half the time (at 70k tags a listing takes ~165 ms, so it pauses >= 165 ms).
        """
        time.sleep(max(0.0, min(max(backoff, mirror.last_list_s), deadline - time.monotonic())))
        return min(backoff * 2, self.poll_interval)

    def _poll(self, mirror: PartitionMirror, global_steps: int, batch_size: Optional[int],
              drop_metrics: dict) -> Tuple[Optional[Taken], str]:
        """One list + refresh + drop + (optional) take + clear, serialised per partition by ``poll_lock``.

        Holding ``poll_lock`` from ``kv_list`` to ``kv_clear`` applies listings in the order they
        were made, so an older answer can never undo a newer one (resurrect a taken prompt, or fail
        an in-flight one); the take and its batch rows are built under the state lock.
        """
        taken, why = None, ""
        with mirror.poll_lock:
            items = self._list(mirror)
            with mirror.lock:
                mirror.refresh(items)
                dropped = mirror.drop_stale(global_steps)
                if batch_size is not None:
                    taken, why = mirror.take(batch_size, global_steps)
            _accumulate(drop_metrics, self._clear_dropped(mirror.partition_id, global_steps, dropped))
            if taken is not None:  # verl's contract: sampled prompt keys are cleared
                self._clear(mirror.partition_id, taken.uids, "sampled prompt")
        return taken, why

    def _clear(self, partition_id: str, keys: List[str], what: str) -> None:
        """``kv_clear`` that never loses a batch: retried once, then logged; the keys stay in TransferQueue."""
        if not keys:
            return
        for attempt in (1, 2):
            try:
                tq.kv_clear(keys=keys, partition_id=partition_id)
                return
            except Exception as exc:  # noqa: BLE001 - the groups are already consumed; report, do not raise
                if attempt == 2:
                    logger.error("kv_clear of %d %s keys in partition %s failed twice (%r); they stay in "
                                 "TransferQueue (this sampler ignores them) until cleared", len(keys), what,
                                 partition_id, exc)

    def _clear_dropped(self, partition_id: str, global_steps: int, dropped: list) -> dict:
        if not dropped:
            return {}
        self._clear(partition_id, [k for uid, _, traj in dropped for k in [uid, *traj]], "dropped stale")
        spans = [(global_steps - step + 1) / self.parameter_sync_step for _, step, traj in dropped for _ in traj]
        logger.warning("dropped %d stale groups (%d trajectories) from partition %s",
                       len(dropped), len(spans), partition_id)
        return _drop_metrics(partition_id, spans) if spans else {}

    def _filter_batch(self, global_steps: int, partition_id: str, batch: KVBatchMeta) -> Tuple[KVBatchMeta, dict]:
        from pyfast_buffer import sample_step_from_tag

        if self.max_off_policy_strategy != "drop":
            return batch, {}
        limit = self._buffer_kwargs["max_age"]
        kept, stale = [], []
        for key, tag in zip(batch.keys, batch.tags):
            step = sample_step_from_tag(tag)
            (stale if global_steps - step > limit else kept).append((key, tag, step))
        if not stale:
            return batch, {}
        self._clear(batch.partition_id, [k for k, _, _ in stale], "dropped stale")
        spans = [(global_steps - s + 1) / self.parameter_sync_step for _, _, s in stale]
        out = KVBatchMeta(partition_id=batch.partition_id, keys=[k for k, _, _ in kept], tags=[t for _, t, _ in kept])
        return out, _drop_metrics(partition_id, spans)

    def _ledger_metrics(self, mirror: PartitionMirror, partition_id: str, take_metrics: dict,
                        wait_s: float, polls: int) -> dict:
        prefix = f"{metrics_prefix(partition_id)}/{LEDGER_PREFIX}"
        out = {f"{prefix}/{k}": v for k, v in mirror.buf.ledger().items()}
        for k in ("age_mean", "age_max"):
            out[f"{prefix}/{k}"] = take_metrics[metric_key(k)]
        out[f"{prefix}/sample_wait_s"] = wait_s
        out[f"{prefix}/polls"] = polls
        out[f"{prefix}/ready"] = mirror.ready_count()  # finished groups still held (in flight for the core until taken)
        return out

    def _timeout_error(self, mirror: PartitionMirror, global_steps: int, partition_id: str,
                       wanted: int, cause: Any) -> TimeoutError:
        with mirror.lock:
            waited = mirror.waited_on(global_steps)
            ready = len(mirror.sampleable(global_steps))
        shown = ", ".join(waited[:8]) + (f" and {len(waited) - 8} more" if len(waited) > 8 else "")
        why = (f"in-flight prompts at the staleness threshold: {shown}" if mirror.strategy == "wait" and waited
               else f"{ready} of {wanted} groups ready; in-flight prompts waited on: {shown or 'none'}")
        return TimeoutError(
            f"sample(global_steps={global_steps}, partition_id={partition_id!r}) timed out after "
            f"{self.timeout:g} s under {mirror.strategy}: {why}. Check the rollout workers, or raise "
            f"trainer.v1.sampler.sampler_kwargs.timeout" + (f" ({cause})" if cause else "")
        )


def _drop_metrics(partition_id: str, spans: List[float]) -> dict:
    prefix = f"{metrics_prefix(partition_id)}/off_policy"
    return {
        f"{prefix}/dropped_samples": len(spans),
        f"{prefix}/dropped_samples_staleness/mean": sum(spans) / len(spans),
        f"{prefix}/dropped_samples_staleness/max": max(spans),
        f"{prefix}/dropped_samples_staleness/min": min(spans),
    }


def _accumulate(acc: dict, new: dict) -> None:
    """Merges one poll's drop metrics: counts add, the mean is weighted by count, max/min combine."""
    if not new:
        return
    count_key = next(k for k in new if k.endswith("/dropped_samples"))
    before, added = acc.get(count_key, 0), new[count_key]
    for key, value in new.items():
        if key.endswith("/mean"):
            acc[key] = (acc.get(key, 0.0) * before + value * added) / (before + added)
        elif key.endswith("/max"):
            acc[key] = max(acc.get(key, value), value)
        elif key.endswith("/min"):
            acc[key] = min(acc.get(key, value), value)
        else:
            acc[key] = acc.get(key, 0) + value
