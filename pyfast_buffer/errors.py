"""Exceptions raised by both buffer implementations.

Bad arguments raise the built-in ``ValueError``/``TypeError``; a blocking call
whose timeout elapses raises the built-in ``TimeoutError``. The types here come
from the native core so that both implementations raise the same classes;
``WouldBlock`` (a ``TimeoutError``) is internal: one attempt of an awaitable call
that would have to wait (aio.py), never raised by the public calls.
"""

from ._core import AdmissionError, BufferClosedError, BufferFullError, WouldBlock

__all__ = ["CLOSED_MESSAGE", "NO_COPY", "AdmissionError", "BufferClosedError", "BufferFullError", "WouldBlock"]

#: The message of BufferClosedError (the core's wording, repeated for the pure-Python twin).
CLOSED_MESSAGE = "the buffer is closed; create a new buffer (or load its state_dict) to continue"

#: The message of the TypeError that copy.copy, copy.deepcopy and pickle raise on a buffer ({cls}: its class).
NO_COPY = (
    "{cls} cannot be copied or pickled: it owns its storage, its lock and its waiters, which a copy would "
    "share or lose; snapshot it with state_dict() (or save(path)) and load that into a new buffer with "
    "load_state_dict() (or load(path))"
)
