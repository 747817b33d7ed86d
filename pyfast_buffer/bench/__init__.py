"""Benchmarks of pyfast_buffer against the pure-Python baseline and peers (``pyfast-buffer bench``)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark against the baseline and peers")
    p.set_defaults(run=lambda args: print("bench: not yet"))
