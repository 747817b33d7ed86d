"""``StalenessQueue``: the ``rollout_buffer`` TRL's trainer drains, one sample per ``get``, taken from our buffer a
whole group at a time.

TRL's ``RolloutQueueDataset`` calls ``get(timeout=...)`` on the trainer's thread and checks each sample's staleness
against its ``model_version`` right after; our take has judged the group first, at the same version, so TRL's filter
finds nothing to drop. A group's samples are handed out back to back; when the trainer's planner may stop between
two of them for a weight sync, the worker's buffer runs one version tighter (``_options.Plan.margin``), so the rest
is still within ``max_age`` one version later. ``delivered_over_age`` counts any sample handed out past it anyway
(none is, by that rule; the tests check it stays 0).
"""

from __future__ import annotations

import queue
import time
from collections import deque
from typing import Any, Deque, Optional

from pyfast_buffer.released import RELEASE_REASONS

TAKE_SLICE_S = 1.0  # a waiting get wakes at least this often (a stop, a close, the deadline)


class StalenessQueue:
    """TRL's ``rollout_buffer`` over the worker's ``StalenessBuffer``: ``get(timeout)`` and ``qsize()``."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker
        self._staged: Deque[Any] = deque()  # the rest of the group being handed out

    def qsize(self) -> int:
        """Samples ready to train now: in the buffer (fresh or not yet judged) plus the rest of the current group."""
        worker = self._worker
        return len(worker._samples) + len(self._staged)

    def empty(self) -> bool:
        return self.qsize() == 0

    def put_nowait(self, item: Any) -> None:
        raise TypeError(
            "StalenessRolloutWorker.rollout_buffer is filled by the worker itself (groups enter through the buffer's "
            "dispatch and complete); nothing else may put samples into it"
        )

    put = put_nowait

    def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        """The next sample to train on; raises ``queue.Empty`` after ``timeout`` seconds (None: waits)."""
        if not self._staged:
            self._take(0.0 if not block else timeout)
        sample = self._staged.popleft()
        worker = self._worker
        if worker.model_version - sample.model_version > worker.max_age:
            worker.counts["delivered_over_age"] += 1
        worker.counts["samples_delivered"] += 1
        return sample

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def _take(self, timeout: Optional[float]) -> None:
        worker = self._worker
        buffer = worker.buffer
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = TAKE_SLICE_S if deadline is None else max(0.0, deadline - time.monotonic())
            step = worker.step()
            try:
                batch = buffer.take(worker.num_generations, step, timeout=min(left, TAKE_SLICE_S))
                break
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise queue.Empty from None
                if worker._error is not None:  # let the trainer's check_health raise it
                    raise queue.Empty from None
        trajectories = batch.traj_ids.tolist()
        with worker._lock:
            samples = [worker._samples.pop(t) for t in trajectories]
            stamped = {}
            for group in dict.fromkeys(s.group_id for s in samples):
                stamped[group] = worker._groups.pop(group)["step"]
                worker._ages.append(float(step - stamped[group]))
                worker.counts["groups_delivered"] += 1
            for sample in samples:  # in the trainer's version space, so that its staleness check is ours
                sample.model_version = stamped[sample.group_id] - worker._version_offset
            forget_released(worker)
        self._staged.extend(samples)


def forget_released(worker: Any) -> None:
    """Drops the samples of the groups the buffer let go (dropped stale or evicted), counting the groups."""
    released = worker.buffer.released()
    G = worker.num_generations
    for trajectory, reason in zip(released.ids.tolist(), released.reasons.tolist()):
        name = RELEASE_REASONS[reason]
        if name not in ("dropped_stale", "evicted"):
            continue
        if worker._samples.pop(trajectory, None) is None:
            continue
        group = trajectory // G
        if worker._groups.pop(group, None) is not None:
            worker.counts[f"groups_{name}"] += 1
