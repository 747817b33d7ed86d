"""RemoteBuffer on a real local Ray: the API, errors, blocking, payload lifetime, Ray tasks and a second driver.

The session's private two-node cluster (``ray_cluster`` in conftest.py) serves every module; this one
connects to it for its tests. Producers are Ray actors, so every put below crosses a process boundary.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")


import pyfast_buffer as pfb  # noqa: E402
from pyfast_buffer.batch import metric_key  # noqa: E402
from pyfast_buffer.checkpoint import CheckpointError  # noqa: E402
from pyfast_buffer.ray import RemoteBatch, RemoteBuffer  # noqa: E402

# Workers unpickle this module's remote functions and actors by value: they need not (and, with the
# repository off their sys.path, cannot) import the test module itself.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.usefixtures("ray_namespace", "buffers_ended")

NAMESPACE = "pyfast_buffer_tests"
PAYLOAD_BYTES = 256 * 1024  # above Ray's 100 KiB inline limit: each payload lives in the shared object store


@ray.remote(num_cpus=0)
class Producer:
    """A rollout worker in its own process that puts into the shared buffer."""

    def __init__(self, client: RemoteBuffer) -> None:
        self.client = client

    def put(self, traj_ids: list, step: int, payload_seed: int = -1) -> int:
        payloads = None
        if payload_seed >= 0:  # distinct contents, checked by the trainer after this process is gone
            payloads = [np.full(PAYLOAD_BYTES // 8, payload_seed + i, np.int64) for i in range(len(traj_ids))]
        self.client.put(traj_ids, step, payloads=payloads)
        return time.perf_counter_ns()

    def ping(self) -> int:
        return 0


@ray.remote(num_cpus=0)
def put_and_count(client: RemoteBuffer, ids: list, step: int) -> dict:
    client.put(ids, step)
    return client.ledger()


def metric(batch: pfb.Batch, name: str) -> int:
    """The one place these tests read batch metrics (keys under the metrics prefix, set in the actor's process)."""
    return batch.metrics[metric_key(name)]


def object_store_used() -> tuple:
    """(bytes, objects) in this node's shared object store, from the raylet's own accounting."""
    from ray._private.internal_api import get_memory_info_reply, get_state_from_address

    reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
    return reply.store_stats.object_store_bytes_used, reply.store_stats.num_local_objects


def wait_until(predicate, what: str, limit_s: float = 60.0) -> None:
    """Polls ``predicate`` (a correctness check with a generous bound, not a timing claim)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {limit_s} s")
        time.sleep(0.1)


def test_client_offers_every_public_method_of_the_buffer():
    public = {n for n in dir(pfb.StalenessBuffer) if not n.startswith("_")}
    public |= {"__len__", "__enter__", "__exit__"}
    assert sorted(n for n in public if not hasattr(RemoteBuffer, n)) == []


def test_calls_return_the_buffers_types_and_values():
    client = RemoteBuffer.create(64, max_age=3)
    local = pfb.StalenessBuffer(64, max_age=3, pin_memory=False)
    for buf in (client, local):
        buf.dispatch([10, 11], 5)
        buf.complete([100, 101, 110], [10, 10, 11])
        buf.put([7, 8], 6, group_ids=[70, 70])
        buf.put([1], 0)
    assert len(client) == len(local) == 6
    assert client.in_flight == local.in_flight == 0
    assert client.evict_stale(6) == local.evict_stale(6) == 1
    remote_batch, local_batch = client.take(4, 6), local.take(4, 6)
    assert isinstance(remote_batch, RemoteBatch) and isinstance(remote_batch, pfb.Batch)
    assert remote_batch.columns.dtype == local_batch.columns.dtype
    assert remote_batch.columns.tolist() != [] and remote_batch.columns[:6].tolist() == local_batch.columns[:6].tolist()
    assert remote_batch.payloads is None
    remote_batch.columns[0] = -1  # the caller owns its tensors
    remote_ledger = client.ledger()
    assert {k: remote_ledger[k] for k in local.ledger()} == local.ledger()
    assert remote_ledger["payload_lost"] == remote_ledger["lost_in_restart"] == remote_ledger["index_restarts"] == 0
    sd = client.state_dict()
    assert sd["entries"]["traj_id"].tolist() == local.state_dict()["entries"]["traj_id"].tolist()
    assert client.config == local.config
    client.max_age = 0  # set from this process, in force in the actor for the next call
    assert client.max_age == 0 and client.config.max_age == 0
    client.put([50], 5)
    batch = client.take(8, 6)  # the group 70 (age 0) is taken, 50 (age 1) is now stale
    assert batch.traj_ids.tolist() == [7, 8] and metric(batch, "dropped_stale") == 1
    client.load_state_dict(sd)  # back to the state before max_age changed
    assert client.state_dict()["entries"]["traj_id"].tolist() == sd["entries"]["traj_id"].tolist() == [7, 8]


def test_errors_come_back_as_the_buffers_exception_types_and_close_wakes_a_blocked_take():
    client = RemoteBuffer.create(16, max_age=2, strategy="wait")
    client.put([1, 2], 0)
    before = client.ledger()
    with pytest.raises(ValueError, match="negative"):
        client.put([3], -1)
    with pytest.raises(TypeError, match="traj_ids"):
        client.put([1.5], 0)
    client.dispatch([9], 0)
    with pytest.raises(ValueError, match="already in flight"):  # raised in the actor, not by the client's checks
        client.dispatch([9], 0)
    with pytest.raises(TimeoutError, match="prompt 9"):
        client.take(1, 2, timeout=0.05)
    with pytest.raises(ValueError, match="capacity"):
        RemoteBuffer.create(0)
    assert client.ledger() == {**before, "dispatched": before["dispatched"] + 1, "in_flight": 1}
    caught: list = []

    def trainer() -> None:
        try:
            client.take(4, 2, timeout=60)
        except pfb.BufferClosedError as exc:
            caught.append(exc)

    blocked = threading.Thread(target=trainer)
    blocked.start()
    time.sleep(0.3)
    client.close()  # wakes the blocked take, in the actor, with BufferClosedError
    blocked.join(60)
    assert len(caught) == 1 and not blocked.is_alive()
    with pytest.raises(pfb.BufferClosedError):
        client.put([5], 0)


def test_a_lease_that_runs_out_frees_a_take_blocked_by_its_prompt_though_no_call_wakes_it():
    # A blocked call looks at the core again while prompts are in flight (RECHECK_S): a lease's end is no call.
    client = RemoteBuffer.create(16, max_age=2, strategy="wait")
    client.put([1], 2)
    client.dispatch([9], 0, lease=0.5)
    began = time.monotonic()
    batch = client.take(1, 2, timeout=60)  # prompt 9 could still come back fresh enough: wait blocks for it
    assert time.monotonic() - began >= 0.4  # not before its lease ran out (the actor's clock, a call away)
    assert batch.traj_ids.tolist() == [1]
    led = client.ledger()
    assert led["in_flight"] == 0 and led["expired"] == 1


def test_a_blocked_take_stalls_no_other_caller_and_a_put_from_another_process_wakes_it():
    client = RemoteBuffer.create(1024, max_age=5, blocking_calls=2)
    producer = Producer.remote(client)
    ray.get(producer.ping.remote())
    results: dict = {}

    def trainer(key: str) -> None:
        results[key] = client.take(8, 1, timeout=60)

    threads = [threading.Thread(target=trainer, args=(k,)) for k in ("a", "b")]
    for t in threads:
        t.start()
    wait_until(lambda: client.ledger()["taken"] == 0 and all(t.is_alive() for t in threads), "blocked")
    time.sleep(0.2)  # both takes now occupy every blocking thread of the actor
    client.put([1, 2], 1)  # quick calls still run
    assert len(client) == 2 and client.ledger()["put_total"] == 2
    assert all(t.is_alive() for t in threads)
    ray.get(producer.put.remote(list(range(100, 114)), 1))
    for t in threads:
        t.join(60)
    assert sorted(results["a"].traj_ids.tolist() + results["b"].traj_ids.tolist()) == [1, 2, *range(100, 114)]


def test_named_buffer_is_reachable_from_a_ray_task_and_a_second_driver():
    name = f"buffer-{uuid.uuid4().hex[:8]}"
    client = RemoteBuffer.create(64, max_age=3, name=name, namespace=NAMESPACE)
    assert RemoteBuffer.get(name, namespace=NAMESPACE).ledger() == client.ledger()
    script = (
        "import sys, ray\n"
        "from pyfast_buffer.ray import RemoteBuffer\n"
        "ray.init(address=sys.argv[1], namespace=sys.argv[2], log_to_driver=False, logging_level='ERROR')\n"
        "buf = RemoteBuffer.get(sys.argv[3])\n"
        "buf.put([900, 901], 5)\n"
        "print('len', len(buf))\n"
        "ray.shutdown()\n"
    )
    gcs = ray.get_runtime_context().gcs_address
    out = subprocess.run(
        [sys.executable, "-c", script, gcs, NAMESPACE, name],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tempfile.gettempdir(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "len 2" in out.stdout
    assert client.take(2, 5).traj_ids.tolist() == [900, 901]
    with pytest.raises(ValueError):
        RemoteBuffer.get(f"missing-{name}", namespace=NAMESPACE)
    ledger = ray.get(put_and_count.remote(client, [4, 5, 6], 5))  # the client itself, pickled into a task
    assert ledger["put_total"] == 5
    assert client.take(3, 5).traj_ids.tolist() == [4, 5, 6]


def test_payloads_survive_their_producer_and_are_freed_once_released():
    gc.collect()
    base_bytes, base_objects = object_store_used()
    client = RemoteBuffer.create(256, max_age=3, track_released=True)
    producer = Producer.remote(client)
    ray.get(producer.put.remote(list(range(8)), 0, 1000))  # stale at step 10: dropped by the take
    ray.get(producer.put.remote(list(range(8, 24)), 10, 1008))
    ray.kill(producer)  # the process that made the payloads is gone; the actor owns them
    n = 24
    wait_until(lambda: object_store_used()[0] >= base_bytes + n * PAYLOAD_BYTES, "in the object store")
    assert client.payloads_held() == n
    batch = client.take(8, 10)
    assert batch.traj_ids.tolist() == list(range(8, 16)) and metric(batch, "dropped_stale") == 8
    for i, ref in zip(batch.traj_ids.tolist(), batch.payloads):
        value = ray.get(ref, timeout=60)
        assert value.shape == (PAYLOAD_BYTES // 8,) and int(value[0]) == 1000 + i
        del value
    assert client.payloads_held() == 8  # taken ones retired (max_uses=1) and dropped ones: the actor let go
    client.max_age = 0
    assert client.evict_stale(12) == 8 and client.payloads_held() == 0
    released = client.released()
    assert sorted(released.of("retired").tolist()) == list(range(8, 16))
    assert sorted(released.of("dropped_stale").tolist()) == [*range(8), *range(16, 24)]
    del batch, ref
    gc.collect()
    wait_until(lambda: object_store_used()[0] <= base_bytes, "back to the baseline object store usage")
    assert object_store_used()[1] <= base_objects


def test_save_and_load_run_in_the_actor(tmp_path):
    client = RemoteBuffer.create(64, max_age=3, strategy="wait")
    client.put([1, 2, 3], 4)
    client.dispatch([50], 4)
    path = tmp_path / "buffer.ckpt"  # on the actor's node: here, the same machine
    client.save(path)
    client.fail([50])
    assert client.take(3, 4).traj_ids.tolist() == [1, 2, 3] and len(client) == 0
    failed = client.load(path, in_flight="fail")  # back to the saved state; its in-flight prompt is failed
    assert failed.tolist() == [50] and len(client) == 3 and client.in_flight == 0
    assert client.take(3, 4).traj_ids.tolist() == [1, 2, 3]
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(CheckpointError, match=r"(?i)checksum|torn|truncat|corrupt|short"):
        client.load(path)
    assert client.ledger()["taken"] == 3 and len(client) == 0


def test_payload_refs_are_adopted_by_the_payload_owner():
    client = RemoteBuffer.create(16)
    ref = ray.put(np.arange(10))
    client.put([1, 2], 0, payloads=[ref, {"tokens": [1, 2, 3]}])
    batch = client.take(2, 0)
    assert batch.payloads[0] != ref  # read and put again by the owner: it no longer depends on this process
    assert ray.get(batch.payloads[0]).tolist() == list(range(10))
    assert ray.get(batch.payloads[1]) == {"tokens": [1, 2, 3]}
    with pytest.raises(ValueError, match="one per trajectory"):
        client.put([3, 4], 0, payloads=[ref])
    client.put([5], 0, payloads=[ref])
    with pytest.raises(ValueError, match="already hold payloads"):
        client.put([5], 0, payloads=[ref])
    assert len(client) == 1 and client.payloads_held() == 1
