"""A call's argument or reply as one bytes object, for the index's busiest calls: a take's reply and a payload
owner's registrations.

Ray serializes every numpy array of a call's arguments or reply on its own (a buffer, its metadata, and the
machinery that lets a large one be read zero-copy from the store), and for these calls that cost the index
more than its own work: a take's reply of four arrays and a dict took ~0.3 ms more of the index's CPU than
one bytes object of the same data (docs/ray.md, "Where the index's CPU per payload goes"). These messages
are a few KiB, so one end pickles them in band (one buffer, no out-of-band parts) and the other unpickles
them into arrays it owns. Both ends are this package's own processes of one Ray job, which already trade
pickles in every call.
"""

from __future__ import annotations

import pickle
from typing import Any


def pack(message: Any) -> bytes:
    """``message`` (a reply or an argument of tuples, dicts, numbers and small arrays) as one bytes object."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(packed: bytes) -> Any:
    """What ``pack`` was given; its arrays are writeable and owned by the caller."""
    return pickle.loads(packed)
