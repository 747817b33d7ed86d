"""The Ray buffer's promises under faults, on the session's real two-node cluster (issue 57): a put retried
through a new payload owner while the first one's admission still waits is applied once, at any point of a
blocked put at which its owner, its caller or the index dies (SIGKILL); one journal per buffer; payload owners
in the buffer's namespace, ended with it; timeouts that name the seconds waited; and a cancelled ``atake``
counted at once. Bounds on time are correctness bounds with generous margins, never timing assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from _ray_helpers import kill_named_actors  # noqa: E402
from _ray_producer import PAYLOAD_WORDS, payload, pinned  # noqa: E402

from pyfast_buffer.ray import RemoteBuffer  # noqa: E402
from pyfast_buffer.ray._calls import BufferUnavailableError  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.usefixtures("ray_namespace", "buffers_ended")

NAMESPACE = "pyfast_buffer_fault_tests"
#: Payload bytes of one trajectory as the index counts them (a 128 KiB array and its small header).
PAYLOAD_BYTES = PAYLOAD_WORDS * 8
#: The identity every ledger of the remote buffer keeps (docs/ray.md, "What survives what").
OUT = ("retired", "payload_lost", "lost_in_restart", "lost_in_delivery", "dropped_stale", "evicted", "buffer_left")


def _until(what: str, check: Any, limit_s: float = 120.0, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + limit_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} did not happen within {limit_s} s"
        time.sleep(every_s)


def _owner_on(client: RemoteBuffer, node: str, pending: Optional[int] = None, not_pid: int = -1) -> Dict[str, Any]:
    """The live payload owner of ``node`` (with ``pending`` payloads put and awaiting admission, if given)."""

    def find() -> Optional[Dict[str, Any]]:
        for owner in client.payload_owners():
            mine = owner["node_id"] == node and owner["pid"] != not_pid
            if mine and (pending is None or owner["pending"] == pending):
                return owner
        return None

    return _until(f"an owner on {node[:8]} with {pending} pending payloads", find)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _drain(client: RemoteBuffer) -> tuple:
    """Takes everything left; returns (ids taken, ids whose payload was lost), each payload checked."""
    taken: List[int] = []
    lost: List[int] = []
    while True:
        batch = client.take(64, 0)
        if not len(batch):
            return taken, lost
        lost.extend(batch.lost.tolist())
        if batch.payloads is not None:
            batch, values = client.fetch(batch, timeout=120)
            for i, value in zip(batch.traj_ids.tolist(), values):
                assert value is None or (int(value[0]) == i and value.shape == (PAYLOAD_WORDS,))
            lost.extend(batch.lost.tolist())
        taken.extend(batch.traj_ids.tolist())


def _bytes_agree(client: RemoteBuffer) -> bool:
    """Nothing pending, and the live owners hold exactly the payloads and bytes the index counts."""
    owners = client.payload_owners()
    if any(o["pending"] for o in owners):
        return False
    held = client.ledger()["payload_bytes_held"]
    return held == sum(o["payload_bytes"] for o in owners) and client.payloads_held() == sum(
        o["payloads"] for o in owners
    )


def _check_bytes_agree(client: RemoteBuffer) -> None:
    """The index learns of a dead owner by itself (no client needs to report it): within a generous deadline the
    live owners hold exactly the payload bytes the index counts."""
    _until("the index's bytes to agree with the live owners'", lambda: _bytes_agree(client), every_s=0.2)


def test_a_put_retried_through_a_new_owner_while_the_first_waits_is_applied_once(ray_cluster):
    """The issue's case: the ring full under on_full="block", a put with payloads waits at the index, its owner is
    SIGKILLed, the client retries the same request through the node's new owner; room comes: one put, not two."""
    client = RemoteBuffer.create(8, on_full="block", max_age=100, name=f"once-{uuid.uuid4().hex[:6]}")
    client.put(np.arange(8), 0)
    node1 = ray_cluster.node_ids()[1]
    producer = pinned(1)
    ids = [100, 101, 102, 103]
    run = producer.put_many.remote(client, ids, 120.0)
    first = _owner_on(client, node1, pending=4)  # written, its admission waiting for room
    os.kill(first["pid"], signal.SIGKILL)
    _owner_on(client, node1, pending=4, not_pid=first["pid"])  # the retry waits at the index in its turn
    assert sorted(client.take(8, 0).traj_ids.tolist()) == list(range(8))
    assert ray.get(run, timeout=120) == ("ok", "")
    taken, lost = _drain(client)
    assert (sorted(taken), lost) == (ids, [])
    ledger = client.ledger()
    assert (ledger["put_total"], ledger["retired"], ledger["payload_lost"]) == (12, 12, 0), ledger
    assert ledger["payload_bytes_held"] == 0 and sum(o["payloads"] for o in client.payload_owners()) == 0


@pytest.mark.parametrize("seed", [57])
def test_killing_the_owner_the_caller_or_the_index_of_a_blocked_put_never_applies_it_twice(ray_cluster, seed):
    """At random points of a put that waits (for room in the ring, or for payload bytes under capacity_bytes),
    SIGKILL its payload owner, its caller, both, or the index; then make room. Each round: no id taken twice,
    each id of the put accounted once at most (and once exactly if its caller saw it succeed), the ledger
    identity, and the bytes the index counts equal to those the live owners hold."""
    rng = random.Random(seed)
    node1 = ray_cluster.node_ids()[1]
    rounds = int(os.environ.get("PFB_FAULT_ROUNDS", "8"))
    seen = []
    for r in range(rounds):
        target = rng.choice(["owner", "caller", "owner+caller", "index"])
        bytes_full = rng.random() < 0.5  # the put waits at its byte reservation, else at the full ring
        budget = (8 if bytes_full else 12) * PAYLOAD_BYTES + PAYLOAD_BYTES // 2
        client = RemoteBuffer.create(
            8, on_full="block", max_age=1000, capacity_bytes=budget, name=f"faults-{r}-{uuid.uuid4().hex[:6]}"
        )
        fill = list(range(r * 1000, r * 1000 + 8))
        client.put(fill, 0, payloads=[payload(i) for i in fill])
        ids = list(range(r * 1000 + 100, r * 1000 + 104))
        producer = pinned(1)
        caller_pid = ray.get(producer.pid.remote())
        index_pid = ray.get(client.actor.pid.remote())
        run = producer.put_many.remote(client, ids, 120.0)
        owner = _owner_on(client, node1)
        time.sleep(rng.uniform(0.0, 1.5))  # before the put reaches its owner, while it writes, or while it waits
        if "owner" in target:
            os.kill(owner["pid"], signal.SIGKILL)
        if "caller" in target:
            os.kill(caller_pid, signal.SIGKILL)
        if target == "index":
            os.kill(index_pid, signal.SIGKILL)
        time.sleep(rng.uniform(0.0, 1.0))
        made_room = client.take(8, 0, timeout=120).traj_ids.tolist()  # rides out a restart of the index
        try:
            outcome = ray.get(run, timeout=180)
        except ray.exceptions.RayActorError:
            outcome = ("caller died", "")
        if "caller" not in target:  # a dead owner's put goes again through the node's new one
            assert outcome == ("ok", ""), (target, outcome)
        _check_bytes_agree(client)  # before any client of node 1 calls again: the index saw the owner die itself
        checker = pinned(1)
        assert ray.get(checker.put_many.remote(client, [r * 1000 + 900], 120.0), timeout=180) == ("ok", "")
        ray.kill(checker)
        _check_bytes_agree(client)
        taken, lost = _drain(client)
        everything = made_room + taken
        assert len(everything) == len(set(everything)), f"round {r} ({target}): an id taken twice: {sorted(everything)}"
        assert set(fill) <= set(everything), f"round {r}: the ring's first entries were not all taken"
        ledger = client.ledger()
        assert ledger["put_total"] == sum(ledger[k] for k in OUT), ledger
        arrived = [i for i in ids if i in everything or i in lost]
        assert ledger["put_total"] == 8 + 1 + (4 if arrived else 0), (target, ledger, arrived)
        if outcome == ("ok", ""):
            assert sorted(arrived) == ids, (target, arrived)  # taken (payload readable, or counted lost)
        assert set(lost) <= set(ids), lost  # only a killed owner's payloads may be lost
        assert ledger["payload_bytes_held"] == 0 and sum(o["payloads"] for o in client.payload_owners()) == 0
        seen.append((target, bytes_full, outcome[0], len(arrived), len(lost)))
        client.kill()
        if "caller" not in target:
            ray.kill(producer)
    print("rounds (target, bytes budget full, caller's outcome, ids arrived, payloads lost):", seen)


def test_a_journal_path_belongs_to_one_buffer_and_a_restart_loads_only_its_own(tmp_path):
    path, other = str(tmp_path / "a.pfb"), str(tmp_path / "b.pfb")
    a = RemoteBuffer.create(64, max_age=50, name=f"journal-a-{uuid.uuid4().hex[:6]}", journal=path)
    a.put(np.arange(12), 0)
    with pytest.raises(ValueError, match=r"belongs to buffer 'journal-a-.*is running"):
        RemoteBuffer.create(64, max_age=50, name=f"journal-b-{uuid.uuid4().hex[:6]}", journal=path)
    pid = ray.get(a.actor.pid.remote())
    os.kill(pid, signal.SIGKILL)
    _until("a's index to restart", lambda: _pid_or_none(a) not in (None, pid), limit_s=180, every_s=0.5)
    assert sorted(a.state_dict()["entries"]["traj_id"].tolist()) == list(range(12))
    assert a.ledger()["put_total"] == 12
    # A snapshot of another buffer put at a's path (an operator's copy) is refused at a's next restart: a stays
    # down, saying why, rather than come back with b's entries.
    b = RemoteBuffer.create(64, max_age=50, name=f"journal-b-{uuid.uuid4().hex[:6]}", journal=other)
    b.put(np.arange(100, 103), 0)
    shutil.copyfile(other, path)
    os.kill(ray.get(a.actor.pid.remote()), signal.SIGKILL)
    with pytest.raises(BufferUnavailableError):
        a.ledger()
    assert b.ledger()["put_total"] == 3


def _pid_or_none(client: RemoteBuffer) -> Optional[int]:
    try:
        return int(ray.get(client.actor.pid.remote(), timeout=30))
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None


def test_payload_owners_live_in_the_buffers_namespace_and_end_with_it():
    space = f"{NAMESPACE}-buffers"  # not the driver's: owners used to land in the driver's namespace
    name = f"ns-{uuid.uuid4().hex[:6]}"
    try:
        client = RemoteBuffer.create(64, name=name, namespace=space, journal=False)  # dies for good when killed
        client.put([1, 2], 0, payloads=[payload(1), payload(2)])
        named = ray.util.list_named_actors(all_namespaces=True)
        owners = [a for a in named if a["name"].startswith(f"{name}.payloads.")]
        assert owners and all(a["namespace"] == space for a in owners), owners
        (owner,) = client.payload_owners()
        os.kill(ray.get(client.actor.pid.remote()), signal.SIGKILL)  # the index is gone for good
        _until("the index to be dead", lambda: _pid_or_none(client) is None)
        again = RemoteBuffer.create(64, name=name, namespace=space)  # reclaims the name, ends the old owners
        again.put([1, 2], 0, payloads=[payload(1), payload(2)])
        _until("the dead buffer's payload owner to end", lambda: _gone(owner["pid"]))
        (fresh,) = again.payload_owners()
        # kill() of a buffer whose index is already dead still ends its owners (found by name).
        os.kill(ray.get(again.actor.pid.remote()), signal.SIGKILL)
        again.kill()
        _until("the owner of a killed buffer to end", lambda: _gone(fresh["pid"]))
        left = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(name)]
        assert left == [], left
    finally:
        kill_named_actors(space)


@pytest.mark.parametrize("call", ["take", "atake", "put", "put_payloads", "aput"])
def test_a_remote_timeout_names_the_seconds_waited(call):
    client = RemoteBuffer.create(4, on_full="block", max_age=10)
    if call != "take" and call != "atake":
        client.put(np.arange(4), 0)
    start = time.monotonic()
    with pytest.raises(TimeoutError) as caught:
        if call == "take":
            client.take(8, 0, timeout=1.5)
        elif call == "atake":
            asyncio.run(client.atake(8, 0, timeout=1.5))
        elif call == "put":
            client.put([10], 0, timeout=1.5)
        elif call == "put_payloads":
            client.put([10], 0, timeout=1.5, payloads=[payload(10)])
        else:
            asyncio.run(client.aput([10], 0, timeout=1.5))
    assert time.monotonic() - start >= 1.5
    message = str(caught.value)
    assert "timed out after 1.5 s" in message and "e-09" not in message, message


def test_a_cancelled_remote_atake_is_counted_at_once_and_loses_nothing_silently():
    """60 awaiting takes of 4, 12 of them cancelled while puts arrive, round after round until a cancellation
    has landed while an attempt was at the index. Every id put is then trained by a take that returned, still in
    the ring, or counted lost_in_delivery by a cancelled take at once (not after receipt_timeout_s)."""
    client = RemoteBuffer.create(4096, max_age=1000, receipt_timeout_s=600)
    rng = random.Random(5)
    got: List[int] = []
    put = 0

    async def one_round(first: int) -> None:
        nonlocal put
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(client.atake(4, 0, timeout=120)) for _ in range(60)]
        doomed = rng.sample(tasks, 12)
        for k in range(60):
            await loop.run_in_executor(None, client.put, list(range(first + 4 * k, first + 4 * k + 4)), 0)
            put += 4
            if k % 5 == 4:
                doomed.pop().cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                got.extend((await task).traj_ids.tolist())

    deadline = time.monotonic() + 240
    r = 0
    while True:
        asyncio.run(one_round(r * 1000))
        r += 1
        ledger = client.ledger()
        assert len(got) == len(set(got))
        assert ledger["in_delivery"] == 0, ledger  # a cancelled take does not wait for receipt_timeout_s
        assert ledger["lost_in_delivery"] == 4 * ledger["cancelled_takes"], ledger
        assert put == ledger["put_total"] == len(got) + len(client) + ledger["lost_in_delivery"], ledger
        if ledger["cancelled_takes"] or time.monotonic() > deadline:
            break
    assert ledger["cancelled_takes"] >= 1, f"no cancellation landed during an attempt in {r} rounds"


def test_a_dead_owners_reserved_room_returns_to_the_budget_with_no_client_left_to_report_it(ray_cluster):
    """The byte budget full, a node-1 put waits for room at its reservation; its owner and its producer are both
    SIGKILLed, so no client will ever report the owner dead. The index sees it die (Ray's report), frees the room
    it had reserved, and a put of a whole budget goes through once the ring is emptied."""
    budget = 4 * PAYLOAD_BYTES + PAYLOAD_BYTES // 2
    client = RemoteBuffer.create(64, on_full="block", max_age=100, capacity_bytes=budget)
    client.put([0, 1, 2, 3], 0, payloads=[payload(i) for i in range(4)])
    node1 = ray_cluster.node_ids()[1]
    producer = pinned(1)
    producer_pid = ray.get(producer.pid.remote())
    producer.put_many.remote(client, [100, 101], 300.0)
    owner = _owner_on(client, node1)
    time.sleep(1.0)  # its reservation waits at the index
    os.kill(owner["pid"], signal.SIGKILL)
    os.kill(producer_pid, signal.SIGKILL)
    assert sorted(client.take(4, 0, timeout=60).traj_ids.tolist()) == [0, 1, 2, 3]
    _check_bytes_agree(client)
    client.put([10, 11, 12, 13], 0, payloads=[payload(i) for i in range(10, 14)], timeout=120)  # the whole budget
    _check_bytes_agree(client)
    assert sorted(client.take(8, 0).traj_ids.tolist()) == [10, 11, 12, 13]


@ray.remote(num_cpus=0, max_restarts=0)
class Creator:
    """A driver-like actor that creates a buffer tied to its own lifetime (``lifetime=None``) and puts into it."""

    def make(self, name: str) -> int:
        self.client = RemoteBuffer.create(64, name=name, lifetime=None, journal=False)
        self.client.put([1], 0, payloads=[payload(1)])
        return int(self.client.payload_owners()[0]["pid"])


def test_owners_end_when_their_index_is_dead_for_good_without_any_kill_call():
    """The index dies for good without kill(): its creator ends under lifetime=None, or it is SIGKILLed with no
    restarts (journal=False). Its detached owners end by themselves, holding nothing for a dead buffer."""
    creator = Creator.remote()
    tied_owner = ray.get(creator.make.remote(f"tied-{uuid.uuid4().hex[:6]}"))
    ray.kill(creator)
    client = RemoteBuffer.create(64, journal=False)
    client.put([1], 0, payloads=[payload(1)])
    (owner,) = client.payload_owners()
    os.kill(ray.get(client.actor.pid.remote()), signal.SIGKILL)
    _until("the owner of a buffer whose creator ended to end", lambda: _gone(tied_owner))
    _until("the owner of a SIGKILLed index without restarts to end", lambda: _gone(owner["pid"]))


def test_kill_ends_only_its_own_owners_and_default_journals_are_per_namespace():
    """kill() of buffer "pfx" never touches a buffer named "pfx.payloads.eval" (an owner's name is matched exactly);
    two buffers of one name in two namespaces each get their own default journal."""
    name = f"pfx-{uuid.uuid4().hex[:6]}"
    first = RemoteBuffer.create(64, name=name)
    other = RemoteBuffer.create(64, name=f"{name}.payloads.eval")
    first.put([1], 0, payloads=[payload(1)])
    first.kill()
    other.put([2], 0)
    assert len(other) == 1
    space = f"{NAMESPACE}-twin"
    try:
        twin = RemoteBuffer.create(64, name=f"{name}.payloads.eval", namespace=space)  # same name, default journal
        twin.put([3, 4], 0)
        assert (len(twin), len(other)) == (2, 1)
        # A namespace and a name that would run together under a plain separator still get files of their own.
        joined = RemoteBuffer.create(64, name="c", namespace=f"{space}--b")
        split = RemoteBuffer.create(64, name="b--c", namespace=space)
        joined.put([5], 0)
        assert (len(joined), len(split)) == (1, 0)
    finally:
        kill_named_actors(space)
        kill_named_actors(f"{space}--b")


def test_a_retried_take_names_the_whole_timeout_after_an_index_restart():
    client = RemoteBuffer.create(64, max_age=5)
    pid = ray.get(client.actor.pid.remote())
    start = time.monotonic()
    killer = threading.Timer(1.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    with pytest.raises(TimeoutError) as caught:
        client.take(8, 0, timeout=8.0)
    killer.join()
    assert time.monotonic() - start >= 1.5
    assert "timed out after 8 s" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("max_uses", [1, 2])
def test_a_take_cancelled_during_its_attempt_is_counted_before_the_callers_next_ledger(max_uses):
    """Entries ready, an atake starts and is cancelled while its first attempt is at the index: the attempt goes
    through, and the very next ledger() of this process counts the take (lost_in_delivery for what it retired; with
    max_uses=2 nothing retired: the ids stay in the ring with the use spent)."""
    client = RemoteBuffer.create(64, max_age=100, max_uses=max_uses, receipt_timeout_s=600)
    seen = []
    for round_ in range(20):
        ids = list(range(round_ * 10, round_ * 10 + 4))
        client.put(ids, 0)

        async def cancel_during_attempt() -> bool:
            task = asyncio.create_task(client.atake(4, 0, timeout=60))
            await asyncio.sleep(0)  # its attempt is on its way to the index
            task.cancel()
            try:
                await task
                return False
            except asyncio.CancelledError:
                return True

        cancelled = asyncio.run(cancel_during_attempt())
        ledger = client.ledger()
        seen.append(cancelled)
        assert ledger["in_delivery"] == 0, ledger
        assert ledger["cancelled_takes"] == sum(seen), (seen, ledger)
        assert ledger["lost_in_delivery"] == (4 * sum(seen) if max_uses == 1 else 0), ledger
        if max_uses == 2:
            client.take(64, 0)  # the rest of their uses, so the next round starts from an empty ring
    assert any(seen), "no cancellation landed during an attempt in 20 rounds"
