"""What the index actor spends per call, pinned down as behaviour (never as a time): a payload owner's group of
registrations is one journal record, the journal's record encoding is byte for byte the checkpoint module's
(and a real record never needs the checkpoint module's slower walk),
and a registration about to go to the index waits for those announced as coming (the owner's linger).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, List

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from pyfast_buffer import StalenessBuffer  # noqa: E402
from pyfast_buffer.checkpoint import _encode  # noqa: E402
from pyfast_buffer.ray import RemoteBuffer, _record_tree  # noqa: E402
from pyfast_buffer.ray._group import GroupCall  # noqa: E402
from pyfast_buffer.ray._journal import decode_record, encode_record  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
on_cluster = pytest.mark.usefixtures("ray_namespace", "buffers_ended")

NAMESPACE = "pyfast_buffer_index_cost_tests"
WAIT_S = 60.0  # a bound on a hang, not a speed claim


def reference_record(record: Any) -> bytes:
    """The record encoding as the journal wrote it before it was made faster (the on-disk format)."""
    import struct

    arrays: List[np.ndarray] = []
    tree = _encode(record, "record", arrays)
    specs = [{"dtype": a.dtype.str, "shape": list(a.shape)} for a in arrays]
    head = json.dumps({"tree": tree, "arrays": specs}, separators=(",", ":")).encode()
    return b"".join([struct.pack("<I", len(head)), head, *(a.tobytes() for a in arrays)])


# -- the record encoding: the same bytes ------------------------------------------------------------------------
_arrays = st.builds(
    lambda dtype, n, seed: np.random.default_rng(seed).integers(-50, 50, n).astype(dtype),
    st.sampled_from(["<i8", "<i4", "<f8", "|b1", "|u1", "<i2"]),
    st.integers(0, 6),
    st.integers(0, 2**16),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**62), 2**62),
    st.floats(),  # NaN and the infinities too: json's own spelling of them
    st.text(max_size=6),
    st.builds(np.int64, st.integers(-100, 100)),
    st.builds(np.float32, st.floats(-1, 1, width=32)),
    st.builds(np.bool_, st.booleans()),
)
_trees = st.recursive(
    st.one_of(
        _scalars,
        _arrays,
        _arrays.map(lambda a: a[::2]),
        _arrays.map(lambda a: a.reshape(1, -1)),
        _arrays.map(lambda a: a.reshape(-1, 1).T),  # a view that is not C-contiguous
        _arrays.map(lambda a: np.asarray(a[0]) if len(a) else a),  # 0-d: the checkpoint stores it 1-d
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=5), inner, max_size=4),
        st.dictionaries(st.integers(0, 3), inner, min_size=1, max_size=2),  # refused, as the checkpoint does
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_trees)
def test_a_record_encodes_to_the_same_bytes_as_the_checkpoint_encoding(tree):
    record = {"core": tree, "extra": {"x": 1}}
    try:
        expected = reference_record(record)
    except TypeError as exc:  # what the checkpoint format cannot hold: the same error, word for word
        with pytest.raises(TypeError) as raised:
            encode_record(record)
        assert str(raised.value) == str(exc)
        return
    assert encode_record(record) == expected


@pytest.mark.parametrize("depth", [62, 63, 64, 65, 66])
@pytest.mark.parametrize("leaf", [1, [], {}, [2], {"k": 3}])
def test_a_record_near_the_depth_bound_encodes_or_fails_as_the_checkpoint_does(depth, leaf):
    tree: Any = leaf
    for i in range(depth):
        tree = [tree] if i % 2 else {"k": tree}
    record = {"core": tree}
    try:
        expected = reference_record(record)
    except TypeError as exc:
        with pytest.raises(TypeError, match="nested deeper") as raised:
            encode_record(record)
        assert str(raised.value) == str(exc)
        return
    assert encode_record(record) == expected


def test_a_real_index_record_encodes_the_same_and_decodes_back(monkeypatch):
    buf = StalenessBuffer(64, max_age=5, track_released=True)
    buf._journal_delta(full=True)
    buf.put(np.arange(8), 0, np.arange(8) // 2)
    record = {
        "core": buf._journal_delta(),
        "max_age": buf.max_age,
        "extra": {"payload_lost": 0, "late_receipts": 2},
        "owner_nodes": ["node-a", ""],
        "done_takes": [[7, [np.zeros((8, 4), np.int64), {"mean_age": 0.5}, None, np.ones(4, bool)]], [3, None]],
        "report": [None],
    }
    expected = reference_record(record)

    def slow_path(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a real record left the fast encoding for checkpoint._encode")

    monkeypatch.setattr(_record_tree, "_encode", slow_path)  # every node of a real record has its own text
    payload = encode_record(record)
    assert payload == expected
    back = decode_record(payload, "test")
    assert sorted(back["core"]) == sorted(record["core"]) and back["done_takes"][0][1][1] == {"mean_age": 0.5}


@pytest.mark.parametrize(
    "bad, words",
    [({1: 2}, "key 1"), ({"a": object()}, "is a object"), (np.array(["x"]), "dtype <U1")],
)
def test_a_record_the_checkpoint_format_cannot_hold_raises_its_error(bad, words):
    with pytest.raises(TypeError, match=words):
        encode_record({"core": bad})


# -- the linger: announced registrations share a call ----------------------------------------------------------
def _recording_group(linger_s: float) -> Any:
    calls: List[List[Any]] = []

    def send(items: List[Any]) -> List[Any]:
        calls.append(list(items))
        return [i * 10 if isinstance(i, int) else None for i in items]

    return GroupCall(send, linger_s=linger_s), calls


def _in_thread(fn: Any) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_a_registration_about_to_go_waits_for_one_announced_and_both_share_the_call():
    group, calls = _recording_group(linger_s=WAIT_S)
    announced = threading.Event()
    results: dict = {}

    def second() -> None:
        group.announce()  # a put whose payloads are still being written
        announced.set()
        time.sleep(0.05)  # ...written; without the linger the first would have gone alone meanwhile
        results[2] = group.submit(2, announced=True)

    other = _in_thread(second)
    assert announced.wait(WAIT_S)
    group.announce()
    results[1] = group.submit(1, announced=True)
    other.join(WAIT_S)
    assert calls == [[1, 2]] and results == {1: 10, 2: 20}
    assert group.calls == 1 and group.items == 2


def test_nothing_announced_or_an_announced_put_that_failed_holds_nothing_up():
    group, calls = _recording_group(linger_s=10 * WAIT_S)  # a wait would outlast the joins below
    done = threading.Event()
    _in_thread(lambda: (group.submit(1), done.set()))
    assert done.wait(WAIT_S)  # nothing announced: sent at once
    withdrawn = threading.Event()

    def failing_put() -> None:
        group.announce()
        group.withdraw()  # failed before its registration was sent
        group.withdraw()  # a second withdraw (store's finally) changes nothing
        withdrawn.set()

    _in_thread(failing_put).join(WAIT_S)
    assert withdrawn.is_set()
    done.clear()
    _in_thread(lambda: (group.announce(), group.submit(2, announced=True), done.set()))
    assert done.wait(WAIT_S)
    assert calls == [[1], [2]]


# -- the index: one journal record per group of registrations ------------------------------------------------
@on_cluster
def test_a_group_of_registrations_is_one_journal_record():
    client = RemoteBuffer.create(64, max_age=5)
    client.put([1], 0, payloads=[np.zeros(4)])
    slot = ray.get(client.actor.owner_for.remote(ray.get_runtime_context().get_node_id()))[0]

    def admit(request: int, traj: int) -> tuple:
        call = {"kind": "put", "traj_ids": np.asarray([traj], np.int64), "sample_step": 0, "group_ids": None}
        return ("admit", request, {**call, "timeout": None}, np.asarray([32], np.int64), slot)

    before = ray.get(client.actor.journal_stats.remote())["records"]
    assert ray.get(client.actor.register.remote([admit(701, 30), admit(702, 31), admit(703, 32)])) == [None] * 3
    assert ray.get(client.actor.journal_stats.remote())["records"] == before + 1
    led = client.ledger()
    assert led["put_total"] == 4 and client.payloads_held() == 4 and len(client) == 4


# -- receipts: carried by the next take ------------------------------------------------------------------------
def _in_delivery(client: Any) -> int:
    """The index's own count, read without the client's ledger(), which sends and collects receipts first."""
    return int(ray.get(client.actor.ledger.remote())["in_delivery"])


@on_cluster
def test_a_take_carries_the_receipt_of_the_previous_take_instead_of_a_call_of_its_own(monkeypatch):
    from pyfast_buffer.ray import _receipts

    monkeypatch.setattr(_receipts, "RECEIPT_LINGER_S", 10 * WAIT_S)  # none is sent alone during this test
    client = RemoteBuffer.create(64, max_age=5)
    client.put(list(range(6)), 0, payloads=[np.full(4, i) for i in range(6)])
    first = client.take(4, 0)
    assert len(first) == 4 and _in_delivery(client) == 4  # its receipt waits for the next take
    second = client.take(4, 0)
    assert len(second) == 2 and _in_delivery(client) == 2  # that take carried it; its own receipt waits
    assert _receipts.receipts_for(client.actor).alone == 0  # no receipt was a call of its own
    led = client.ledger()  # sends what waits, collects it
    assert (led["in_delivery"], led["retired"], led["lost_in_delivery"], led["late_receipts"]) == (0, 6, 0, 0)
    assert _receipts.receipts_for(client.actor).alone == 1  # the one ledger() sent


@on_cluster
def test_a_receipt_no_take_carries_is_sent_alone_and_one_a_failed_take_carried_too(monkeypatch):
    from pyfast_buffer.ray import _receipts

    client = RemoteBuffer.create(64, max_age=5)
    client.put(list(range(4)), 0, payloads=[np.full(4, i) for i in range(4)])
    assert len(client.take(2, 0)) == 2
    deadline = time.monotonic() + WAIT_S
    while _in_delivery(client):  # the timer sends it after the linger: no take follows
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert _receipts.receipts_for(client.actor).alone == 1
    monkeypatch.setattr(_receipts, "RECEIPT_LINGER_S", 10 * WAIT_S)
    assert len(client.take(2, 0)) == 2 and _in_delivery(client) == 2
    with pytest.raises(TimeoutError):
        client.take(2, 0, timeout=0.05)  # the buffer is empty: this take fails, and its receipt is not lost
    assert _in_delivery(client) == 0
    assert _receipts.receipts_for(client.actor).alone == 2  # the failed take's carried receipt went alone
    led = client.ledger()
    assert (led["retired"], led["lost_in_delivery"], led["late_receipts"]) == (4, 0, 0)


def test_a_caller_never_lingers_for_its_own_announced_item():
    group, calls = _recording_group(linger_s=10 * WAIT_S)
    done = threading.Event()

    def budgeted_put() -> None:  # a byte budget's reservation goes first, its admission (announced) later
        group.announce()
        group.submit("reserve")
        group.submit("admit", announced=True)
        done.set()

    _in_thread(budgeted_put)
    assert done.wait(WAIT_S)
    assert calls == [["reserve"], ["admit"]]


def _lingering(group: Any) -> None:
    """Returns once a leader waits for announced items: its item is queued (it sets busy and starts waiting in
    the same hold of the lock, so a queued item seen from here is one waiting)."""
    deadline = time.monotonic() + WAIT_S
    while group.queued() != 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_a_registration_waits_for_puts_announced_before_it_began_not_for_those_after():
    group, calls = _recording_group(linger_s=10 * WAIT_S)  # a wait for the later put would outlast the joins
    first_announced, second_go, later_announced, later_go = (threading.Event() for _ in range(4))

    def put(item: int, announced: threading.Event, go: threading.Event) -> None:
        group.announce()
        announced.set()
        assert go.wait(WAIT_S)
        group.submit(item, announced=True)

    writing = _in_thread(lambda: put(2, first_announced, second_go))
    assert first_announced.wait(WAIT_S)
    lead = _in_thread(lambda: group.submit(1))
    _lingering(group)
    later = _in_thread(lambda: put(3, later_announced, later_go))  # announced while the leader waits
    assert later_announced.wait(WAIT_S)
    second_go.set()  # the put being written when the leader began arrives: the call goes without the later one
    lead.join(WAIT_S)
    writing.join(WAIT_S)
    assert not lead.is_alive() and calls == [[1, 2]]
    later_go.set()
    later.join(WAIT_S)
    assert calls == [[1, 2], [3]]


def test_a_registration_does_not_wait_for_a_put_whose_reservation_queues_behind_it():
    group, calls = _recording_group(linger_s=10 * WAIT_S)
    announced, reserved = threading.Event(), threading.Event()

    def budgeted_put() -> None:
        group.announce()
        announced.set()
        assert reserved.wait(WAIT_S)
        group.submit("reserve")  # its admission cannot come before this answers
        group.submit("admit", announced=True)

    other = _in_thread(budgeted_put)
    assert announced.wait(WAIT_S)
    lead = _in_thread(lambda: group.submit(1))
    _lingering(group)  # it waits for the announced admission...
    reserved.set()  # ...whose thread now queues its reservation behind it: the call goes with both
    lead.join(WAIT_S)
    other.join(WAIT_S)
    assert not lead.is_alive() and not other.is_alive()
    assert calls == [[1, "reserve"], ["admit"]]


@pytest.mark.usefixtures("ray_namespace")
def test_a_receipt_left_when_the_process_leaves_ray_breaks_no_later_session(ray_cluster):
    """The timer must not send a receipt after ``ray.shutdown()``: that call, on a handle of the session that
    ended, left this process unable to create working actors when it joined the cluster again (the next test
    modules' producer actors died "cancelled before it started running"). Last in this module: it leaves the
    cluster and joins it again, as the module fixtures do."""
    from pyfast_buffer.ray import _receipts

    client = RemoteBuffer.create(64, max_age=5)
    client.put(list(range(2)), 0)
    assert len(client.take(2, 0)) == 2  # its receipt waits for a take that will not come
    ray.shutdown()
    time.sleep(4 * _receipts.RECEIPT_LINGER_S + 0.5)  # the timer has run past it
    assert not ray.is_initialized()
    ray_cluster.connect(namespace=NAMESPACE)  # as the next module's fixture does
    from _ray_producer import pinned

    producer = pinned(1)  # a producer actor of the test modules, started and answering
    ray.kill(producer)


# -- Ray's task events: off for the index and its payload owners unless asked for --------------------------------
def _worker_id(handle: Any) -> str:
    return ray.get(handle.__ray_call__.remote(lambda self: ray.get_runtime_context().get_worker_id()), timeout=WAIT_S)


@on_cluster
def test_the_index_and_its_owners_are_out_of_rays_task_events_unless_actor_options_ask():
    quiet = RemoteBuffer.create(64, max_age=5)
    traced = RemoteBuffer.create(64, max_age=5, actor_options={"enable_task_events": True})
    workers = {}
    for label, client in (("quiet", quiet), ("traced", traced)):
        client.put([1, 2], 0, payloads=[np.zeros(4), np.ones(4)])
        assert sorted(client.take(2, 0, timeout=WAIT_S).traj_ids.tolist()) == [1, 2]
        (owner,) = [o for o in ray.get(client.actor.owners.remote(), timeout=WAIT_S) if o is not None]
        workers[label] = {"index": _worker_id(client.actor), "owner": _worker_id(owner)}
    seen: dict[str, set[object]] = {}

    def traced_recorded() -> tuple[bool, bool]:  # (its index's take, a call to its owner) are in `seen`
        def has(actor: str, prefix: str) -> bool:
            return any(str(c).startswith(prefix) for c in seen.get(workers["traced"][actor], ()))

        return has("index", "task::BufferActor.take"), has("owner", "task::PayloadOwner.")

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:  # Ray reports task events about once a second
        seen = {}
        for event in ray.timeline():
            seen.setdefault(str(event.get("tid", "")).removeprefix("worker:"), set()).add(event.get("cat"))
        if all(traced_recorded()):
            break
        time.sleep(0.5)
    index_recorded, owner_recorded = traced_recorded()
    assert index_recorded, "the traced index's take was recorded"
    assert owner_recorded, "the traced index's owner was recorded"
    assert workers["quiet"]["index"] not in seen and workers["quiet"]["owner"] not in seen, (
        "the default index and its owner record nothing"
    )


@on_cluster
@pytest.mark.parametrize("strategy", ["pace", "drop"])
def test_ids_a_take_retires_below_max_uses_are_in_delivery_and_let_go_of_at_once(monkeypatch, strategy):
    # Under pace every use is a group's last (retired_early), whatever max_uses: the index must treat those ids
    # as retired by the take (in delivery, payloads let go of), not wait for a uses count that never comes.
    from pyfast_buffer.ray import _receipts

    monkeypatch.setattr(_receipts, "RECEIPT_LINGER_S", 10 * WAIT_S)
    extra = {"prompts_per_step": 4, "lookahead": 0} if strategy == "pace" else {}
    client = RemoteBuffer.create(64, max_age=5, strategy=strategy, max_uses=3, **extra)
    client.put(list(range(4)), 0, payloads=[np.full(4, i) for i in range(4)])
    batch = client.take(4, 0)
    assert sorted(batch.traj_ids.tolist()) == [0, 1, 2, 3]
    assert [int(v[0]) for v in ray.get(batch.payloads)] == batch.traj_ids.tolist()
    left = 0 if strategy == "pace" else 4  # under drop the entries stay for two more uses, payloads too
    assert _in_delivery(client) == 4 - left and client.payloads_held() == left
    led = client.ledger()
    assert led["retired"] == 4 - left and led["retired_early"] == 4 - left and led["in_delivery"] == 0
    assert led["payload_bytes_held"] == (0 if left == 0 else led["payload_bytes_held"])
    assert len(client) == left
    if strategy == "drop":  # the third use retires them at max_uses, as before
        for _ in range(2):
            assert sorted(client.take(4, 0).traj_ids.tolist()) == [0, 1, 2, 3]
        led = client.ledger()
        assert (led["retired"], led["retired_early"], client.payloads_held(), len(client)) == (4, 0, 0, 0)
    assert led["payload_bytes_held"] == 0 and led["lost_in_delivery"] == 0
