"""Reading the logs ``audit`` reconciles: plain, gzip or stdin, told apart from binary input, NUL runs kept for audit to
note, and whether the last line was cut off mid-write."""

from __future__ import annotations

import gzip
import re
import sys
from typing import IO, List, Optional, Tuple


class UnreadableLog(Exception):
    """An input that is not a readable text log; the message names it and says why."""


#: C0 control bytes a text log does not hold (tab, LF, VT, FF, CR and ESC for colours are text; NUL is judged apart).
_CONTROL = bytes(b for b in range(1, 32) if b not in b"\t\n\v\f\r\x1b")
#: Above this share of control bytes (NUL aside) an input is binary, not a text log with a damaged line.
_MAX_CONTROL_SHARE = 0.01


def looks_binary(raw: bytes) -> bool:
    """Whether ``raw`` is binary data, not a text log with NUL runs (``copytruncate`` leaves one where the log starts,
    a crash zero-filled blocks; audit skips them). Binary data holds control bytes text does not, or interleaves NULs
    with other bytes: more NUL runs than lines, as UTF-16 or any binary format does."""
    if b"\0" not in raw:
        return False
    text = raw.replace(b"\0", b"")
    if len(text) - len(text.translate(None, _CONTROL)) > _MAX_CONTROL_SHARE * max(1, len(text)):
        return True
    lines = raw.count(b"\n") + 1  # any() stops at the first run past it: a 100 MB UTF-16 file has 50 million runs
    return any(runs > lines for runs, _ in enumerate(re.finditer(rb"\0+", raw), 1))


def open_log(source: str, stdin: Optional[IO[bytes]] = None) -> Tuple[List[str], bool]:
    """Returns the lines of a log file, a gzip file (by its magic bytes) or ``-`` (stdin), NUL bytes kept (audit
    notes and skips them), and whether the last line is cut off: no line end after it, as a log still being written,
    or one whose writer died mid-line, leaves it (a logging handler ends every record with one). Raises
    UnreadableLog naming the source and why: missing, broken gzip, binary data."""
    try:
        if source == "-":
            raw = (stdin or sys.stdin.buffer).read()
        else:
            with open(source, "rb") as f:
                raw = f.read()
    except OSError as exc:
        raise UnreadableLog(f"{source}: cannot open ({exc.strerror or exc}); pass a log file, a .gz log or -") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise UnreadableLog(f"{source}: broken gzip ({exc}); decompress it or pass the plain log") from None
    if looks_binary(raw):
        raise UnreadableLog(
            f"{source}: binary data, not a text log (NUL bytes between its characters, or control bytes); "
            "pass the training log"
        )
    cut_off = bool(raw) and not raw.endswith((b"\n", b"\r"))
    return raw.decode("utf-8", errors="replace").splitlines(), cut_off
