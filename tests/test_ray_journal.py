"""The Ray index's append-only journal without Ray: deltas replay to the exact state, torn or corrupt records
are ignored, and a record's size follows the change, not the ring.

The index always holds a native StalenessBuffer (its journal reads the core's change marks,
csrc/change_marks.hpp), so these run on the native buffer only; the twin has no journal to test.
"""

from __future__ import annotations

import os
import pickle
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pyfast_buffer as pfb
from pyfast_buffer.buffer import packed_state
from pyfast_buffer.checkpoint import load_state, save_state

# The journal needs no cluster, but it is a part of pyfast_buffer.ray, which imports ray.
pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from pyfast_buffer.bench import journal_records as records
from pyfast_buffer.ray import _journal
from pyfast_buffer.ray._ring_replay import CoreReplay, trimmed

OPS = (
    "put",
    "put_group",
    "take",
    "dispatch",
    "complete",
    "fail",
    "renew",
    "evict_stale",
    "evict_oldest",
    "expire",
    "tick",
    "load",
)


def _same(a, b, where="state"):
    """Asserts two state_dict trees are equal (tensors element by element)."""
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where}: {a} != {b}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _config(capacity: int, max_uses: int, strategy: str, sources: bool = False) -> dict:
    extra = {"prompts_per_step": 64} if strategy == "pace" else {}
    if sources:  # source 1 goes stale sooner: evict_stale removes its rows from the middle of the ring
        extra["source_max_age"] = {1: 1}
    return dict(capacity=capacity, max_age=3, max_uses=max_uses, strategy=strategy, on_full="evict_oldest", **extra)


class _Driver:
    """Random calls on a native buffer with a frozen lease clock, so a replayed state can equal the live one."""

    def __init__(self, data, capacity: int, max_uses: int, strategy: str, sources: bool = False) -> None:
        config = _config(capacity, max_uses, strategy, sources)
        self.buf = pfb.StalenessBuffer(**config, track_released=True, pin_memory=False)
        self.data, self.now, self.step, self.next_id = data, 10**12, 0, 0
        self.sources = sources
        self.buf._set_lease_clock(self.now)
        self.in_flight: list = []

    def ids(self, n: int) -> np.ndarray:
        out = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n
        return out

    def run(self, op: str) -> None:
        d, buf = self.data, self.buf
        step = self.step + d.draw(st.integers(0, 2))
        try:
            source = d.draw(st.sampled_from([0, 1])) if self.sources else None
            if op == "put":  # stamps out of order: evict_stale then compacts
                buf.put(self.ids(d.draw(st.integers(1, 6))), d.draw(st.integers(max(0, step - 4), step)), source=source)
            elif op == "put_group":
                n, g = d.draw(st.integers(1, 3)), d.draw(st.integers(1, 3))
                buf.put(self.ids(n * g), step, group_ids=np.repeat(self.ids(g), n), source=source)
            elif op == "take":
                buf.take(d.draw(st.integers(1, 8)), step)
                self.step = step
            elif op == "dispatch":
                prompts = self.ids(d.draw(st.integers(1, 3)))
                lease = d.draw(st.sampled_from([None, 0.5, 5.0]))
                buf.dispatch(prompts, step, lease=lease, source=source)
                self.in_flight += prompts.tolist()
            elif op in ("complete", "fail", "renew") and self.in_flight:
                prompt = self.in_flight.pop(d.draw(st.integers(0, len(self.in_flight) - 1)))
                if op == "complete":
                    n = d.draw(st.integers(1, 3))
                    buf.complete(self.ids(n), np.full(n, prompt, np.int64), lengths=np.arange(1, n + 1))
                elif op == "fail":
                    buf.fail(np.asarray([prompt]))
                else:
                    buf.renew(np.asarray([prompt]), 2.0)
                    self.in_flight.append(prompt)
            elif op == "evict_stale":
                buf.evict_stale(step)
                self.step = step
            elif op == "evict_oldest":  # what the Ray index's capacity_bytes eviction calls
                buf.evict_oldest(d.draw(st.integers(0, 3)))
            elif op == "expire":
                buf.expire_in_flight(d.draw(st.sampled_from([0.0, 1.0])))
            elif op == "tick":
                self.now += d.draw(st.sampled_from([10**8, 10**9]))
                buf._set_lease_clock(self.now)
            elif op == "load":
                buf.load_state_dict(buf.state_dict())
        except (ValueError, RuntimeError, TimeoutError):
            pass  # a refused call changes nothing; the replay must agree with that too
        self.in_flight = [p for p in self.in_flight if p in set(buf.state_dict()["in_flight"]["prompt_id"].tolist())]


@settings(max_examples=80, deadline=None)
@given(
    data=st.data(),
    ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=40),
    capacity=st.sampled_from([8, 32]),
    max_uses=st.sampled_from([1, 2]),
    strategy=st.sampled_from(["drop", "wait", "pace"]),
    sources=st.booleans(),
)
def test_deltas_replay_to_the_exact_state(data, ops, capacity, max_uses, strategy, sources):
    """After any sequence of calls, the first whole export plus every delta rebuilds the buffer's state_dict:
    out-of-order stamps and per-source bounds (evict_stale compacts the middle), pace's re-sorts after an
    out-of-order complete, evict_oldest (the Ray index's byte budget), loads."""
    drv = _Driver(data, capacity, max_uses, strategy, sources)
    drv.run("put")
    whole = drv.buf._journal_delta(full=True)
    replay, from_records = CoreReplay(whole), CoreReplay(whole)
    for op in ops:
        drv.run(op)
        delta = drv.buf._journal_delta()
        replay.apply(delta)
        # As the index journals it: trimmed of its empty arrays, through a record's encoding and back.
        from_records.apply(_journal.decode_record(_journal.encode_record({"core": trimmed(delta)}), "test")["core"])
        _same(packed_state(drv.buf.config, replay.export()), drv.buf.state_dict())
        _same(packed_state(drv.buf.config, from_records.export()), drv.buf.state_dict())
    again = pfb.StalenessBuffer(**_config(capacity, max_uses, strategy, sources), pin_memory=False)
    again.load_state_dict(packed_state(again.config, replay.export()))  # and the core accepts it


def _open_journal(path, records, snapshot_bytes=1 << 30):
    """A journal whose state is the list of record numbers so far (its snapshot copies it)."""
    lock = threading.RLock()
    box = {"n": 0}
    j = _journal.Journal(
        path,
        lambda: lock,
        lambda: {"upto": np.asarray(records, np.int64)},
        lambda: {"n": box["n"]},
        snapshot_bytes=snapshot_bytes,
    )
    return j, lock, box


def _append(j, lock, box, done, i):
    """One change (record number i) journaled and waited for, as the index does it."""
    with lock:
        box["n"] = i
        done.append(i)
        seq = j.mark()
    j.wait(seq)
    return seq


def _state_after(read):
    snap, recs, last = read
    return snap["upto"].tolist() + [r["n"] for r in recs], last


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 30), cut=st.floats(0, 1), snapshot_bytes=st.sampled_from([64, 1 << 30]))
def test_a_torn_last_record_is_ignored(tmp_path_factory, n, cut, snapshot_bytes):
    """Kill mid-append = truncate the log at any byte: the restart sees exactly the records written whole."""
    path = str(tmp_path_factory.mktemp("j") / "index.pfb")
    done: list = []
    j, lock, box = _open_journal(path, done, snapshot_bytes)
    for i in range(1, n + 1):
        with lock:
            box["n"] = i
            done.append(i)
            seq = j.mark()
        j.wait(seq)
    j.snapshot() if snapshot_bytes == 64 else None
    with lock:  # one more record after the last snapshot, so there is a tail to cut
        box["n"] = n + 1
        done.append(n + 1)
        seq = j.mark()
    j.close()
    whole, last = _state_after(_journal.read(path))
    assert whole == list(range(1, n + 2)) and last == seq
    if not _journal.segments(path):
        return  # a background snapshot took the last record too: no log left to cut
    (first, tail), *_ = reversed(_journal.segments(path))
    size = os.path.getsize(tail)
    ends = _journal.SEGMENT_HEADER_BYTES + np.cumsum([16 + len(p) for _, p in _journal.frames(tail)[0]])
    keep = int(cut * size)
    with open(tail, "r+b") as f:
        f.truncate(keep)
    whole_left = int((ends <= keep).sum())  # the records the cut left whole
    got, last = _state_after(_journal.read(path))
    assert got == list(range(1, first + whole_left)) and last == first + whole_left - 1


def test_a_corrupt_record_ends_the_replay_there(tmp_path):
    path = str(tmp_path / "index.pfb")
    done: list = []
    j, lock, box = _open_journal(path, done)
    for i in range(1, 6):
        _append(j, lock, box, [], i)
    j.close()
    ((_, seg),) = _journal.segments(path)
    records, _ = _journal.frames(seg)
    at = _journal.SEGMENT_HEADER_BYTES + sum(16 + len(p) for _, p in records[:3]) + 20  # in the fourth record
    with open(seg, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))
    got, last = _state_after(_journal.read(path))
    assert got == [1, 2, 3] and last == 3


def test_a_restart_drops_the_torn_tail_and_goes_on(tmp_path):
    path = str(tmp_path / "index.pfb")
    done: list = []
    j, lock, box = _open_journal(path, done)
    for i in range(1, 4):
        _append(j, lock, box, done, i)
    j.close()
    ((_, seg),) = _journal.segments(path)
    with open(seg, "ab") as f:
        f.write(b"\x10\x00\x00\x00partial")  # a record the process died writing
    got, last = _state_after(_journal.read(path))
    assert got == [1, 2, 3]
    lock2 = threading.RLock()
    box2 = {"n": 3}
    j2 = _journal.Journal(
        path, lambda: lock2, lambda: {"upto": np.asarray(got, np.int64)}, lambda: {"n": box2["n"]}, seq=last
    )
    with lock2:
        box2["n"] = 4
        j2.wait(j2.mark())
    got, last = _state_after(_journal.read(path))
    assert got == [1, 2, 3, 4] and last == 4


def _journal_of_three(path):
    done: list = []
    j, lock, box = _open_journal(path, done)
    for i in range(1, 4):
        _append(j, lock, box, done, i)
    j.close()


def test_a_journal_of_another_format_is_refused_naming_the_file_and_both_versions(tmp_path):
    """A snapshot whose format field is not this code's is refused, not read as if it were."""
    path = str(tmp_path / "index.pfb")
    _journal_of_three(path)
    assert _journal.read(path) is not None  # this format reads
    snap = load_state(path)
    assert snap["format"] == _journal.FORMAT
    save_state({**snap, "format": _journal.FORMAT + 1}, path)
    with pytest.raises(_journal.JournalFormatError) as caught:
        _journal.read(path)
    why = str(caught.value)
    assert path in why and f"format {_journal.FORMAT + 1}" in why and f"reads format {_journal.FORMAT}" in why
    assert "kill() the buffer" in why and caught.value.expected == _journal.FORMAT
    again = pickle.loads(pickle.dumps(caught.value))  # as Ray sends a restart's error to the buffer's callers
    assert type(again) is _journal.JournalFormatError and str(again) == why and again.found == _journal.FORMAT + 1


def test_a_segment_of_another_format_is_refused(tmp_path):
    """Each segment names its format too: a segment of another one is refused, naming that segment."""
    path = str(tmp_path / "index.pfb")
    _journal_of_three(path)
    ((_, seg),) = _journal.segments(path)
    with open(seg, "r+b") as f:
        f.seek(4)  # the u32 after the magic
        f.write((_journal.FORMAT + 7).to_bytes(4, "little"))
    with pytest.raises(_journal.JournalFormatError, match=f"format {_journal.FORMAT + 7}") as caught:
        _journal.read(path)
    assert seg in str(caught.value)
    with open(seg, "r+b") as f:
        f.write(b"JUNK")  # no header at all (as a segment written before formats were numbered)
    with pytest.raises(_journal.JournalFormatError, match="no journal segment header"):
        _journal.read(path)


def _size_or_zero(segment: str) -> int:
    """A segment's size, or 0 when the snapshot thread deleted it between the listing and this call."""
    try:
        return os.path.getsize(segment)
    except FileNotFoundError:
        return 0


def test_snapshots_bound_the_log_and_keep_the_state(tmp_path):
    """With a small snapshot bound, snapshots happen in the background and the log is truncated behind them."""
    path = str(tmp_path / "index.pfb")
    done: list = []
    j, lock, box = _open_journal(path, done, snapshot_bytes=256)
    for i in range(1, 200):
        _append(j, lock, box, done, i)
    logged = lambda: sum(_size_or_zero(s) for _, s in _journal.segments(path))  # noqa: E731
    deadline = time.monotonic() + 30
    while logged() > j.stats()["bytes"] // 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # the snapshot thread catches up in the background
    assert j.stats()["snapshots"] >= 1
    assert logged() <= j.stats()["bytes"] // 2  # segments behind a snapshot were deleted
    got, last = _state_after(_journal.read(path))
    assert got == list(range(1, 200)) and last == 199


def test_a_read_that_loses_a_segment_to_a_snapshot_reads_again_from_that_snapshot(tmp_path, monkeypatch):
    """The race CI hit once: a snapshot of the live journal deleted a segment between read's listing and its open.
    The first listing here names a segment that no longer exists (as the snapshot thread leaves it); read starts
    again from the snapshot on disk and returns the whole state."""
    path = str(tmp_path / "index.pfb")
    done: list = []
    j, lock, box = _open_journal(path, done, snapshot_bytes=256)
    for i in range(1, 60):
        _append(j, lock, box, done, i)
    deadline = time.monotonic() + 30
    while j.stats()["snapshot_busy"] and time.monotonic() < deadline:
        time.sleep(0.05)
    listed = _journal.segments
    stale = [(0, str(tmp_path / "index.pfb.0000000000000000.log"))]  # deleted behind a snapshot
    calls = []

    def first_listing_is_stale(p):
        calls.append(p)
        return stale + listed(p) if len(calls) == 1 else listed(p)

    monkeypatch.setattr(_journal, "segments", first_listing_is_stale)
    got, last = _state_after(_journal.read(path))
    assert got == list(range(1, 60)) and last == 59 and len(calls) == 2


def test_a_snapshot_the_log_made_due_shows_as_busy_until_written_and_a_call_snapshot_stands_for_it(tmp_path):
    """``snapshot_busy`` is true from the moment the log's size makes a snapshot due until it is written (a test
    that counts a call's snapshots waits for it to clear); a snapshot a call takes holds the log so far, so
    the bytes logged before it no longer count towards the next one."""
    path = str(tmp_path / "index.pfb")
    done: list = []
    j, lock, box = _open_journal(path, done, snapshot_bytes=256)
    with lock:  # held: the snapshot thread can take the due snapshot but not capture it
        for i in range(1, 40):
            _append(j, lock, box, done, i)  # the RLock lets the caller's own marks through
        assert j.stats()["bytes"] >= 256
        assert j.stats()["snapshot_busy"] and j.stats()["snapshots"] == 0  # due or waiting for the lock
    deadline = time.monotonic() + 30  # a hang guard, not a speed check
    while j.stats()["snapshot_busy"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not j.stats()["snapshot_busy"] and j.stats()["snapshots"] == 1
    small = _journal.Journal(
        str(tmp_path / "other.pfb"), lambda: lock, lambda: {"upto": np.asarray(done, np.int64)}, lambda: {"n": 0}
    )
    with small._cv:
        small._since_snapshot, small._snapshot_due = 10**9, True  # as after a large record
    small.snapshot()
    assert small._since_snapshot == 0 and not small._snapshot_due
    small.close()
    j.close()
    assert _state_after(_journal.read(path)) == (list(range(1, 40)), 39)


@pytest.mark.parametrize("snapshot_bytes", [256, 1 << 30])
def test_concurrent_callers_write_for_each_other_and_every_record_lands_in_order(tmp_path, snapshot_bytes):
    """The waiting caller writes the pending records itself (group commit without a writer hand-off): with many
    callers at once, and snapshots rotating segments under them, every record is written once, in seq order."""
    path = str(tmp_path / "index.pfb")
    done: list = []
    j, lock, box = _open_journal(path, done, snapshot_bytes)
    errors: list = []

    def caller(k):
        try:
            for _ in range(150):
                with lock:
                    i = box["n"] + 1
                    box["n"] = i
                    done.append(i)
                    seq = j.mark()
                assert seq == i
                j.wait(seq)
                assert j._written >= seq  # waited means written
        except BaseException as exc:  # reported below, with the thread's name
            errors.append((k, exc))

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads)
    j.close()
    got, last = _state_after(_journal.read(path))
    assert got == list(range(1, 901)) and last == 900
    assert j.stats()["records"] == 900 and 1 <= j.stats()["writes"] <= 900


def test_a_record_nobody_waits_for_is_written_without_a_wait(tmp_path):
    """``mark(later=True)`` (a lone receipt), or a mark whose caller never waits, is written by the journal's
    thread on its own: a restart after it sees the record although no call waited and nothing was closed."""
    path = str(tmp_path / "index.pfb")
    done: list = []
    j, lock, box = _open_journal(path, done)
    for i, later in ((1, True), (2, False)):
        with lock:
            box["n"] = i
            done.append(i)
            j.mark(later=later)
    deadline = time.monotonic() + 30  # a hang guard, not a speed check: LATE_S is 50 ms
    while _state_after(_journal.read(path))[1] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    got, last = _state_after(_journal.read(path))
    assert got == [1, 2] and last == 2
    j.close()


def test_a_write_that_fails_reaches_every_waiting_call(tmp_path):
    path = str(tmp_path / "index.pfb")
    done: list = []
    j, lock, box = _open_journal(path, done)
    _append(j, lock, box, done, 1)
    good = j._fd
    j._fd = os.open(os.devnull, os.O_RDONLY)  # writes on it fail (EBADF), as a full disk's would
    try:
        for i in (2, 3):  # the first call meets the failure as the writer, the next one as a waiter
            with pytest.raises(OSError, match="could not be written"):
                _append(j, lock, box, done, i)
    finally:
        j.close()
        os.close(good)
    got, last = _state_after(_journal.read(path))
    assert got == [1] and last == 1


@pytest.mark.parametrize("call", records.CALLS)
def test_record_bytes_do_not_grow_with_the_ring(call):
    """Each call's delta is as large at 16,384 entries as at 1,024: it carries the change (64 rows, the runs
    kept around them), not the ring; and the deltas replay to the live state."""
    sizes = []
    for capacity in (1024, 16384):
        buf = records.ring_for(call, capacity)
        buf._set_lease_clock(time.monotonic_ns())  # frozen: in-flight times in the replay equal the live ones
        replay = CoreReplay(buf._journal_delta(full=True))
        per_call, runs = [], []
        for i in range(records.ROUNDS):
            records.run_round(buf, call, capacity, i)
            delta = buf._journal_delta()
            per_call.append(records.record_bytes(delta))
            runs.append(len(delta["runs"]) // 3)
            replay.apply(delta)
            _same(packed_state(buf.config, replay.export()), buf.state_dict())
        if call.startswith("evict_stale"):
            assert min(runs) >= 32, runs  # rows left the middle: the delta keeps the runs between them
        if call == "pace_resort":
            assert runs[1:] == [2] * (len(runs) - 1), runs  # the rows before the moved ones, and those after
        sizes.append(max(per_call))
    small, large = sizes
    assert abs(large - small) < 64, sizes  # only the digits of larger ids and counters in the JSON tree differ
    whole = records.record_bytes(buf._journal_delta(full=True))
    assert large * 20 < whole, (large, whole)  # and far below the whole ring's


def test_a_compaction_past_the_run_cap_writes_the_rest_as_rows():
    """Past the marks' run cap (max(64, capacity / 8) runs) the rest of the ring is written as changed rows:
    a larger record, replayed exactly all the same."""
    capacity = 1024
    buf = pfb.StalenessBuffer(capacity=capacity, max_age=100, on_full="evict_oldest", pin_memory=False)
    ids = np.arange(capacity, dtype=np.int64)
    buf.put(ids, np.where(ids % 3 == 0, 0, 50))  # 342 stale rows, each alone between fresh ones
    replay = CoreReplay(buf._journal_delta(full=True))
    assert buf.evict_stale(101) == 342
    delta = buf._journal_delta()
    assert len(delta["runs"]) // 3 == capacity // 8  # capped
    kept = np.asarray(delta["runs"]).reshape(-1, 3)[:, 2].sum()
    assert len(delta["traj_id"]) == capacity - 342 - kept  # what the runs do not keep is written
    replay.apply(delta)
    _same(packed_state(buf.config, replay.export()), buf.state_dict())


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["hold", "forget", "put_id", "take_id", "report", "drain", "record"]), st.integers(0, 20)
        ),
        max_size=60,
    )
)
def test_the_index_tables_replay_from_their_logs(ops):
    """The index's own tables (owners, sizes, remembered requests and replies, the report) replay exactly."""
    from pyfast_buffer.ray import _effects
    from pyfast_buffer.released import Released

    where, sizes = _effects.LoggedDict(), _effects.LoggedDict()
    puts, takes = _effects.LoggedOrderedDict(), _effects.LoggedOrderedDict()
    report = _effects.JournaledReport(bound=8)
    tables = (where, sizes, puts, takes, report)
    empty = np.empty(0, np.int64)
    snap = {
        "payload_ids": empty,
        "payload_slots": empty,
        "payload_bytes": empty,
        "done_puts": empty,
        "done_takes": [],
        "report_ids": empty,
        "report_reasons": empty,
        "report_overflow": 0,
        "max_age": 3,
        "extra": {},
        "owner_nodes": [],
    }
    replay = _effects.TablesReplay(snap, remembered_puts=5, remembered_takes=3, bound=8)
    _effects.start_logs(*tables)

    def record():
        payload = _journal.encode_record({"max_age": 3, "extra": {}, "owner_nodes": [], **_effects.take_logs(*tables)})
        replay.apply(_journal.decode_record(payload, "test"))

    for op, k in ops:
        if op == "hold":
            where[k], sizes[k] = k % 3, 100 + k
        elif op == "forget":
            where.pop(k, None), sizes.pop(k, 0)
        elif op == "put_id":
            puts[k] = None
            while len(puts) > 5:
                puts.popitem(last=False)
        elif op == "take_id":
            takes[k] = (np.arange(k, dtype=np.int64), {"m": float(k)}, None, np.ones(2, bool))
            while len(takes) > 3:
                takes.popitem(last=False)
        elif op == "report":
            report.add(Released(np.arange(k, dtype=np.int64), np.zeros(k, np.int8)))
        elif op == "drain":
            report.drain()
        else:
            record()
    record()
    assert replay.where == dict(where) and replay.sizes == dict(sizes)
    assert list(replay.done_puts) == list(puts) and list(replay.done_takes) == list(takes)
    for k, reply in takes.items():
        assert np.array_equal(replay.done_takes[k][0], reply[0]) and replay.done_takes[k][1] == reply[1]
    got, want = replay.report.peek(), report.peek()
    assert np.array_equal(got.ids, want.ids) and replay.report.overflow == report.overflow


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(0, 12), max_size=8), st.integers(0, 3)),
        max_size=30,
    ),
    logging=st.booleans(),
)
def test_batch_calls_of_a_logged_dict_act_and_log_as_one_call_per_key(ops, logging):
    """``set_many``/``pop_many`` (the index's puts and takes) leave the table, the log and the values returned
    as the same calls one key at a time would, repeated and absent keys included."""
    from pyfast_buffer.ray import _effects

    batched, single = _effects.LoggedDict(), _effects.LoggedDict()
    if logging:
        _effects.start_logs(batched, single)
    for is_set, keys, value in ops:
        if is_set:
            values = [value + k for k in keys]
            batched.set_many(keys, values)
            for k, v in zip(keys, values):
                single[k] = v
        else:
            assert batched.pop_many(keys, -value) == [single.pop(k, -value) for k in keys]
    assert batched == single
    assert batched.log == single.log


def test_a_trimmed_delta_leaves_out_what_is_empty():
    """A take's record carries no entry columns and no in-flight or attempt arrays: they are empty."""
    buf = pfb.StalenessBuffer(capacity=64, max_age=4, pin_memory=False)
    buf.put(np.arange(8, dtype=np.int64), 0)
    buf._journal_delta()
    buf.take(4, 0)
    delta = buf._journal_delta()
    small = trimmed(delta)
    assert "traj_id" not in small and "in_flight_prompt" not in small and "attempts" not in small
    assert all(small[k] is delta[k] for k in small)  # what it keeps, it keeps as it was
    assert set(small) >= {"ledger", "source_counts", "runs", "now_ns"}
