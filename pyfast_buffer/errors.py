"""Exceptions raised by both buffer implementations.

Bad arguments raise the built-in ``ValueError``/``TypeError``; a blocking call
whose timeout elapses raises the built-in ``TimeoutError``. The two types here
come from the native core so that both implementations raise the same classes.
"""

from ._core import AdmissionError, BufferClosedError, BufferFullError

__all__ = ["CLOSED_MESSAGE", "NO_COPY", "AdmissionError", "BufferClosedError", "BufferFullError"]

#: The message of BufferClosedError (the core's wording, repeated for the pure-Python twin).
CLOSED_MESSAGE = "the buffer is closed; create a new buffer (or load its state_dict) to continue"

#: The message of the TypeError that copy.copy, copy.deepcopy and pickle raise on a buffer ({cls}: its class).
NO_COPY = (
    "{cls} cannot be copied or pickled: it owns its storage, its lock and its waiters, which a copy would "
    "share or lose; snapshot it with state_dict() (or save(path)) and load that into a new buffer with "
    "load_state_dict() (or load(path))"
)
