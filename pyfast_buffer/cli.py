"""The ``pyfast-buffer`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pyfast-buffer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from . import demo

    demo.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
