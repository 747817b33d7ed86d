"""The cases of ``pyfast-buffer bench`` by name: the one place a case is registered.

Each case module defines its cases and imports only the shared plan (plan.py) and the timing helpers;
this module imports the case modules and lists them, so no case module imports another.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, List

from .cases import (
    bulk_case,
    evict_case,
    memory_case,
    overhead_case,
    pace_case,
    put_case,
    take_case,
    throughput_case,
    wake_case,
)
from .plan import Plan
from .ray_case import ray_case
from .sources_case import sources_case
from .torchrl_case import torchrl_case
from .verl_case import summary, verl_case

#: A case: runs on a plan, records why it left a contender out in ``skipped``, returns its rows.
Case = Callable[[Plan, Dict[str, str]], List[Dict]]

#: The cases every run can reach, in the order a run takes them (ray and torchrl skip themselves when missing).
CASES: Dict[str, Case] = {
    "put": put_case,
    "take": take_case,
    "evict_stale": evict_case,
    "wake_latency": wake_case,
    "throughput_2p1c": throughput_case,
    "memory": memory_case,
    "bulk": bulk_case,
    "overhead": overhead_case,
    "pace_cycle": pace_case,
    "take_sources": sources_case,
    "ray": ray_case,
    "torchrl": torchrl_case,
}

#: The case that needs an argument of its own (a verl checkout); run by default only when one is given.
VERL = "verl"


def cases(verl_src: str = "") -> Dict[str, Case]:
    """Every case of a run: CASES and ``verl``, timing verl's own sampler from the checkout ``verl_src``."""

    def run_verl(plan: Plan, skipped: Dict[str, str]) -> List[Dict]:
        rows = verl_case(plan, skipped, verl_src)
        print(summary(rows), file=sys.stderr)  # the ratios to verl, beside the shared report
        return rows

    return {**CASES, VERL: run_verl}


def default_names(verl_src: str = "") -> List[str]:
    """The cases a run without ``--cases`` takes: all of them, verl only with a checkout."""
    return [name for name in cases(verl_src) if name != VERL or verl_src]
