"""A real TransferQueue on a local Ray instance, and verl's tag layout, for the verl tests and bench.

Ray starts once per module (about 20 s here: ray.init ~5 s, tq.init ~13 s). ``num_cpus=8``
because TransferQueue's placement groups ask for more CPUs than a 2-core machine reports.
"""

from __future__ import annotations

import threading
import uuid
from contextlib import contextmanager

import pytest
import torch

ray = pytest.importorskip("ray", reason="the verl extra is not installed: pip install '.[verl]'")
tq = pytest.importorskip("transfer_queue", reason="the verl extra is not installed: pip install '.[verl]'")


@contextmanager
def running_transfer_queue():
    """Starts Ray (unless a caller already did) and TransferQueue; closes both afterwards."""
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    tq.init()
    try:
        yield tq
    finally:
        tq.close()
        if started_ray:
            ray.shutdown()


def new_partition() -> str:
    return f"test-{uuid.uuid4().hex}"


def new_uid() -> str:
    return uuid.uuid4().hex  # no "_": verl derives the uid as key.split("_")[0]


def put_prompt(partition_id: str, uid: str, status: str, global_steps: int) -> None:
    tq.kv_put(
        key=uid, partition_id=partition_id, tag={"is_prompt": True, "status": status, "global_steps": global_steps}
    )


def put_group(
    partition_id: str,
    status: str,
    global_steps: int = 0,
    sessions: int = 1,
    uid: str | None = None,
    rewards: list[float] | None = None,
) -> tuple[str, list[str]]:
    """Writes a prompt's trajectories, then its prompt tag (verl's order); returns (uid, trajectory keys).

    With ``rewards`` (one per session) each trajectory's value carries ``extra_fields.reward_extra_info.acc`` and
    ``rm_scores`` (the reward at the last token), the fields DAPO group filtering reads (``acc``, ``reward``).
    """
    uid = uid or new_uid()
    keys = [f"{uid}_{s}_0" for s in range(sessions)]
    tags = [{"is_prompt": False, "global_steps": global_steps, "seq_len": 3} for _ in keys]
    if rewards is not None:
        for key, tag, reward in zip(keys, tags, rewards, strict=True):
            tq.kv_put(
                key=key,
                partition_id=partition_id,
                tag=tag,
                fields={
                    "input_ids": torch.tensor([1, 2, 3]),
                    "rm_scores": torch.tensor([0.0, 0.0, float(reward)]),  # verl 0.9.1's canonical "reward"
                    "extra_fields": {"reward_extra_info": {"acc": float(reward)}},
                },
            )
    elif keys:
        tq.kv_batch_put(keys=keys, partition_id=partition_id, tags=tags)
    put_prompt(partition_id, uid, status, global_steps)
    return uid, keys


class Refiller:
    """A trainer's refill_fn: records each request and writes that many fresh finished groups."""

    def __init__(
        self, partition_id: str, global_steps: int, sessions: int = 1, rewards: list[float] | None = None
    ) -> None:
        self.partition_id, self.global_steps = partition_id, global_steps
        self.sessions, self.rewards = sessions, rewards
        self.calls: list[int] = []
        self.uids: list[str] = []

    def __call__(self, count: int) -> int:
        self.calls.append(count)
        for _ in range(count):
            uid, _ = put_group(self.partition_id, "finished", self.global_steps, self.sessions, rewards=self.rewards)
            self.uids.append(uid)
        return count


def put_prompts_bulk(partition_id: str, n: int, status: str, global_steps: int, sessions: int = 1) -> list[str]:
    """Writes ``n`` groups with two batched calls (trajectories, then prompt tags)."""
    uids = [new_uid() for _ in range(n)]
    keys = [f"{u}_{s}_0" for u in uids for s in range(sessions)]
    if keys:
        tq.kv_batch_put(
            keys=keys,
            partition_id=partition_id,
            tags=[{"is_prompt": False, "global_steps": global_steps} for _ in keys],
        )
    tq.kv_batch_put(
        keys=uids,
        partition_id=partition_id,
        tags=[{"is_prompt": True, "status": status, "global_steps": global_steps} for _ in uids],
    )
    return uids


def listed(partition_id: str) -> dict:
    return tq.kv_list(partition_id=partition_id).get(partition_id, {})


def clear_partition(partition_id: str) -> None:
    keys = list(listed(partition_id))
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition_id)


def uids_of(keys) -> set:
    return {k.split("_", 1)[0] for k in keys}


class Background(threading.Thread):
    """Runs ``fn`` in a thread and keeps its result or exception for the test to check."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as exc:
            self.error = exc

    def outcome(self, timeout: float = 30.0):
        self.join(timeout)
        assert not self.is_alive(), "background call did not finish"
        if self.error is not None:
            raise self.error
        return self.result
