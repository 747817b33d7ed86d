"""A whole node lost mid-run, and takes whose batch never reached its client, on the real two-node cluster.

The session's cluster (``ray_cluster`` in conftest.py) has the index's node (node 0, the head) and node 1.
``LocalCluster.kill_node(1)`` SIGKILLs node 1's raylet and every process of that node at once (its payload
owner, its producers, its agents): a machine lost, not a drain. The test starts a fresh node 1 afterwards,
so the session keeps two nodes. Bounds on time are correctness bounds with generous margins.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from typing import List, Optional

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from _ray_producer import PAYLOAD_WORDS, payload, pinned  # noqa: E402

from pyfast_buffer.checkpoint import load_state, save_state  # noqa: E402
from pyfast_buffer.ray import RemoteBuffer  # noqa: E402
from pyfast_buffer.ray._calls import BufferUnavailableError  # noqa: E402
from pyfast_buffer.ray._journal import FORMAT, SEGMENT_HEADER_BYTES, segments  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.usefixtures("ray_namespace", "buffers_ended")

NAMESPACE = "pyfast_buffer_node_loss_tests"
#: What a call may take past its timeout here: a call to an actor of a dead node fails after ~3 s (Ray's
#: connection attempts), on this loaded machine with room to spare.
MARGIN_S = 10.0


def index_node(client: RemoteBuffer) -> str:
    """The node the index actor runs on now, from Ray's control store."""
    from ray._private import state

    return str(state.actors(client.actor._actor_id.hex())["Address"]["NodeID"])


def test_losing_a_whole_node_mid_run_loses_nothing_silently(ray_cluster):
    client = RemoteBuffer.create(4096, max_age=1000, track_released=True, name=f"node-{uuid.uuid4().hex[:6]}")
    index_pid = ray.get(client.actor.pid.remote())
    producers = [pinned(0), pinned(1), pinned(0), pinned(1)]
    runs = [p.run.remote(client, 100_000 * (i + 1), 40, 4, 0.05) for i, p in enumerate(producers)]
    taken: List[int] = []
    lost: List[int] = []
    late: List[float] = []

    def take_some(rounds: int, timeout: Optional[float] = 2.0) -> None:
        for _ in range(rounds):
            start = time.monotonic()
            try:
                batch = client.take(16, 0, timeout=timeout)  # None: what is there, without waiting
            except TimeoutError:
                batch = None
            finally:
                late.append(time.monotonic() - start - (timeout or 0.0))
            if batch is None:
                continue
            start = time.monotonic()
            batch, values = client.fetch(batch, timeout=120)  # refs handed out before the kill may be gone
            late.append(time.monotonic() - start - 120)
            for i, value in zip(batch.traj_ids.tolist(), values):
                assert value is not None and int(value[0]) == i and value.shape == (PAYLOAD_WORDS,)
                taken.append(i)
            lost.extend(batch.lost.tolist())  # at the take (owner dead) and at the fetch (object gone)

    try:
        node1 = ray_cluster.node_ids()[1]
        deadline = time.monotonic() + 300
        while not any(k // 100_000 in (2, 4) for k in taken):  # node 1's puts reach the trainer
            assert time.monotonic() < deadline, "node 1's producers never put"
            take_some(1)
        while not any(o["node_id"] == node1 and o["payloads"] for o in client.payload_owners()):
            assert time.monotonic() < deadline, "node 1's owner holds nothing"
            time.sleep(0.1)  # the trainer pauses: node 1's owner holds payloads when its node dies
        killed = ray_cluster.kill_node(1)  # node 1's raylet, owner, producers and agents, all at once
        assert len(killed) >= 4
        take_some(6)
        outcomes = []
        for run in runs:
            try:
                outcomes.append(ray.get(run, timeout=600))
            except ray.exceptions.RayActorError:
                outcomes.append(None)  # a producer of node 1: it died with its node
        assert outcomes[0] is not None and outcomes[2] is not None and outcomes[1] is None and outcomes[3] is None
        while len(client):  # node 0's producers are done: take what is left without waiting
            before = len(taken) + len(lost)
            take_some(1, timeout=None)
            assert len(taken) + len(lost) > before
    finally:
        ray_cluster.start_node(1)  # the session goes on with two nodes (node 1 is a new node)
        ray_cluster.wait_for_nodes()

    assert ray.get(client.actor.pid.remote()) == index_pid  # the index on the head went on, never restarted
    assert len(taken) == len(set(taken)), "a trajectory was taken twice"
    assert not set(taken) & set(lost) and len(lost) == len(set(lost))
    led = client.ledger()
    assert led["index_restarts"] == 0 and led["buffer_left"] == 0 and led["in_delivery"] == 0
    assert led["retired"] == len(taken) and led["payload_lost"] == len(lost) > 0, led
    identity = ("retired", "payload_lost", "lost_in_restart", "lost_in_delivery", "dropped_stale")
    assert led["put_total"] == sum(led[k] for k in identity) + led["evicted"] + led["buffer_left"], led
    # Every id that entered the buffer left it exactly once, taken or lost: nothing vanished in between.
    assert set(client.released().of("retired").tolist()) == set(taken) | set(lost)
    # Node 0's producers lost nothing: every id they put is taken (their owner is on the surviving node).
    for outcome in (outcomes[0], outcomes[2]):
        assert set(outcome["ok"]) <= set(taken) and not outcome["error"]
    # Whatever was lost had been put from node 1.
    assert all(k // 100_000 in (2, 4) for k in lost)
    assert max(late) <= MARGIN_S, f"a call returned {max(late):.1f} s past its timeout"


_CLIENT_THAT_DIES = """
import os, sys, time
import numpy as np, ray
from pyfast_buffer.bench.ray_cluster import LocalCluster
from pyfast_buffer.ray import RemoteBuffer
address, namespace, name = sys.argv[1:4]
cluster = object.__new__(LocalCluster)  # only for connect()'s loopback settings
cluster.address, cluster.nodes = address, 1
cluster.connect(namespace=namespace)
buf = RemoteBuffer.get(name, namespace=namespace)
from pyfast_buffer.ray import _packed
columns = _packed.unpack(ray.get(buf.actor.take.remote(4242, 8, 0, None)))[0]  # the index answers: retired ...
print(" ".join(map(str, columns[0].tolist())), flush=True)
os.kill(os.getpid(), 9)  # ... and the client dies before it fetched the refs or sent its receipt
"""


def test_a_take_whose_client_dies_before_receipt_is_lost_in_delivery_not_retired(ray_cluster):
    name = f"receipt-{uuid.uuid4().hex[:6]}"
    client = RemoteBuffer.create(64, max_age=5, name=name, namespace=NAMESPACE, receipt_timeout_s=3.0)
    client.put(list(range(8)), 0, payloads=[payload(i) for i in range(8)])
    client.put([100, 101], 0)  # no payloads: counted the same way
    out = subprocess.run(
        [sys.executable, "-c", _CLIENT_THAT_DIES, ray_cluster.address, NAMESPACE, name],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/tmp",
    )
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    drawn = [int(k) for k in out.stdout.split()]
    assert sorted(drawn) == list(range(8))
    led = client.ledger()  # within the receipt timeout: retired and in delivery, not (yet) received
    assert (led["in_delivery"], led["retired"], led["lost_in_delivery"]) == (8, 8, 0), led
    deadline = time.monotonic() + 120
    while client.ledger()["in_delivery"]:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    led = client.ledger()
    assert (led["lost_in_delivery"], led["retired"], led["late_receipts"]) == (8, 0, 0), led
    assert sum(o["payloads"] for o in client.payload_owners()) == 0  # their payloads were let go of
    # A client that does receive its batch counts it retired at once, in the same ledger identity.
    batch = client.take(8, 0)
    assert batch.traj_ids.tolist() == [100, 101] and batch.payloads is None
    led = client.ledger()
    identity = ("retired", "payload_lost", "lost_in_restart", "lost_in_delivery", "dropped_stale")
    assert led["retired"] == 2 and led["put_total"] == sum(led[k] for k in identity) + led["buffer_left"]
    # A late receipt (the client was only slow) moves its ids back: counted once, in one place.
    ray.get(client.actor.received.remote(4242, np.empty(0, np.int64)))
    led = client.ledger()
    assert (led["lost_in_delivery"], led["retired"], led["late_receipts"]) == (0, 10, 1), led


def test_an_index_whose_node_dies_restarts_on_another_node_from_a_shared_journal(ray_cluster, tmp_path):
    """The index on node 1 with its journal on storage node 0 reads too (here: the same disk): node 1 dies,
    Ray restarts the index on node 0, and it continues from the journal with node 0's payloads intact."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    head, node1 = ray_cluster.node_ids()
    client = RemoteBuffer.create(
        256,
        max_age=1000,
        journal=str(tmp_path / "index.pfb"),
        actor_options={"scheduling_strategy": NodeAffinitySchedulingStrategy(node1, soft=True)},
    )
    assert index_node(client) == node1
    client.put(list(range(12)), 0, payloads=[payload(i) for i in range(12)])  # held by node 0's owner (here)
    client.dispatch([500], 0)  # in flight when the node dies
    assert client.take(4, 0).traj_ids.tolist() == [0, 1, 2, 3]
    before = client.ledger()
    try:
        ray_cluster.kill_node(1)
        led = client.ledger()  # waits for the restart (Ray declares node 1 dead, then restarts the index)
    finally:
        ray_cluster.start_node(1)
        ray_cluster.wait_for_nodes()
    assert led["index_restarts"] == 1 and index_node(client) == head
    assert {k: led[k] for k in ("put_total", "retired", "in_flight", "dispatched")} == {
        k: before[k] for k in ("put_total", "retired", "in_flight", "dispatched")
    }
    batch = client.take(16, 0)
    assert batch.traj_ids.tolist() == list(range(4, 12))
    batch, values = client.fetch(batch, timeout=120)
    assert [int(v[0]) for v in values] == list(range(4, 12)) and not len(batch.lost)
    led = client.ledger()
    assert led["retired"] == 12 and led["buffer_left"] == 0 and led["in_flight"] == 1


def test_an_index_restarted_without_its_journal_stays_down_and_says_why(ray_cluster):
    """What a restart on a node without the journal meets (the default path is node-local): the file is not
    there. The index must not come back empty with a reset ledger; it stays down, naming the journal."""
    client = RemoteBuffer.create(256, max_age=1000)
    client.put(list(range(6)), 0)
    path = ray.get(client.actor.journal_stats.remote())["path"]
    index_pid = ray.get(client.actor.pid.remote())
    for name in [path, *(name for _first, name in segments(path))]:
        os.unlink(name)  # as on a node that never had it
    os.kill(index_pid, signal.SIGKILL)
    with pytest.raises(BufferUnavailableError, match="dead for good"):
        client.ledger()
    with pytest.raises(BufferUnavailableError) as caught:  # and it says why: its journal is not there
        client.ledger()
    why = str(caught.value.__cause__)
    assert "journal" in why and path in why and "stays down rather than come back empty" in why
    client.kill()


@pytest.mark.parametrize("where", ["snapshot", "segment"])
def test_an_index_restarted_on_a_journal_of_another_format_stays_down_and_names_it(ray_cluster, where):
    """What a restart meets when another pyfast_buffer version wrote the journal (an upgrade between runs): the
    index must not read it as if it were its own format, nor come back empty; it stays down, and the client's
    error names the file and both formats."""
    client = RemoteBuffer.create(256, max_age=1000)
    client.put(list(range(6)), 0)
    path = ray.get(client.actor.journal_stats.remote())["path"]
    index_pid = ray.get(client.actor.pid.remote())
    if where == "snapshot":
        snap = load_state(path)
        assert snap["format"] == FORMAT
        save_state({**snap, "format": FORMAT + 1}, path)
        named = path
    else:
        ((_first, named),) = segments(path)
        with open(named, "r+b") as f:
            f.seek(SEGMENT_HEADER_BYTES - 4)  # the u32 after the magic
            f.write((FORMAT + 1).to_bytes(4, "little"))
    os.kill(index_pid, signal.SIGKILL)
    with pytest.raises(BufferUnavailableError, match="dead for good"):
        client.ledger()
    with pytest.raises(BufferUnavailableError) as caught:
        client.ledger()
    why = str(caught.value.__cause__)
    assert "JournalFormatError" in why and named in why
    assert f"journal format {FORMAT + 1}" in why and f"reads format {FORMAT} only" in why
    assert "the index stays down rather than guess" in why
    client.kill()
