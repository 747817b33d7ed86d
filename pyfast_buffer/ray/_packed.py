"""A take's reply as one bytes object: what the index sends back to the taking client.

Ray serializes every numpy array of a call's reply on its own (a buffer, its metadata, and the machinery
that lets a large one be read zero-copy from the store): for a take's reply of four arrays and a dict, that
cost the index ~0.1-0.2 ms more CPU than one bytes object of the same data (docs/ray.md, "Where the index's
CPU per payload goes"; the same packing of a payload owner's registrations showed no gain and was not kept).
The reply is a few KiB, so the index pickles it in band (one buffer, no out-of-band parts) and the client
unpickles it into arrays it owns. Both ends are this package's own processes of one Ray job, which already
trade pickles in every call.
"""

from __future__ import annotations

import pickle
from typing import Any


def pack(message: Any) -> bytes:
    """``message`` (a tuple of small arrays, a dict of numbers, None) as one bytes object."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(packed: bytes) -> Any:
    """What ``pack`` was given; its arrays are writeable and owned by the caller."""
    return pickle.loads(packed)
