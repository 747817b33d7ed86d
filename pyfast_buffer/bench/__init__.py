"""Benchmarks of pyfast_buffer against the pure-Python baseline and peers, in one process.

``pyfast-buffer bench [--quick]`` (or ``python -m pyfast_buffer.bench``) prints a table of
medians and ratios, evaluates the targets, and writes ``bench-results.json`` and a PNG chart.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Optional

from . import registry, report
from .plan import Plan


def run(args: argparse.Namespace) -> int:
    plan = Plan.quick() if args.quick else Plan()
    table = registry.cases(args.verl_src)
    names = args.cases.split(",") if args.cases else registry.default_names(args.verl_src)
    unknown = [n for n in names if n not in table]
    if unknown:
        print(f"unknown case(s) {unknown}; choose from {', '.join(table)}", file=sys.stderr)
        return 2
    rows: List[Dict] = []
    skipped: Dict[str, str] = {}
    started = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        rows.extend(table[name](plan, skipped))
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    report.add_ratios(rows)
    goals = report.targets(rows)
    print(report.table(rows, goals, skipped))
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "bench-results.json")
    report.write_json(json_path, rows, goals, skipped, "quick" if args.quick else "full")
    chart_path = os.path.join(args.out, "bench-results.png")
    why_not = None if args.no_chart else report.write_chart(chart_path, rows)
    print(f"wrote {json_path}" + ("" if args.no_chart or why_not else f" and {chart_path}"))
    if why_not:
        print(why_not)
    command = ""
    if args.update_readme or args.update_docs:
        command = (
            "pyfast-buffer bench"
            + (" --quick" if args.quick else "")
            + (f" --cases {args.cases}" if args.cases else "")
        )
    if args.update_readme:
        report.update_readme(args.update_readme, report.markdown(rows, goals, skipped, command))
        print(f"updated {args.update_readme}")
    if args.update_docs:
        env = report.environment()
        when = f"{env['date']} on {env['machine']} ({env['cpu_count']} cores), pyfast_buffer {env['pyfast_buffer']}"
        report.update_readme(
            args.update_docs, report.targets_markdown(goals, command, when), report.DOCS_START, report.DOCS_END
        )
        print(f"updated {args.update_docs}")
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small configurations, under a minute on 2 cores")
    p.add_argument("--cases", default="", help=f"comma-separated subset of: {', '.join(registry.cases())}")
    p.add_argument("--out", default=".", help="directory for bench-results.json and bench-results.png")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG")
    p.add_argument(
        "--verl-src",
        metavar="PATH",
        default="",
        help="a verl checkout: the verl case (run by default when given) times verl's own ReplayBufferAsync",
    )
    p.add_argument(
        "--update-readme",
        metavar="PATH",
        default="",
        help="write the results between the latest-run markers of PATH (benchmarks/README.md)",
    )
    p.add_argument(
        "--update-docs",
        metavar="PATH",
        default="",
        help="write the targets table between the performance-table markers of PATH (docs/performance.md)",
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark against the pure-Python twin and peers (table, JSON, PNG)")
    _add_arguments(p)
    p.set_defaults(run=run)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyfast_buffer.bench", description=__doc__)
    _add_arguments(parser)
    return run(parser.parse_args(sys.argv[1:] if argv is None else argv))
