"""``pyfast-buffer demo``: placeholder replaced by the RL experiment of issue 5."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="run the demo")
    p.set_defaults(run=lambda args: print("demo"))
