"""Payload values packed for the node's payload owner: their pickle and buffers, and the inline pieces that
carry them inside the call itself when they do not go through a memory file (``_shm``: puts under its
``MIN_BYTES``, or an owner that cannot open this process's files), so their bytes reach Ray's store once.

A Ray call argument above ``max_direct_call_object_size`` (100 KiB) is first written to the caller's object
store as an argument object; the payload owner's own ``ray.put`` then writes the same bytes a second time.
Arguments under that size travel inside the call's RPC (up to ``task_rpc_inlined_bytes_limit``, 10 MiB, per
call) and never touch the store. So ``pack`` pickles the payloads (protocol 5, large buffers out of band,
without copying them) and ``cut`` cuts every buffer into pieces under the inline limit, each a top-level
argument and a uint8 view of the payload's memory (no copy before Ray serializes the call); ``join`` puts the
buffers back together in the owner and ``unpack`` loads them, and the owner's ``ray.put`` is the one store
write of each payload byte. A put whose pieces come to more than ``CALL_BYTES`` is sent in several calls
(``chunk_pieces``): its first pieces are staged at the owner, its last ones come with the one store call of
the put, so no call carries more than Ray inlines and the put is still one admission at the index.
"""

from __future__ import annotations

import pickle
from typing import Any, List, Sequence, Tuple

import numpy as np

#: Bytes of one piece: under Ray's 100 KiB inline limit with room for the argument's own framing.
PIECE_BYTES = 96 * 1024
#: Bytes of pieces one call may carry inline (Ray inlines up to 10 MiB of arguments per call; the rest
#: would go through the store, so calls are cut to stay under it).
CALL_BYTES = 8 * 2**20

#: One payload: its pickle (protocol 5) and the byte length of each of its out-of-band buffers.
Header = Tuple[bytes, List[int]]
#: A piece: a uint8 view of a payload's buffer (Ray sends a numpy argument faster than the same bytes
#: object, measured: 22 vs 40 ms for 4 MiB in 44 inline arguments), or a slice of a big in-band pickle.
Piece = Any


def pack(value: Any) -> Tuple[Header, List[Piece]]:
    """Returns the header and the whole buffers of one payload (uint8 views of its memory, or a big pickle)."""
    buffers: List[pickle.PickleBuffer] = []
    main = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    views: List[Piece] = [np.frombuffer(buf.raw(), np.uint8) for buf in buffers]  # the value's own memory
    if len(main) > PIECE_BYTES:  # a big in-band pickle (e.g. a list of Python ints) travels as a buffer too
        views.append(main)
        main = b""
    return (main, [len(v) for v in views]), views


def cut(buffers: Sequence[Piece]) -> List[Piece]:
    """Cuts whole buffers into pieces under the inline limit, in order (views, not copies)."""
    return [b[i : i + PIECE_BYTES] for b in buffers for i in range(0, len(b), PIECE_BYTES)]


def size(header: Header) -> int:
    """Bytes one packed payload carries."""
    return len(header[0]) + sum(header[1])


def join(headers: Sequence[Header], pieces: Sequence[Piece]) -> List[Any]:
    """Joins ``cut``'s pieces back into the whole buffers of ``headers``, in order (each buffer copied once)."""
    buffers: List[Any] = []
    at = 0
    for _, lengths in headers:
        for n in lengths:
            joined = bytearray(n)
            filled = 0
            while filled < n:
                piece = pieces[at]
                joined[filled : filled + len(piece)] = memoryview(piece)  # a bytes, or a uint8 array's buffer
                filled += len(piece)
                at += 1
            buffers.append(joined)
    return buffers


def unpack(headers: Sequence[Header], buffers: Sequence[Any]) -> List[Any]:
    """Rebuilds the payloads from ``pack``'s headers and their whole buffers, in order (no copy here)."""
    values: List[Any] = []
    at = 0
    for main, lengths in headers:
        own = list(buffers[at : at + len(lengths)])
        at += len(lengths)
        if not main:  # the pickle itself was cut: it is the last buffer
            main = bytes(own.pop())
        values.append(pickle.loads(main, buffers=own))
    return values


def chunk_pieces(pieces: Sequence[Piece]) -> List[Tuple[int, List[Piece]]]:
    """Cuts one call's pieces into runs of at most CALL_BYTES (one piece at least), each with the index of
    its first piece: all but the last are staged at the owner before the store call carries the last."""
    chunks: List[Tuple[int, List[Piece]]] = []
    first, total = 0, 0
    for i, piece in enumerate(pieces):
        if i > first and total + len(piece) > CALL_BYTES:
            chunks.append((first, list(pieces[first:i])))
            first, total = i, 0
        total += len(piece)
    chunks.append((first, list(pieces[first:])))
    return chunks
