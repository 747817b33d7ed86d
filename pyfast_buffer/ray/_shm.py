"""Payload bytes handed to this node's payload owner through a shared memory file instead of inside the call.

Ray's inline path carries a call's arguments through its RPC: a put of 4 MiB in 44 pieces under the inline
limit took 11-17 ms to reach the owner here, where writing the same bytes into memory both processes map takes
under 1 ms (``python benchmarks/ray_payload_path.py``). So a producer keeps a few memory files
(``memfd_create``: anonymous, freed with the last process that maps them, nothing left in a directory after a
crash), writes a put's buffers into one, and sends the owner a ``Ticket`` naming it; the owner opens it through
``/proc/<pid>/fd/<fd>`` (it runs on the producer's node by construction), and its ``ray.put`` reads the bytes
straight from that mapping: still one store write per payload byte, and no argument object in the store.

The producer writes into a region again only after the owner's call returned or raised (it no longer reads);
a call that ended otherwise (the caller interrupted, the owner died) closes its region instead of reusing it.
A ticket carries the file's inode and a random nonce written at its start. The owner looks at what the name
leads to before it opens it (a regular file with that inode, so never a pipe or device of some other process),
then checks the nonce: an owner that is not on the producer's machine, or finds another process's file under
the same pid and fd, refuses it (``Unreachable``) and the client sends that owner its bytes inline from then
on; a failure of the owner's own (descriptors, memory: ``Unreadable``) sends only that put inline.
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
import stat
import sys
import threading
import weakref
from typing import Any, List, NamedTuple, Sequence, Set, Tuple

#: A put whose payload buffers come to fewer bytes goes inline (one call, no file): measured at 4 x 64 KiB,
#: the two ways cost the same, and below that the inline call is cheaper.
MIN_BYTES = 256 * 1024
#: A region larger than this is closed after its call rather than kept for the next (a producer keeps at most
#: ``KEEP`` regions, so the memory it holds between puts stays bounded).
KEEP_BYTES = 64 * 2**20
#: Regions one process keeps for later puts (concurrent puts in one process each take their own).
KEEP = 2
#: Bytes before the first buffer: the nonce, then padding so that every buffer starts on a cache line.
HEAD = 64
ALIGN = 64


class Ticket(NamedTuple):
    """Where the owner finds a put's buffers: the producer's pid and fd of a memory file, its inode, nonce,
    and the length of each buffer (their offsets follow from ``layout``)."""

    pid: int
    fd: int
    inode: int
    nonce: bytes
    lengths: Tuple[int, ...]


class Unreachable(RuntimeError):
    """The owner cannot open this producer's memory file (another machine or pid namespace, or no /proc)."""


class Unreadable(RuntimeError):
    """The owner could not map the file this time (out of descriptors or memory): send this put inline."""


#: What an owner's failed open means: the name leads nowhere it may read (the producer is elsewhere).
_ELSEWHERE = (errno.ENOENT, errno.ESRCH, errno.EACCES, errno.EPERM, errno.ENOTDIR)


class _Region:
    """One memory file of this process; written with ``pwrite`` (a failure to find memory is an OSError
    here, where a write through a mapping would be a signal)."""

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("pyfast_buffer-payloads")
        try:
            os.ftruncate(self.fd, size)
            self.size = size
            self.inode = os.fstat(self.fd).st_ino
            self.nonce = secrets.token_bytes(16)
            self.write(self.nonce, 0)
        except BaseException:
            os.close(self.fd)
            raise
        # Closed by ``close``, or when dropped: a region lost to an interrupt between two lines keeps no fd.
        self._closer = weakref.finalize(self, os.close, self.fd)

    def write(self, data: Any, offset: int) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    @property
    def closed(self) -> bool:
        return not self._closer.alive

    def close(self) -> None:
        self._closer()


_SUPPORTED = sys.platform.startswith("linux") and hasattr(os, "memfd_create")
_lock = threading.Lock()
_free: List[_Region] = []
_unreachable: Set[str] = set()  # owners (by actor id) that could not open this process's files


def usable(owner_key: str, nbytes: int) -> bool:
    """Whether a put of ``nbytes`` of buffers goes to ``owner_key`` through a memory file."""
    return nbytes >= MIN_BYTES and _SUPPORTED and owner_key not in _unreachable


def mark_unreachable(owner_key: str) -> None:
    """That owner could not open this process's files: later puts to it go inline."""
    _unreachable.add(owner_key)


def layout(lengths: Sequence[int]) -> Tuple[Tuple[int, ...], int]:
    """The offset of each buffer (after the head, each on a cache line) and the bytes all of them need."""
    offsets = []
    at = HEAD
    for n in lengths:
        offsets.append(at)
        at += -(-n // ALIGN) * ALIGN
    return tuple(offsets), at


def write(buffers: Sequence[Any]) -> Tuple[Ticket, _Region]:
    """Copies the buffers into a region of this process (one kept from earlier puts, or a new one)."""
    lengths = tuple(len(memoryview(b).cast("B")) for b in buffers)
    offsets, need = layout(lengths)
    with _lock:
        fits = [r for r in _free if r.size >= need]
        region = min(fits, key=lambda r: r.size) if fits else None
        if region is not None:
            _free.remove(region)
    if region is None:
        region = _Region(max(need, 2**20))
    try:
        for buf, at in zip(buffers, offsets):
            region.write(buf, at)
    except BaseException:
        region.close()
        raise
    return Ticket(os.getpid(), region.fd, region.inode, region.nonce, lengths), region


def done(region: _Region, reusable: bool) -> None:
    """The owner's call returned (``reusable``), or may still be reading: keep the region or close it."""
    if not reusable or region.size > KEEP_BYTES:
        region.close()
        return
    with _lock:
        _free.append(region)
        while len(_free) > KEEP:
            _free.pop(0).close()


def read(ticket: Ticket) -> List[memoryview]:
    """The owner's side: the ticket's buffers, views of the producer's memory file (valid while referenced;
    a private mapping, so a payload whose unpickling writes into its buffer changes nothing of the producer's)."""
    path = f"/proc/{ticket.pid}/fd/{ticket.fd}"
    offsets, need = layout(ticket.lengths)
    try:
        found = os.stat(path)  # follows the link without opening: a pipe or a device is never opened
        if not stat.S_ISREG(found.st_mode) or found.st_ino != ticket.inode or found.st_size < need:
            raise Unreachable(f"{path} is not the producer's memory file (another machine or pid namespace)")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno in _ELSEWHERE:
            raise Unreachable(f"cannot open {path} ({exc.strerror}): the producer is not on this machine") from None
        raise Unreadable(f"cannot open {path}: {exc}") from None
    try:
        if os.fstat(fd).st_ino != ticket.inode:  # replaced between the stat and the open
            raise Unreachable(f"{path} is not the producer's memory file (another machine or pid namespace)")
        mapped = mmap.mmap(fd, need, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise Unreadable(f"cannot map {path}: {exc}") from None
    finally:
        os.close(fd)
    view = memoryview(mapped)
    if bytes(view[: len(ticket.nonce)]) != ticket.nonce:
        view.release()
        mapped.close()
        raise Unreachable(f"{path} does not carry the producer's nonce (another process's file)")
    return [view[at : at + n] for at, n in zip(offsets, ticket.lengths)]


def _forget_in_child() -> None:
    """A forked child must not write into its parent's regions (the same files): it drops its copies."""
    global _lock
    _lock = threading.Lock()
    while _free:
        _free.pop().close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def key(owner: Any) -> str:
    """The key ``usable``/``mark_unreachable`` know an owner (an actor handle) by."""
    return owner._actor_id.hex()


__all__ = [
    "Ticket",
    "Unreachable",
    "Unreadable",
    "done",
    "key",
    "layout",
    "mark_unreachable",
    "read",
    "usable",
    "write",
]
