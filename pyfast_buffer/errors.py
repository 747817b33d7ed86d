"""Exceptions raised by both buffer implementations.

Bad arguments raise the built-in ``ValueError``/``TypeError``; a blocking call
whose timeout elapses raises the built-in ``TimeoutError``. The types here come
from the native core so that both implementations raise the same classes;
``WouldBlock`` (a ``TimeoutError``) is internal: one attempt of an awaitable call
that would have to wait (aio.py), never raised by the public calls.
"""

import re

from ._core import AdmissionError, BufferClosedError, BufferFullError, WouldBlock

__all__ = [
    "CLOSED_MESSAGE",
    "NO_COPY",
    "AdmissionError",
    "BufferClosedError",
    "BufferFullError",
    "WouldBlock",
    "timed_out_after",
]

#: The message of BufferClosedError (the core's wording, repeated for the pure-Python twin).
CLOSED_MESSAGE = "the buffer is closed; create a new buffer (or load its state_dict) to continue"

#: The message of the TypeError that copy.copy, copy.deepcopy and pickle raise on a buffer ({cls}: its class).
NO_COPY = (
    "{cls} cannot be copied or pickled: it owns its storage, its lock and its waiters, which a copy would "
    "share or lose; snapshot it with state_dict() (or save(path)) and load that into a new buffer with "
    "load_state_dict() (or load(path))"
)


_WAITED = re.compile(r"timed out after [-+0-9.e]+ s")


def timed_out_after(exc: BaseException, seconds: float) -> TimeoutError:
    """``exc``'s message as a ``TimeoutError`` that names the ``seconds`` its caller waited.

    A call that waits by retrying a non-blocking attempt (an awaitable call, the Ray index's blocked calls) gets
    the attempt's words, which name the attempt's own timeout (0 s, or the index's 1e-09 s): this one formatter
    puts the caller's timeout in their place, so a timeout reads the same in process, awaited and remote."""
    text = str(exc)
    if _WAITED.search(text):
        text = _WAITED.sub(f"timed out after {seconds:g} s", text, count=1)
    else:
        text = f"timed out after {seconds:g} s: {text}"
    return TimeoutError(text)
