"""The ``pyfast-buffer`` command line: one subcommand per module, each with an ``add_parser``."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

# Each module defines add_parser(subparsers), which sets ``run`` to a function(args) -> exit code.
COMMAND_MODULES = ("demo", "experiment", "bench", "rhythm", "audit", "verify")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pyfast-buffer", description="Staleness-aware trajectory buffer tools.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"pyfast_buffer.{name}").add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
