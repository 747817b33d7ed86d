"""``pyfast-buffer demo``: the experiment's ``demo`` preset, about 35 s on two CPU cores.

Nine arms of a real asynchronous GRPO run (reuse 1/2/4, each under drop, wait and pace) on
the digit-sum task; writes the figure, report (which arms kept their bound, and what each paid) and
records under ``--out``.
"""

from __future__ import annotations

import argparse

from .cli import add_arguments, execute


def run(args: argparse.Namespace) -> int:
    args.preset = "demo"
    return execute(args, "demo")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the experiment's demo preset (about 35 s) and write figure + report",
        description="A real asynchronous GRPO run on the buffer: reuse 1/2/4 under drop, wait and pace, "
        "everything else fixed. Same as 'pyfast-buffer experiment --preset demo'.",
    )
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    # --steps is the old demo's flag (CI's smoke run uses it); both set the sampling steps per arm.
    p.add_argument("--ticks", "--steps", dest="ticks", type=int, help="sampling steps per arm (default 600)")
    add_arguments(p, "pyfast-buffer-demo")
    p.set_defaults(run=run)
