"""The append-only journal through a real index on the session's two-node cluster: SIGKILL the index after a
mix of calls (one large enough to start a background snapshot, many small ones after it) and the restarted
index holds exactly the state it had: every entry column, the in-flight prompts, the ledger, the report.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Dict

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from pyfast_buffer.ray import RemoteBuffer  # noqa: E402
from pyfast_buffer.ray._calls import BufferUnavailableError  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # its functions run inside the index
pytestmark = pytest.mark.usefixtures("ray_namespace", "buffers_ended")  # the session's two-node cluster

NAMESPACE = "pyfast_buffer_journal_tests"


def _state(client: RemoteBuffer) -> dict:
    return ray.get(client.actor.state_dict.remote(), timeout=120)


def _after_restart(client: RemoteBuffer, pid: int) -> int:
    deadline = time.monotonic() + 180
    while True:
        try:
            new = ray.get(client.actor.pid.remote(), timeout=30)
            if new != pid:
                return new
        except (BufferUnavailableError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        assert time.monotonic() < deadline, "the index did not come back within 180 s"
        time.sleep(0.5)


def test_a_killed_index_comes_back_with_exactly_its_state():
    client = RemoteBuffer.create(1 << 17, max_age=50, max_uses=2, track_released=True, on_full="evict_oldest")
    big = np.arange(70_000, dtype=np.int64)
    client.put(big, 0)  # a ~5 MB record: the log passes the snapshot bound, a snapshot follows in the background
    client.dispatch(np.asarray([900_000, 900_001, 900_002]), 1, lease=600.0)
    for i in range(40):  # small records after it, some taking, some putting groups
        client.put(np.arange(4, dtype=np.int64) + 1_000_000 + 4 * i, 1 + i // 10, group_ids=np.full(4, i))
        if i % 3 == 0:
            client.take(8, 2 + i // 10)
    client.complete(np.asarray([2_000_000, 2_000_001]), np.asarray([900_001, 900_001]))
    client.fail(np.asarray([900_002]))
    client.released()  # a drain of the report is journaled too
    client.take(16, 6)
    before, ledger, stats = _state(client), client.ledger(), ray.get(client.actor.journal_stats.remote())
    assert stats["snapshots"] >= 1 and stats["records"] > 40
    pid = ray.get(client.actor.pid.remote())
    os.kill(pid, signal.SIGKILL)
    _after_restart(client, pid)
    after, again = _state(client), client.ledger()
    for column, values in before["entries"].items():
        assert torch.equal(values, after["entries"][column]), column
    for column in ("prompt_id", "sample_step", "dispatch_ns", "meta"):
        assert torch.equal(before["in_flight"][column], after["in_flight"][column]), column
    assert after["in_flight"]["lease_left_ns"].tolist()[0] > 0  # the lease kept the time it had left
    assert before["attempts"].keys() == after["attempts"].keys()
    for column, values in before["attempts"].items():
        assert torch.equal(values, after["attempts"][column]), column
    assert again.pop("index_restarts") == ledger.pop("index_restarts") + 1
    assert again == ledger and again["lost_in_restart"] == 0
    assert torch.equal(before["source_counts"], after["source_counts"])


def _payload_tables(self):
    """Inside the index: its payload tables (owner slot and bytes per id) and the bytes it counts as held."""
    with self._lock:
        return dict(self._where), dict(self._sizes), self._bytes_held


def _snapshot_now(self):
    self._journal.snapshot()
    return self._journal.stats()["snapshots"]


def test_payload_tables_come_back_from_a_snapshot_and_the_records_after_it():
    """A snapshot's payload tables are copied under the index lock and made arrays after it (issue 20): what a
    restart rebuilds from such a snapshot and the records after it is every id's owner slot and size."""
    client = RemoteBuffer.create(1 << 12, max_age=50, capacity_bytes=1 << 30)
    lengths = {}
    for i in range(6):  # payloads of several sizes, so a size in the wrong id's place would show
        ids = np.arange(8, dtype=np.int64) + 8 * i
        lengths.update((8 * i + k, 16 + 8 * ((k + i) % 5)) for k in range(8))
        client.put(ids, 0, payloads=[np.zeros(lengths[8 * i + k], np.uint8) for k in range(8)])
    assert ray.get(client.actor.__ray_call__.remote(_snapshot_now), timeout=120) >= 1
    client.take(8, 1)  # after the snapshot: ids leave, and more come
    client.put(np.arange(100, 108, dtype=np.int64), 1, payloads=[np.zeros(40, np.uint8)] * 8)
    lengths.update((k, 40) for k in range(100, 108))
    where, sizes, held = ray.get(client.actor.__ray_call__.remote(_payload_tables), timeout=120)
    assert len(where) == len(sizes) == 48 and held == sum(sizes.values()) and len(set(sizes.values())) >= 5
    pid = ray.get(client.actor.pid.remote())
    os.kill(pid, signal.SIGKILL)
    _after_restart(client, pid)
    again = ray.get(client.actor.__ray_call__.remote(_payload_tables), timeout=120)
    assert again == (where, sizes, held)
    batch, values = client.fetch(client.take(48, 2), timeout=120)
    assert sorted(batch.traj_ids.tolist()) == sorted(where) and not len(batch.lost)
    assert [len(v) for v in values] == [lengths[k] for k in batch.traj_ids.tolist()]
    client.kill()


@pytest.mark.parametrize("journal, soft", [(None, False), ("/shared/index.pfb", True)])
def test_the_index_restarts_only_where_its_journal_can_be(journal, soft):
    """The default journal is a file of the creating node, so the index is held there (hard): a soft placement
    let a restart under load land on the other node, which has no journal. A journal path the caller gave may
    be shared storage, so the index may move when its node is lost."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from pyfast_buffer.ray._arguments import index_placement

    placement = index_placement(journal)
    assert isinstance(placement, NodeAffinitySchedulingStrategy)
    assert placement.node_id == ray.get_runtime_context().get_node_id() and placement.soft is soft


def _settled_journal(client: RemoteBuffer) -> Dict[str, Any]:
    """The journal's stats once no snapshot is due or being written (so the next call's snapshots are counted
    alone; on a loaded machine the snapshot thread may still be at one the log's size made due)."""
    deadline = time.monotonic() + 120
    while True:
        stats: Dict[str, Any] = ray.get(client.actor.journal_stats.remote())
        if not stats["snapshot_busy"]:
            return stats
        assert time.monotonic() < deadline, f"the journal's snapshot thread never settled: {stats}"
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["load", "load_state_dict"])
def test_a_load_is_journaled_as_one_snapshot_and_comes_back_after_a_kill(tmp_path, how):
    """A load replaces the whole state: the index journals it as a snapshot before the call answers, not as a
    record of every entry; a SIGKILL after it (and calls after it) brings back exactly the loaded state."""
    client = RemoteBuffer.create(1 << 17, max_age=50, on_full="evict_oldest")
    client.put(np.arange(60_000, dtype=np.int64), 0)  # a ring whose record would be ~3 MB
    path = tmp_path / "buffer.ckpt"  # on the index's node: here, the same machine
    saved = _state(client)
    client.save(path)
    client.take(1_000, 1)  # the live state moves on from the checkpoint
    client.put(np.arange(4, dtype=np.int64) + 500_000, 1)
    before = _settled_journal(client)  # the 60,000 entries' record may have made a snapshot of its own due
    if how == "load":
        client.load(path)
    else:
        client.load_state_dict(saved)
    after = ray.get(client.actor.journal_stats.remote())
    assert after["snapshots"] == before["snapshots"] + 1
    assert after["bytes"] - before["bytes"] < 100_000  # no record of the 60,000 entries was appended
    assert len(client) == 60_000
    client.put(np.arange(4, dtype=np.int64) + 600_000, 1)  # a record after the load's snapshot
    state, ledger = _state(client), client.ledger()
    pid = ray.get(client.actor.pid.remote())
    os.kill(pid, signal.SIGKILL)
    _after_restart(client, pid)
    again = _state(client)
    for column, values in state["entries"].items():
        assert torch.equal(values, again["entries"][column]), column
    assert len(client) == 60_004
    restarted = client.ledger()
    assert restarted.pop("index_restarts") == ledger.pop("index_restarts") + 1 and restarted == ledger
    client.kill()


def test_a_restamp_is_journaled_and_a_restarted_index_gates_by_it():
    """In-flight weight updates through the index: restamp_in_flight raises the in-flight stamps, the journal keeps
    them, and after a SIGKILL the restarted index judges the straggler by its raised stamp (the take goes through)."""
    client = RemoteBuffer.create(64, max_age=1, strategy="wait", age_from="finish")
    client.dispatch(np.asarray([1]), 0)  # a straggler
    client.put(np.asarray([10, 11]), 1)
    assert len(client.take(1, 1)) == 0  # prompt 1, stamped 0, is at max_age: the gate holds the take
    assert client.restamp_in_flight(1) == 1 and client.restamp_in_flight(1) == 0
    pid = ray.get(client.actor.pid.remote())
    os.kill(pid, signal.SIGKILL)
    _after_restart(client, pid)
    assert _state(client)["in_flight"]["sample_step"].tolist() == [1]
    assert client.take(1, 1).traj_ids.tolist() == [10]
