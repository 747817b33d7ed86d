"""Exceptions raised by both buffer implementations.

Bad arguments raise the built-in ``ValueError``/``TypeError``; a blocking call
whose timeout elapses raises the built-in ``TimeoutError``. The two types here
come from the native core so that both implementations raise the same classes.
"""

from ._core import BufferClosedError, BufferFullError

__all__ = ["CLOSED_MESSAGE", "BufferClosedError", "BufferFullError"]

#: The message of BufferClosedError (the core's wording, repeated for the pure-Python twin).
CLOSED_MESSAGE = "the buffer is closed; create a new buffer (or load its state_dict) to continue"
