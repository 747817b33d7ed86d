"""How the workflow commands print: one report to stdout, quiet when the reader goes away."""

from __future__ import annotations

import os
import sys


def print_output(text: str) -> None:
    """Prints ``text``; a reader that went away (``| head``) ends the output quietly."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
