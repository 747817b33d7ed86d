"""The ``pyfast-buffer`` command line: one subcommand per module, each with an ``add_parser``.

It stays at the package root, outside the three wings it dispatches to (the workflow's rhythm, audit and
perturb; the experiment and its demo preset; bench), and imports each only when the parser is built.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

# Each module defines add_parser(subparsers), which sets ``run`` to a function(args) -> exit code.
COMMAND_MODULES = (
    "experiment.demo",
    "experiment",
    "bench",
    "workflow.rhythm",
    "workflow.audit",
    "workflow.perturb",
)


def build_parser() -> argparse.ArgumentParser:
    """Returns the ``pyfast-buffer`` parser with every subcommand registered."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="pyfast-buffer", description="Staleness-aware trajectory buffer tools.")
    parser.add_argument("--version", action="version", version=f"pyfast-buffer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"pyfast_buffer.{name}").add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Runs one ``pyfast-buffer`` command and returns its exit code."""
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
