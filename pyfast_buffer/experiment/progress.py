"""A tqdm bar per arm when tqdm is installed (the ``demo`` extra) and the output is a terminal; otherwise a
silent stand-in. Redirected to a file, tqdm's carriage-return redraws become thousands of lines in the log.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

try:
    from tqdm import tqdm as _tqdm
except ImportError:  # optional: pip install "pyfast_buffer[demo]"
    _tqdm = None

MISSING = "tqdm is not installed, so no progress bars (pip install 'pyfast_buffer[demo]' adds them)"


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def on_terminal() -> bool:
    """True when both stdout and stderr (where tqdm draws) are terminals, read at call time."""
    return all(getattr(stream, "isatty", lambda: False)() for stream in (sys.stdout, sys.stderr))


def bar(total: int, desc: str, enabled: bool) -> Any:
    """Returns a tqdm bar over ``total`` sampling steps, or a no-op one when disabled, unavailable or when
    stdout or stderr is not a terminal."""
    if not enabled or _tqdm is None or not on_terminal():
        return _NoBar()
    return _tqdm(total=total, desc=desc, unit="tick", leave=True, dynamic_ncols=True)


def note_if_missing(enabled: bool, print_fn: Optional[Any] = print) -> None:
    if enabled and _tqdm is None and print_fn is not None and on_terminal():
        print_fn(MISSING)
