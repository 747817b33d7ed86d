"""The index actor's durable state: an append-only log of effects, and a snapshot written now and then.

Layout, for ``journal=path``: ``path`` is the latest snapshot (``checkpoint.save_state``: atomic and
checksummed, never pickle) of the whole state and the sequence number of the last record it includes; the
records after it are in ``path.<first seq>.log`` segments. Each change appends one record, before the call
that made it answers: a frame of ``length (u32) | crc32 (u32) | seq (u64)`` and a payload of a JSON tree
with the record's arrays after it (the checkpoint module's tree encoding: reading runs no code). What a
record holds is the caller's ``delta()``: effects (rows added, ids that left, counters' new values), never a
call to run again, since the calls stamp wall-clock times and leases expire by time. Records that arrive
while a write is under way share the next write (group commit): the call that waits for its record writes
every pending record itself, unless another is writing, so a lone call pays no hand-off to another thread and
back (that hand-off cost more than the write). A record nobody waits for (``mark(later=True)``) is written by
the journal's thread at once (it wakes the thread), and one left by a call that failed before its wait within
``LEFT_S``. Nothing is fsynced: the log must survive the death of this process,
not of the machine, whose loss takes the file too.

A snapshot is taken in a thread of its own once the log since the last one is as large as that snapshot
(at least ``snapshot_bytes``), so writing snapshots costs at most about as much as the log, and a restart
replays at most about one snapshot's worth. It captures the state under the caller's lock (a copy) and
writes it without it: no call waits for the write. New records then go to a new segment, and the older
segments are deleted once the snapshot file is in place.

``read`` returns the snapshot and the records after it up to the first that is missing, torn (the process
died while appending it, so its call never answered) or fails its checksum; the restarted owner loads that,
writes a fresh snapshot, and the log goes on from there.

A journal path belongs to one buffer. The snapshot names its holder (the buffer's name, namespace, the buffer id
its creator drew, and its index actor's id: ``holder``), and the live index holds an exclusive ``flock`` on
``path.lock`` for as long as it runs (``claim``; the kernel lets go when the process dies, SIGKILL included).
A second buffer that finds the lock held, or a holder that Ray does not count dead for good, is refused with
that holder's name (``JournalInUseError``); a restarted index loads only a snapshot whose holder is itself.

The snapshot and each segment (an 8-byte header: ``PFBJ`` and a u32) name the journal format ``FORMAT``;
``read`` refuses a journal of another format with a JournalFormatError naming the file and both versions.
No release has written a journal before this format, so no reader of an older one exists.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import os
import struct
import threading
import time
import zlib
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import numpy as np

from ..checkpoint import CheckpointError, _decode, load_state, save_state
from ._record_tree import record_head

#: Smallest log, in bytes, written between two snapshots (the bound grows with the snapshot's size).
SNAPSHOT_BYTES = 4 << 20
#: Longest a record nobody waits for stays unwritten (the journal's thread looks this often while one is pending).
LATE_S = 0.05
#: How often the journal's thread looks for a record left by a call that failed between its mark and its wait,
#: when none was pending as it went to sleep (such a record is written within this): an idle index then wakes
#: it once a second instead of 20 times, each wake-up being ~0.1 ms of the index's CPU (2 ms/s while idle).
LEFT_S = 1.0
#: The journal format this code writes and reads (the record's layout, the core's delta, the snapshot's state).
FORMAT = 1
_SEGMENT_HEAD = struct.Struct("<4sI")  # magic, format
_MAGIC = b"PFBJ"
#: Bytes before a segment's first record.
SEGMENT_HEADER_BYTES = _SEGMENT_HEAD.size
_FRAME = struct.Struct("<IIQ")  # payload length, crc32 of seq + payload, seq
_SEQ = struct.Struct("<Q")
_JSON_LEN = struct.Struct("<I")


def encode_record(record: Dict[str, Any]) -> bytes:
    """The payload of one record: a u32 JSON length, the JSON tree, then the bytes of its arrays in order."""
    arrays: List[np.ndarray] = []
    head = record_head(record, arrays).encode()  # checkpoint._encode's tree and the specs, as JSON, written faster
    return b"".join([_JSON_LEN.pack(len(head)), head, *(a.tobytes() for a in arrays)])


def decode_record(payload: bytes, where: str) -> Dict[str, Any]:
    (n,) = _JSON_LEN.unpack_from(payload)
    head = json.loads(payload[_JSON_LEN.size : _JSON_LEN.size + n])
    arrays, at = [], _JSON_LEN.size + n
    for spec in head["arrays"]:
        dtype = np.dtype(spec["dtype"])
        count = int(np.prod(spec["shape"], dtype=np.int64))
        arrays.append(np.frombuffer(payload, dtype, count, at).reshape(spec["shape"]).copy())
        at += count * dtype.itemsize
    return _decode(where, head["tree"], arrays)


class JournalFormatError(RuntimeError):
    """A journal written in another format than this code's: its state cannot be rebuilt."""

    def __init__(self, path: str, found: Any) -> None:
        super().__init__(
            f"the buffer's journal {path!r} is in journal format {found}, but this pyfast_buffer reads format "
            f"{FORMAT} only, so the index stays down rather than guess at it; restart the buffer with the "
            "pyfast_buffer version that wrote the journal, or, to start over without its state, kill() the buffer, "
            "remove the journal files and create a new buffer"
        )
        self.path, self.found, self.expected = path, found, FORMAT

    def __reduce__(self) -> Tuple[Any, Tuple[str, Any]]:
        # Ray pickles an actor's creation error to its callers; the default (the class called with the message)
        # fails on this signature, and the caller would get Ray's "failed to deserialize" instead of the why.
        return type(self), (self.path, self.found)


class JournalInUseError(ValueError):
    """The journal path belongs to another buffer (alive, or restarting): a buffer's journal is its own."""

    def __init__(self, path: str, holder: Optional[Dict[str, Any]], me: Dict[str, Any], why: str) -> None:
        who = (
            f"buffer {holder.get('name')!r} (namespace {holder.get('namespace')!r}, buffer id "
            f"{holder.get('buffer_id')})"
            if holder
            else "another buffer starting at the same moment"
        )
        super().__init__(
            f"journal={path!r} belongs to {who}, which {why}; buffer {me.get('name')!r} cannot use it: pass this "
            "buffer another journal= path, or kill() that buffer first"
        )
        self.path, self.holder, self.me, self.why = path, holder, me, why

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return type(self), (self.path, self.holder, self.me, self.why)


def holder(path: str) -> Optional[Dict[str, Any]]:
    """Who wrote the snapshot at ``path`` (``Journal``'s ``identity``); None if there is none or it names nobody."""
    if not os.path.exists(path):
        return None
    try:
        snap = load_state(path)
    except (CheckpointError, OSError):
        return None  # unreadable: ``read`` reports it, in its own words
    found = snap.get("holder") if isinstance(snap, dict) else None
    return dict(found) if isinstance(found, dict) else None


def claim(path: str, me: Dict[str, Any]) -> int:
    """Takes the exclusive lock of ``path``'s journal for this process (an fd to keep open for its life), or
    raises JournalInUseError naming the buffer that holds it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise JournalInUseError(path, holder(path), me, "is running and holds its lock") from None
    return fd


def frame(seq: int, payload: bytes) -> bytes:
    """One record as written: its frame header, then its payload."""
    return _FRAME.pack(len(payload), zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq))), seq) + payload


def frames(path: str) -> Tuple[List[Tuple[int, bytes]], bool]:
    """The (seq, payload) of every whole record of a segment up to the first torn or corrupt one, and whether
    the segment ended there cleanly (False: a torn or corrupt record follows)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _SEGMENT_HEAD.size:
        return [], not data  # a header torn as the segment was created: no record in it
    magic, version = _SEGMENT_HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise JournalFormatError(path, "none (no journal segment header)")
    if version != FORMAT:
        raise JournalFormatError(path, version)
    out, at = [], _SEGMENT_HEAD.size
    while at + _FRAME.size <= len(data):
        length, crc, seq = _FRAME.unpack_from(data, at)
        end = at + _FRAME.size + length
        if end > len(data):
            break  # torn: the process died while appending it
        payload = data[at + _FRAME.size : end]
        if zlib.crc32(payload, zlib.crc32(_SEQ.pack(seq))) != crc:
            break
        out.append((seq, payload))
        at = end
    return out, at == len(data)


def segment_path(path: str, first_seq: int) -> str:
    return f"{path}.{first_seq:016d}.log"


def segments(path: str) -> List[Tuple[int, str]]:
    """The log segments of ``path``, as (first seq, file), oldest first."""
    found = []
    for name in glob.glob(glob.escape(path) + ".*.log"):
        middle = name[len(path) + 1 : -len(".log")]
        if middle.isdigit():
            found.append((int(middle), name))
    return sorted(found)


def read(path: str) -> Optional[Tuple[Dict[str, Any], List[Dict[str, Any]], int]]:
    """The snapshot at ``path``, the records after it (until one is missing, torn or corrupt) and the last
    record's seq; None if there is no snapshot (a first start).

    A journal still being written can take a snapshot while this reads it (a new file renamed over the old), and
    then delete the segments behind it: the read would find a segment gone, or a gap after its older snapshot.
    So a read during which the snapshot file changed, or a segment vanished, starts again from the newer snapshot
    (a few times at most; a writer that snapshots faster than this reads is not a journal anyone restarts from).
    """
    for _ in range(8):
        before = _snapshot_identity(path)
        try:
            got = _read_once(path)
        except FileNotFoundError:
            continue
        if _snapshot_identity(path) == before:
            return got
    return _read_once(path)


def _snapshot_identity(path: str) -> Optional[Tuple[int, int, int]]:
    """(inode, mtime ns, size) of the snapshot file, None without one: a snapshot replaced by rename changes it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _read_once(path: str) -> Optional[Tuple[Dict[str, Any], List[Dict[str, Any]], int]]:
    if not os.path.exists(path):
        return None
    snap = load_state(path)
    if not isinstance(snap, dict) or snap.get("format") != FORMAT:
        raise JournalFormatError(path, snap.get("format", "none") if isinstance(snap, dict) else "none")
    expect = int(snap["seq"]) + 1
    records: List[Dict[str, Any]] = []
    for first, name in segments(path):
        if first > expect:
            break  # a gap: the records in between were never written whole
        found, clean = frames(name)
        for seq, payload in found:
            if seq < expect:
                continue
            if seq != expect:
                return snap["state"], records, expect - 1
            try:
                records.append(decode_record(payload, name))
            except (ValueError, KeyError, TypeError, CheckpointError):
                return snap["state"], records, expect - 1
            expect += 1
        if not clean:
            break
    return snap["state"], records, expect - 1


class Journal:
    """Appends ``delta()`` records to the log of ``path`` and takes ``capture()`` snapshots now and then.

    ``lock`` is the owner's lock: ``mark`` is called with it held (records are made and numbered in the
    order of the changes) and a snapshot's ``capture`` runs with it held (it sees no change half made), so
    it should only copy; ``finish`` then turns those copies into the state to save, without the lock.
    """

    def __init__(
        self,
        path: str,
        lock: Callable[[], ContextManager[Any]],
        capture: Callable[[], Dict[str, Any]],
        delta: Callable[[], Dict[str, Any]],
        seq: int = 0,
        snapshot_bytes: int = SNAPSHOT_BYTES,
        finish: Callable[[Dict[str, Any]], Dict[str, Any]] = lambda state: state,
        identity: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.path = path
        self._identity = identity
        self._lock, self._capture, self._delta, self._finish = lock, capture, delta, finish
        self._snapshot_bytes = snapshot_bytes
        mutex = threading.Lock()  # one lock, three queues: each wakes only whom it concerns
        self._cv = threading.Condition(mutex)  # calls waiting for their record
        self._wake = threading.Condition(mutex)  # the writer thread: a record nobody waits for, or close
        self._snapshot_cv = threading.Condition(mutex)  # the snapshot thread: one is due, or close
        self._snapshotting = threading.Lock()
        self._seq = self._written = seq
        self._pending: List[Tuple[int, bytes]] = []
        self._writing = False  # a write is under way (its writer holds the batch; others wait for it)
        self._failure: Optional[BaseException] = None
        self._since_snapshot = 0
        self._snapshot_due = False
        self._snapshot_running = False  # the snapshot thread took the due one and is writing it
        self._last_snapshot_bytes = 0
        self.records = self.bytes = self.writes = self.snapshots = 0
        self.write_s = self.snapshot_s = 0.0
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with lock():
            state = capture()
        self._save(finish(state), seq)  # the first snapshot (a start or a restart), before any record
        for _first, name in segments(path):  # all redundant now, a torn record of the previous run included
            os.unlink(name)
        self._segment_first = seq + 1
        self._fd = self._open(seq + 1)
        self._rotate_at: Optional[int] = None
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name="pyfast_buffer-journal", daemon=True),
            threading.Thread(target=self._snapshots, name="pyfast_buffer-journal-snapshot", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # -- the caller's side ---------------------------------------------------------------------------------------
    def mark(self, later: bool = False) -> int:
        """Appends the record of a change (call it with the owner's lock held, the change applied); returns its seq.
        ``later``: nobody will ``wait`` for it, so the journal's thread writes it (within ``LATE_S``)."""
        payload = encode_record(self._delta())
        with self._cv:
            self._seq += 1
            self._pending.append((self._seq, frame(self._seq, payload)))
            if later:
                self._wake.notify()
            return self._seq

    def wait(self, version: int) -> None:
        """Returns once the record ``version`` is written (writing the pending records itself unless a write is
        under way); raises OSError if writing failed."""
        with self._cv:
            while self._written < version and self._failure is None:
                if self._writing or not self._pending:
                    self._cv.wait()
                else:
                    self._write_pending()
            if self._failure is not None:
                raise OSError(f"the buffer's journal {self.path!r} could not be written: {self._failure}")

    def commit(self) -> None:
        self.wait(self.mark())

    def close(self) -> None:
        """Writes what is pending, lets a snapshot under way finish, and stops both threads."""
        with self._cv:
            self._closed = True
            self._wake.notify_all()
            self._snapshot_cv.notify_all()
        for thread in self._threads:
            thread.join()
        os.close(self._fd)

    def stats(self) -> Dict[str, Any]:
        return {
            "path": self.path,
            "records": self.records,
            "bytes": self.bytes,
            "writes": self.writes,
            "write_s": self.write_s,
            "snapshots": self.snapshots,
            "snapshot_s": self.snapshot_s,
            "snapshot_bytes": self._last_snapshot_bytes,
            "snapshot_busy": self._snapshot_due or self._snapshot_running,  # one is due or being written
        }

    # -- the writer ----------------------------------------------------------------------------------------------
    def _open(self, first_seq: int) -> int:
        fd = os.open(segment_path(self.path, first_seq), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        if os.fstat(fd).st_size == 0:
            _write_all(fd, _SEGMENT_HEAD.pack(_MAGIC, FORMAT))
        return fd

    def _run(self) -> None:
        """Writes what nobody is writing: records marked ``later`` (woken by them), or left by a call that never
        waited (within ``LEFT_S``)."""
        with self._cv:
            while True:
                if self._pending and not self._writing and self._failure is None:
                    self._write_pending()
                elif self._closed and not self._writing:
                    return
                else:
                    self._wake.wait(LATE_S if self._pending else LEFT_S)

    def _write_pending(self) -> None:
        """Writes every pending record; called with the lock held, which it lets go during the write."""
        batch, self._pending = self._pending, []
        switch = self._rotate_at if self._rotate_at is not None else batch[-1][0] + 1
        self._writing = True
        self._cv.release()
        try:
            start = time.perf_counter()
            _write_all(self._fd, b"".join(f for s, f in batch if s < switch))
            rest = b"".join(f for s, f in batch if s >= switch)
            if rest:  # a snapshot was captured: its later records start a new segment
                if self._segment_first < switch:
                    os.close(self._fd)
                    self._fd, self._segment_first = self._open(switch), switch
                _write_all(self._fd, rest)
            size = sum(len(f) for _, f in batch)
            self.write_s += time.perf_counter() - start
            self.writes += 1
            self.records += len(batch)
            self.bytes += size
        except BaseException as exc:  # reported to every waiting call
            self._cv.acquire()
            self._writing = False
            self._fail(exc)
            return
        self._cv.acquire()
        self._writing = False
        self._written = batch[-1][0]
        self._since_snapshot += size
        if self._since_snapshot >= max(self._snapshot_bytes, self._last_snapshot_bytes):
            self._snapshot_due = True
            self._snapshot_cv.notify()
        self._cv.notify_all()
        if self._pending or self._closed:
            self._wake.notify()  # marked during the write with nobody waiting yet, or close waits for the flush

    def _fail(self, exc: BaseException) -> None:
        """Records why the journal stopped (lock held): every waiting and later call raises it."""
        self._failure = exc
        self._cv.notify_all()
        self._wake.notify_all()

    # -- snapshots -----------------------------------------------------------------------------------------------
    def _snapshots(self) -> None:
        while True:
            with self._cv:
                while not self._snapshot_due and not self._closed:
                    self._snapshot_cv.wait()
                if self._closed:
                    return
                self._snapshot_running = True  # snapshot() clears what is due when it captures
            try:
                self.snapshot()
            except BaseException as exc:
                with self._cv:
                    self._fail(exc)
                return
            finally:
                with self._cv:
                    self._snapshot_running = False

    def snapshot(self, change: Optional[Callable[[], Any]] = None) -> Any:
        """Captures the state (under the owner's lock), writes it, and drops the segments it makes redundant.
        ``change`` (a load replacing the whole state) runs in the same hold of the lock, just before the capture,
        so that no other call's record can come between them (it would carry the whole new state); returns
        what ``change`` returned."""
        with self._snapshotting:  # one at a time: an older snapshot must never replace a newer one
            start = time.perf_counter()
            with self._lock():
                result = change() if change is not None else None
                state = self._capture()
                with self._cv:
                    seq = self._seq
                    self._rotate_at = seq + 1  # later records go to a new segment
                    # This snapshot holds the log so far: the next one is due after as much log again (a
                    # call's snapshot, a load's, also stands for one the log's size had made due).
                    self._since_snapshot, self._snapshot_due = 0, False
            self._save(self._finish(state), seq)
            for first, name in segments(self.path):
                if first <= seq:  # every record in it is in the snapshot (an open one is written on, then dropped)
                    with contextlib.suppress(OSError):
                        os.unlink(name)
            self.snapshots += 1
            self.snapshot_s += time.perf_counter() - start
            return result

    def _save(self, state: Dict[str, Any], seq: int) -> None:
        head: Dict[str, Any] = {"format": FORMAT, "seq": seq, "state": state}
        if self._identity is not None:
            head["holder"] = self._identity
        save_state(head, self.path, fsync=False)
        self._last_snapshot_bytes = os.path.getsize(self.path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class NoJournal:
    """``journal=False``: nothing is written, and the index is created without restarts (it never comes back empty)."""

    path = ""

    def mark(self, later: bool = False) -> int:
        return 0

    def wait(self, version: int) -> None:
        return None

    def commit(self) -> None:
        return None

    def snapshot(self, change: Optional[Callable[[], Any]] = None) -> Any:
        return change() if change is not None else None

    def stats(self) -> Dict[str, Any]:
        return {
            "path": "",
            "records": 0,
            "bytes": 0,
            "writes": 0,
            "write_s": 0.0,
            "snapshots": 0,
            "snapshot_busy": False,
        }
