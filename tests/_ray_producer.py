"""The producer actor of the two-node cluster tests: a rollout worker pinned to one node that puts payloads.

Pickled by value (the workers do not import the tests), like the test modules that use it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Dict

import numpy as np
import ray

from pyfast_buffer.ray import RemoteBuffer

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PAYLOAD_WORDS = 16 * 1024  # 128 KiB of int64: above Ray's inline limit, so each payload is a store object


def payload(traj_id: int) -> np.ndarray:
    return np.full(PAYLOAD_WORDS, traj_id, np.int64)


@ray.remote(num_cpus=0, max_restarts=0)
class Producer:
    """A rollout worker pinned to one node: puts calls of ``per_call`` trajectories with payloads."""

    def run(self, client: RemoteBuffer, first: int, calls: int, per_call: int, pause_s: float) -> Dict[str, list]:
        done: Dict[str, list] = {"ok": [], "error": []}
        for c in range(calls):
            ids = list(range(first + c * per_call, first + (c + 1) * per_call))
            try:
                client.put(ids, 0, payloads=[payload(i) for i in ids])
                done["ok"].extend(ids)
            except Exception as exc:  # the put failed: its ids are not in the buffer (or counted as lost)
                done["error"].extend(ids)
                done.setdefault("why", []).append(f"{type(exc).__name__}: {str(exc)[:200]}")
            time.sleep(pause_s)
        return done

    def put_timed(self, client: RemoteBuffer, traj_id: int, timeout: float) -> tuple:
        """One put with a timeout: ("ok" or the exception's type name, seconds it took, message)."""
        start = time.monotonic()
        try:
            client.put([traj_id], 0, timeout=timeout, payloads=[payload(traj_id)])
            return "ok", time.monotonic() - start, ""
        except Exception as exc:
            return type(exc).__name__, time.monotonic() - start, str(exc)

    def put_many(self, client: RemoteBuffer, traj_ids: list, timeout: float) -> tuple:
        """One put of ``traj_ids`` with payloads that may wait (on_full="block"): ("ok" or the exception's type
        name, its message)."""
        try:
            client.put(traj_ids, 0, timeout=timeout, payloads=[payload(i) for i in traj_ids])
            return "ok", ""
        except Exception as exc:
            return type(exc).__name__, str(exc)

    def put_big(self, client: RemoteBuffer, traj_id: int, words: int, inline: bool = False) -> None:
        """One put of one payload of ``words`` int64 (traj_id, traj_id + 1, ...: every byte checkable);
        ``inline``: as from a process whose memory files the node's owner cannot open (pieces in the calls)."""
        if inline:
            from pyfast_buffer.ray import _sending, _shm

            _shm.mark_unreachable(_shm.key(_sending.owner_here(client.actor)[1]))
        client.put([traj_id], 0, payloads=[np.arange(traj_id, traj_id + words, dtype=np.int64)])

    def make_ref(self, words: int) -> ray.ObjectRef:
        return ray.put(np.arange(words))

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def pinned(node: int) -> ray.actor.ActorHandle:
    """A Producer on node ``node`` (its custom resource), started before it is returned."""
    producer = Producer.options(resources={f"node{node}": 1}).remote()
    ray.get(producer.pid.remote(), timeout=120)
    return producer
