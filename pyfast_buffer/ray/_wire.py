"""Payload values sent to the node's payload owner inside the call itself, so their bytes reach Ray's store once.

A Ray call argument above ``max_direct_call_object_size`` (100 KiB) is first written to the caller's object
store as an argument object; the payload owner's own ``ray.put`` then writes the same bytes a second time.
Arguments under that size travel inside the call's RPC (up to ``task_rpc_inlined_bytes_limit``, 10 MiB, per
call) and never touch the store. So ``pack`` pickles the payloads (protocol 5, large buffers out of band,
without copying them) and cuts every buffer into pieces under the inline limit, each a top-level argument and
a uint8 view of the payload's memory (no copy before Ray serializes the call);
``unpack`` joins them back in the owner, whose ``ray.put`` is the one store write of each payload byte.
A put whose pieces come to more than ``CALL_BYTES`` is sent in several calls (``chunk_pieces``): its first
pieces are staged at the owner, its last ones come with the one store call of the put, so no call carries
more than Ray inlines and the put is still one admission at the index.
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
    """Returns the header and the pieces that carry one payload; large buffers are cut, not pickled whole."""
    buffers: List[pickle.PickleBuffer] = []
    main = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    lengths: List[int] = []
    pieces: List[Piece] = []
    for buf in buffers:
        view = np.frombuffer(buf.raw(), np.uint8)  # the value's own memory: pieces are views, not copies
        lengths.append(view.nbytes)
        pieces.extend(view[i : i + PIECE_BYTES] for i in range(0, view.nbytes, PIECE_BYTES))
    if len(main) > PIECE_BYTES:  # a big in-band pickle (e.g. a list of Python ints) is cut the same way
        lengths.append(len(main))
        pieces.extend(main[i : i + PIECE_BYTES] for i in range(0, len(main), PIECE_BYTES))
        main = b""
    return (main, lengths), pieces


def size(header: Header) -> int:
    """Bytes one packed payload carries."""
    return len(header[0]) + sum(header[1])


def unpack(headers: Sequence[Header], pieces: Sequence[Piece]) -> List[Any]:
    """Rebuilds the payloads from ``pack``'s headers and their pieces, in order (each buffer joined once)."""
    values, at = [], 0
    for main, lengths in headers:
        buffers = []
        for n in lengths:
            joined = bytearray(n)
            filled = 0
            while filled < n:
                piece = pieces[at]
                joined[filled : filled + len(piece)] = memoryview(piece)  # a bytes, or a uint8 array's buffer
                filled += len(piece)
                at += 1
            buffers.append(joined)
        if not main:  # the pickle itself was cut: it is the last buffer
            main = bytes(buffers.pop())
        values.append(pickle.loads(main, buffers=buffers))
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
