"""The ingest path of RemoteBuffer: registrations of concurrent puts grouped into one index call, the byte
budget's eviction, on the session's real two-node loopback cluster (and the grouping itself, in process).

Grouping is forced, not hoped for: a test holds the index's lock (a call of its own inside the index) while
the puts arrive, so the first registration waits at the index and the others queue at the owner.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from typing import Any, List

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

import pyfast_buffer as pfb  # noqa: E402
from pyfast_buffer.ray import RemoteBuffer  # noqa: E402
from pyfast_buffer.ray._group import GroupCall  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
on_cluster = pytest.mark.usefixtures("ray_namespace", "buffers_ended")

NAMESPACE = "pyfast_buffer_ingest_tests"
WORDS = 16 * 1024  # 128 KiB payloads: above Ray's inline limit
WAIT_S = 60.0  # how long a test waits for a state it forced (a bound on a hang, not a speed claim)


def payload(traj_id: int, words: int = WORDS) -> np.ndarray:
    return np.full(words, traj_id, np.int64)


# -- the grouping, in process -------------------------------------------------------------------------------------
def test_group_call_sends_what_queued_during_a_call_in_the_next_call_with_outcomes_per_item():
    release = threading.Event()
    calls: List[List[int]] = []

    def send(items: List[int]) -> List[Any]:
        calls.append(list(items))
        if len(calls) == 1:
            assert release.wait(WAIT_S)
        return [ValueError(f"refused {i}") if i % 3 == 0 else i * 10 for i in items]

    group = GroupCall(send)
    results: dict = {}

    def submit(i: int) -> None:
        outcome = group.submit(i)
        results[i] = outcome

    first = threading.Thread(target=submit, args=(1,))
    first.start()
    deadline = time.monotonic() + WAIT_S
    while not calls and time.monotonic() < deadline:
        time.sleep(0.001)
    others = [threading.Thread(target=submit, args=(i,)) for i in range(2, 8)]
    for t in others:
        t.start()
    while group.queued() < 6 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert group.queued() == 6
    release.set()
    for t in [first, *others]:
        t.join(WAIT_S)
    assert calls[0] == [1] and sorted(calls[1]) == [2, 3, 4, 5, 6, 7] and len(calls) == 2
    assert group.calls == 2 and group.items == 7
    assert {i: r for i, r in results.items() if not isinstance(r, Exception)} == {1: 10, 2: 20, 4: 40, 5: 50, 7: 70}
    assert sorted(i for i, r in results.items() if isinstance(r, ValueError)) == [3, 6]


def test_group_call_raises_a_failed_call_in_every_caller_of_that_call_only():
    def send(items: List[int]) -> List[Any]:
        if 13 in items:
            raise ConnectionError("the index is gone")
        return items

    group = GroupCall(send)
    with pytest.raises(ConnectionError):
        group.submit(13)
    assert group.submit(5) == 5 and group.calls == 2


# -- on the cluster -----------------------------------------------------------------------------------------------
def _hold_index_lock(client: RemoteBuffer, flag: str) -> ray.ObjectRef:
    """Holds the index's lock from inside the index until the file ``flag`` exists (its own call); returns once
    the lock is held (the call is asynchronous: a put sent before it holds the lock would not wait)."""

    def hold(actor: Any, path: str) -> None:
        with actor._lock:
            open(path + ".held", "w").close()
            while not os.path.exists(path):
                time.sleep(0.005)

    held = client.actor.__ray_call__.remote(hold, flag)
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(flag + ".held"):
        assert time.monotonic() < deadline, "the index did not take its lock for the test"
        time.sleep(0.005)
    return held


def _owner_of_this_node(client: RemoteBuffer) -> Any:
    node = ray.get_runtime_context().get_node_id()
    return ray.get(client.actor.owner_for.remote(node))[1]


def _grouped_puts(client: RemoteBuffer, puts: List[List[int]], **kw: Any) -> dict:
    """Sends ``puts`` (one list of ids each) concurrently from this driver while the index's lock is held, so
    that the first registration waits and the others queue at the owner; returns id -> "ok" or the error."""
    owner = _owner_of_this_node(client)
    # No linger at this owner: under load the first registration could otherwise wait for the other puts being
    # written and take them along (one call), while these tests fix "the first alone, the rest queued together".
    ray.get(owner.__ray_call__.remote(lambda self: setattr(self._group, "_linger_s", 0.0)), timeout=WAIT_S)
    before = ray.get(owner.registrations.remote())
    flag = os.path.join(tempfile.mkdtemp(prefix="pfb-hold-"), "release")
    held = _hold_index_lock(client, flag)
    outcome: dict = {}

    def put(ids: List[int]) -> None:
        try:
            client.put(ids, 0, payloads=[payload(i) for i in ids], **kw)
            outcome.update(dict.fromkeys(ids, "ok"))
        except Exception as exc:
            outcome.update(dict.fromkeys(ids, exc))

    threads = [threading.Thread(target=put, args=(ids,)) for ids in puts]
    for t in threads:
        t.start()
    deadline = time.monotonic() + WAIT_S
    while ray.get(owner.registrations.remote())["queued"] < len(puts) - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    open(flag, "w").close()
    ray.get(held)
    for t in threads:
        t.join(WAIT_S)
    after = ray.get(owner.registrations.remote())
    outcome["_calls"] = after["calls"] - before["calls"]
    outcome["_items"] = after["items"] - before["items"]
    return outcome


@on_cluster
def test_grouped_puts_raise_only_for_the_puts_the_index_refused_and_the_ledger_is_exact():
    client = RemoteBuffer.create(8, max_age=5, on_full="error")
    client.put([0], 0, payloads=[payload(0)])  # starts this node's owner
    client.take(1, 0)
    puts = [[10 * k, 10 * k + 1] for k in range(1, 7)]  # six puts of two: four fit the eight entries
    outcome = _grouped_puts(client, puts)
    assert outcome["_calls"] == 2 and outcome["_items"] == 6  # the first alone, the five queued together
    ok = [i for ids in puts for i in ids if outcome[i] == "ok"]
    refused = [i for ids in puts for i in ids if outcome[i] != "ok"]
    assert len(ok) == 8 and len(refused) == 4
    assert all(isinstance(outcome[i], pfb.BufferFullError) for i in refused)
    led = client.ledger()
    assert led["put_total"] == 9 and led["retired"] == 1 and led["buffer_left"] == 8
    assert client.payloads_held() == 8 and 8 * WORDS * 8 <= led["payload_bytes_held"] <= 8 * (WORDS * 8 + 1024)
    owners = client.payload_owners()
    assert sum(o["payloads"] for o in owners) == 8  # a refused put's payloads are not held either
    batch = client.take(8, 0)
    assert sorted(batch.traj_ids.tolist()) == sorted(ok)
    assert [int(v[0]) for v in ray.get(batch.payloads)] == batch.traj_ids.tolist()
    again = refused[:2]  # a refused put, sent again once there is room, lands
    client.put(again, 0, payloads=[payload(i) for i in again])
    assert client.ledger()["put_total"] == 11 and client.ledger()["duplicate_requests"] == 0


@on_cluster
def test_grouped_puts_under_pace_refuse_only_the_puts_past_the_admission_limit():
    client = RemoteBuffer.create(64, max_age=2, strategy="pace", prompts_per_step=2, lookahead=0)
    client.put([0], 0, payloads=[payload(0)])
    client.take(1, 0)
    outcome = _grouped_puts(client, [[100 + k] for k in range(6)])
    assert outcome["_calls"] == 2 and outcome["_items"] == 6
    refused = [i for i in range(100, 106) if outcome[i] != "ok"]
    assert len(refused) == 4 and all(isinstance(outcome[i], pfb.AdmissionError) for i in refused)
    led = client.ledger()
    assert led["put_total"] == 3 and client.payloads_held() == 2 and len(client) == 2


@on_cluster
def test_a_retried_registration_is_counted_once():
    client = RemoteBuffer.create(64, max_age=5)
    client.put([1], 0, payloads=[payload(1)])
    slot = ray.get(client.actor.owner_for.remote(ray.get_runtime_context().get_node_id()))[0]
    sizes = np.asarray([WORDS * 8], np.int64)

    def admit(request: int, traj: int) -> tuple:
        call = {"kind": "put", "traj_ids": np.asarray([traj], np.int64), "sample_step": 0, "group_ids": None}
        return ("admit", request, {**call, "timeout": None}, sizes, slot)

    # What call_index sends again after the index died mid-call: the same items, the same request ids.
    items = [admit(501, 20), admit(502, 21)]
    assert ray.get(client.actor.register.remote(items)) == [None, None]
    # A repeat is answered with the ids whose payloads the index counts at this owner (it keeps those).
    assert ray.get(client.actor.register.remote(items)) == [[20], [21]]
    # A retry racing its first try into the same group call: applied once there too.
    assert ray.get(client.actor.register.remote([admit(503, 22), admit(503, 22)])) == [None, [22]]
    led = client.ledger()
    assert led["put_total"] == 4 and led["duplicate_requests"] == 3 and len(client) == 4


@on_cluster
def test_grouped_puts_with_a_byte_budget_reserve_exactly_and_refuse_only_what_does_not_fit():
    budget = 3 * (WORDS * 8 + 1024)  # three payloads and their framing
    client = RemoteBuffer.create(64, max_age=5, on_full="error", capacity_bytes=budget)
    client.put([0], 0, payloads=[payload(0)])
    client.take(1, 0)
    outcome = _grouped_puts(client, [[k] for k in range(1, 6)])
    ok = [k for k in range(1, 6) if outcome[k] == "ok"]
    assert len(ok) == 3
    assert all(isinstance(outcome[k], pfb.BufferFullError) for k in range(1, 6) if k not in ok)
    led = client.ledger()
    assert led["put_total"] == 4 and 3 * WORDS * 8 <= led["payload_bytes_held"] <= budget
    client.take(3, 0)
    assert client.ledger()["payload_bytes_held"] == 0
    client.put([50, 51, 52], 0, payloads=[payload(k) for k in (50, 51, 52)])  # nothing stays reserved
    assert client.ledger()["put_total"] == 7


@on_cluster
def test_evict_oldest_under_capacity_bytes_evicts_the_oldest_whole_groups_in_order():
    one = WORDS * 8
    client = RemoteBuffer.create(
        64, max_age=5, on_full="evict_oldest", capacity_bytes=3 * one + 4096, track_released=True
    )
    client.put([1, 2], 0, group_ids=[7, 7], payloads=[payload(1), payload(2)])
    client.put([3], 0, payloads=[payload(3)])
    client.put([4], 0, payloads=[payload(4)])  # needs one payload's room: group 7 goes, whole
    assert client.released().of("evicted").tolist() == [1, 2]
    client.put([5], 0, payloads=[payload(5)])
    client.put([6, 7], 0, payloads=[payload(6), payload(7)])  # two payloads' room: 3, then 4, and no more
    assert client.released().of("evicted").tolist() == [3, 4]
    led = client.ledger()
    assert led["evicted"] == 4 and 4 * one <= led["evicted_bytes"] <= 4 * one + 4096
    assert led["payload_bytes_held"] <= 3 * one + 4096 and client.payloads_held() == 3
    deadline = time.monotonic() + WAIT_S  # the index tells the owner without waiting: it lets go soon after
    while sum(o["payloads"] for o in client.payload_owners()) != 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(o["payloads"] for o in client.payload_owners()) == 3  # the owner let go of the evicted ones
    batch = client.take(8, 0)
    assert batch.traj_ids.tolist() == [5, 6, 7]
    assert [int(v[0]) for v in ray.get(batch.payloads)] == [5, 6, 7]


BIG_WORDS = 3 * 2**17  # 3 MiB payloads: two fit the bytes one call carries (_wire.CALL_BYTES), three do not


@on_cluster
@pytest.mark.parametrize("path", ["shared memory", "inline"])
def test_a_put_past_one_calls_bytes_is_one_admission_and_all_or_nothing(path):
    from pyfast_buffer.ray import _shm, _wire

    assert 2 * BIG_WORDS * 8 < _wire.CALL_BYTES < 3 * BIG_WORDS * 8  # so the inline puts below are staged
    client = RemoteBuffer.create(16, max_age=5)
    client.put([7], 0, payloads=[payload(7)])  # starts this node's owner; id 7 now holds a payload
    owner = _owner_of_this_node(client)
    if path == "inline":  # as for an owner that cannot open this process's memory files
        _shm.mark_unreachable(_shm.key(owner))
    before = ray.get(owner.registrations.remote())
    # A repeated id in the last payload: the whole put is refused, its first payloads too.
    with pytest.raises(ValueError, match="already hold payloads"):
        client.put([100, 101, 7], 0, payloads=[payload(k, BIG_WORDS) for k in (100, 101, 7)])
    led = client.ledger()
    assert led["put_total"] == 1 and len(client) == 1 and client.payloads_held() == 1
    assert ray.get(owner.registrations.remote())["calls"] == before["calls"]
    # A put of 9 MiB in one group: one registration at the index, the group whole.
    client.put([100, 101, 102], 0, group_ids=[9, 9, 9], payloads=[payload(k, BIG_WORDS) for k in (100, 101, 102)])
    after = ray.get(owner.registrations.remote())
    assert (after["calls"] - before["calls"], after["items"] - before["items"]) == (1, 1)
    batch = client.take(4, 0)
    assert sorted(batch.traj_ids.tolist()) == [7, 100, 101, 102]
    for traj, value in zip(batch.traj_ids.tolist(), ray.get(list(batch.payloads))):
        assert int(value[0]) == traj and int(value[-1]) == traj and len(value) in (WORDS, BIG_WORDS)
    assert client.ledger()["put_total"] == 4
