"""Imports the compiled core before anything else, so a tree without it says how to build it.

From a source checkout (``python -c "import pyfast_buffer"`` at the repository root) the package has no
``_core`` extension, and Python's own message blames a circular import, which sends people the wrong way.
"""

from __future__ import annotations

import glob
import os
import sys


def _explain(problem: ImportError) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    built = sorted(os.path.basename(p) for p in glob.glob(os.path.join(here, "_core*.so")))
    if not built:
        message = (
            f"pyfast_buffer's native core (the compiled extension pyfast_buffer._core) is not built in {here}: "
            "this looks like a source checkout. Build and install it with: pip install -e . (needs a C++17 "
            "compiler and CMake), or pip install . and import it from outside the checkout"
        )
        shadowed = _installed_elsewhere(here)
        if shadowed:
            message += (
                f". A built copy is installed at {shadowed}, but this tree comes first on sys.path (Python started "
                "in the checkout, or `python -m pytest` there): use the `pytest` command or another directory"
            )
        return message
    return (
        f"pyfast_buffer's native core in {here} ({', '.join(built)}) does not load on this Python "
        f"({sys.version.split()[0]}): {problem}. Rebuild it for this interpreter with: pip install -e ."
    )


def _installed_elsewhere(here: str) -> str:
    """The first other pyfast_buffer package on sys.path that has a built core, or ''."""
    for entry in sys.path:
        package = os.path.join(os.path.abspath(entry or os.curdir), "pyfast_buffer")
        if package != here and glob.glob(os.path.join(package, "_core*.so")):
            return package
    return ""


try:
    from . import _core as _core
except ImportError as exc:
    # from None: the chained "circular import" message is the misleading one this replaces
    raise ModuleNotFoundError(_explain(exc), name="pyfast_buffer._core") from None
