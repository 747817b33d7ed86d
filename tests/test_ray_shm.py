"""The shared memory path of a put's payload bytes (``pyfast_buffer/ray/_shm.py``): the regions, in process,
and puts through it on a real local Ray (values intact under concurrent puts, a region reused only once the
owner's call finished, an owner that cannot open the file served inline)."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, List

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")
if not sys.platform.startswith("linux"):
    pytest.skip("memory files (memfd_create, /proc/<pid>/fd) are Linux only", allow_module_level=True)

from pyfast_buffer.ray import RemoteBuffer, _shm, _wire  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
on_cluster = pytest.mark.usefixtures("ray_namespace", "buffers_ended")

NAMESPACE = "pyfast_buffer_shm_tests"
WORDS = 40 * 1024  # 320 KiB payloads: past _shm.MIN_BYTES in one payload


@pytest.fixture(autouse=True)
def _fresh_regions():
    """Each test starts with no kept region and every owner reachable, and leaves none behind."""
    _forget()
    yield
    _forget()


def _forget() -> None:
    with _shm._lock:
        while _shm._free:
            _shm._free.pop().close()
    _shm._unreachable.clear()


def payload(traj_id: int, words: int = WORDS) -> np.ndarray:
    return np.arange(words, dtype=np.int64) * 7 + traj_id


# -- the regions, in process --------------------------------------------------------------------------------------
def test_layout_puts_every_buffer_on_a_cache_line_after_the_head():
    offsets, need = _shm.layout([1, 64, 65, 0, 3])
    assert offsets == (64, 128, 192, 320, 320)
    assert all(at % _shm.ALIGN == 0 for at in offsets) and need == 384


def test_what_write_copies_read_gives_back_through_the_producers_fd():
    values = [payload(1), {"tokens": payload(2, 100), "text": "x" * 200_000}, b"raw" * 1000]
    headers, buffers = [], []
    for v in values:
        header, whole = _wire.pack(v)
        headers.append(header)
        buffers.extend(whole)
    ticket, region = _shm.write(buffers)
    try:
        assert ticket.pid == os.getpid() and ticket.fd == region.fd
        back = _wire.unpack(headers, _shm.read(ticket))
        assert np.array_equal(back[0], values[0]) and back[2] == values[2]
        assert np.array_equal(back[1]["tokens"], values[1]["tokens"]) and back[1]["text"] == values[1]["text"]
    finally:
        _shm.done(region, reusable=True)


def test_a_ticket_that_names_another_file_is_refused_not_read():
    ticket, region = _shm.write([np.ones(1000, np.uint8)])
    try:
        with pytest.raises(_shm.Unreachable, match="nonce"):
            _shm.read(ticket._replace(nonce=b"\0" * 16))
        with pytest.raises(_shm.Unreachable, match="not the producer's memory file"):
            _shm.read(ticket._replace(inode=ticket.inode + 1))
        with pytest.raises(_shm.Unreachable, match="cannot open"):
            _shm.read(ticket._replace(fd=10**6))
    finally:
        _shm.done(region, reusable=True)


def test_values_read_back_are_writable_and_writing_them_leaves_the_producers_file_alone():
    header, whole = _wire.pack(payload(5))
    ticket, region = _shm.write(whole)
    try:
        first = _wire.unpack([header], _shm.read(ticket))[0]
        assert first.flags.writeable
        first[:] = -1
        again = _wire.unpack([header], _shm.read(ticket))[0]
        assert np.array_equal(again, payload(5))
    finally:
        _shm.done(region, reusable=True)


def test_a_ticket_naming_a_pipe_of_another_process_is_refused_without_opening_it(tmp_path):
    import subprocess

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    holder = subprocess.Popen(  # holds the read end of a pipe nobody writes: opening it would block
        [
            sys.executable,
            "-c",
            f"import os, time; print(os.open({str(fifo)!r}, os.O_RDONLY | os.O_NONBLOCK), flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        fd = int(holder.stdout.readline())
        ticket, region = _shm.write([np.ones(100, np.uint8)])
        _shm.done(region, reusable=True)
        outcome: List[Any] = []
        reader = threading.Thread(
            target=lambda: outcome.append(_catch(_shm.read, ticket._replace(pid=holder.pid, fd=fd)))
        )
        reader.start()
        reader.join(30)  # a bound on a hang, not a speed claim
        assert not reader.is_alive() and isinstance(outcome[0], _shm.Unreachable)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def _catch(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        return exc


def test_regions_are_reused_after_a_finished_call_and_closed_after_one_that_may_still_be_read():
    ticket, region = _shm.write([np.ones(10, np.uint8)])
    _shm.done(region, reusable=True)
    again, same = _shm.write([np.full(10, 2, np.uint8)])
    assert same is region and again.fd == ticket.fd  # the kept region, written again
    _shm.done(same, reusable=False)  # the owner may still be reading: closed, never written again
    assert region not in _shm._free and region.closed  # its fd is closed: nothing writes into it later
    _, fresh = _shm.write([np.ones(10, np.uint8)])
    assert fresh is not region
    _shm.done(fresh, reusable=True)


def test_a_process_keeps_at_most_keep_regions_and_none_past_keep_bytes():
    regions = [_shm.write([np.ones(10, np.uint8)])[1] for _ in range(_shm.KEEP + 2)]
    for r in regions:
        _shm.done(r, reusable=True)
    assert len(_shm._free) == _shm.KEEP
    big = _shm.write([np.ones(_shm.KEEP_BYTES + 1, np.uint8)])[1]
    _shm.done(big, reusable=True)
    assert big not in _shm._free and len(_shm._free) == _shm.KEEP


def test_small_puts_and_unreachable_owners_go_inline():
    assert not _shm.usable("owner", _shm.MIN_BYTES - 1)
    assert _shm.usable("owner", _shm.MIN_BYTES)
    _shm.mark_unreachable("owner")
    assert not _shm.usable("owner", 10 * _shm.MIN_BYTES) and _shm.usable("other", _shm.MIN_BYTES)


# -- puts through it, on a real local Ray -------------------------------------------------------------------------
def _check(batch: Any, values: List[Any]) -> None:
    for traj, value in zip(batch.traj_ids.tolist(), values):
        assert np.array_equal(value, payload(traj)), traj


@on_cluster
def test_concurrent_big_puts_from_one_process_arrive_intact():
    client = RemoteBuffer.create(256, max_age=5)
    errors: List[BaseException] = []

    def producer(first: int) -> None:
        try:
            for k in range(first, first + 10, 2):
                client.put([k, k + 1], 0, payloads=[payload(k), payload(k + 1)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(100 * i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    batch = client.take(60, 0)
    assert len(batch) == 60
    _check(batch, ray.get(list(batch.payloads)))
    assert len(_shm._free) <= _shm.KEEP  # the regions of the concurrent puts went back, bounded
    (owner,) = client.payload_owners()
    assert (owner["memory_file_puts"], owner["inline_puts"]) == (30, 0)


@on_cluster
def test_a_put_the_owner_refuses_leaves_its_region_reusable_and_the_next_put_intact():
    client = RemoteBuffer.create(16, max_age=5)
    client.put([1], 0, payloads=[payload(1)])
    kept = list(_shm._free)
    with pytest.raises(ValueError, match="already hold payloads"):
        client.put([2, 1], 0, payloads=[payload(2), payload(1)])
    assert len(_shm._free) == len(kept)  # the owner's call raised: it finished reading, the region is kept
    client.put([3], 0, payloads=[payload(3)])  # written into the same region
    batch = client.take(4, 0)
    assert sorted(batch.traj_ids.tolist()) == [1, 3]
    _check(batch, ray.get(list(batch.payloads)))


@on_cluster
def test_an_owner_that_cannot_open_the_producers_file_gets_the_bytes_inline(monkeypatch):
    client = RemoteBuffer.create(16, max_age=5)
    write = _shm.write

    import subprocess

    elsewhere = subprocess.Popen([sys.executable, "-c", "pass"])
    elsewhere.wait()

    def foreign(buffers: Any) -> Any:  # a ticket as another machine's producer would send it: no such pid here
        ticket, region = write(buffers)
        return ticket._replace(pid=elsewhere.pid), region

    monkeypatch.setattr(_shm, "write", foreign)
    client.put([1, 2], 0, payloads=[payload(1), payload(2)])
    assert len(_shm._unreachable) == 1  # that owner is served inline from now on
    client.put([3], 0, payloads=[payload(3)])
    (owner,) = client.payload_owners()
    assert (owner["memory_file_puts"], owner["inline_puts"]) == (0, 2)
    batch = client.take(4, 0)
    assert sorted(batch.traj_ids.tolist()) == [1, 2, 3]
    _check(batch, ray.get(list(batch.payloads)))
    assert client.ledger()["put_total"] == 3


@on_cluster
def test_a_put_that_gets_no_memory_file_goes_inline(monkeypatch):
    import errno

    client = RemoteBuffer.create(16, max_age=5)

    def no_memory(buffers: Any) -> Any:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(_shm, "write", no_memory)
    client.put([1, 2], 0, payloads=[payload(1), payload(2)])
    assert not _shm._unreachable  # the owner is not to blame: the next put tries a memory file again
    batch = client.take(4, 0)
    _check(batch, ray.get(list(batch.payloads)))
