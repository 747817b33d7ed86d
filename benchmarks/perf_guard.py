"""The noise-free perf guard: instructions per entry under callgrind, against budgets.

Builds benchmarks/native (the C++ driver of the core, not part of the wheel), runs each fixed workload under
``valgrind --tool=callgrind --toggle-collect=pfb_measured`` so that only the measured calls count, and
compares instructions per entry with benchmarks/instruction_budgets.json. The ``py_`` workloads
(benchmarks/native/python_calls.py) count whole public calls from Python in this interpreter, the installed
pyfast_buffer and torch included, with the instrumentation switched on only around the measured calls.
Instruction counts repeat to a fraction of a percent from run to run, unlike wall-clock time on a shared
machine.

    python benchmarks/perf_guard.py             # check: exit 1 naming each operation over its budget
    python benchmarks/perf_guard.py --show      # print the counts only
    python benchmarks/perf_guard.py --update    # rewrite the budgets: measured * (1 + --headroom)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
BUDGETS = ROOT / "benchmarks" / "instruction_budgets.json"
BUILD = ROOT / "build" / "perf-native"


def build(build_dir: Path) -> Path:
    """Configures and builds the driver (Release, like the wheel); returns the executable's path."""
    subprocess.run(
        ["cmake", "-S", str(ROOT / "benchmarks" / "native"), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(["cmake", "--build", str(build_dir), "-j", "2"], check=True, stdout=subprocess.DEVNULL)
    return build_dir / "perf_driver"


PYTHON_CALLS = ROOT / "benchmarks" / "native" / "python_calls.py"


def workloads(driver: Path) -> List[str]:
    native = subprocess.run([str(driver), "--list"], check=True, capture_output=True, text=True).stdout.split()
    python = subprocess.run([sys.executable, str(PYTHON_CALLS), "--list"], check=True, capture_output=True, text=True)
    return native + python.stdout.split()


def command(driver: Path, workload: str) -> List[str]:
    """valgrind's switches and the program for one workload: the native driver counts inside pfb_measured, a
    Python workload between its ctypes switches (the import before them is not even instrumented)."""
    if workload.startswith("py_"):
        switch = driver.parent / "libcallgrind_switch.so"
        return ["--instr-atstart=no", sys.executable, str(PYTHON_CALLS), str(switch), workload]
    return ["--toggle-collect=pfb_measured", str(driver), workload]


def measure(driver: Path, workload: str) -> Dict[str, float]:
    """Runs one workload under callgrind; returns its instructions, entries, calls and instructions/entry."""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "callgrind.out")
        # The scalar path: valgrind does not emulate AVX-512, and the count must not depend on the CPU.
        # Valgrind counts each byte of a `rep movsb`/`rep stosb` as one instruction, so glibc's memcpy and
        # memset are told to use their vector loops at every size: the counts then track the real work.
        tunables = "glibc.cpu.x86_rep_movsb_threshold=2147483647:glibc.cpu.x86_rep_stosb_threshold=2147483647"
        # A fixed hash seed: Python's dict and set probes must not differ from run to run.
        env = {**os.environ, "PYFAST_BUFFER_NO_SIMD": "1", "GLIBC_TUNABLES": tunables, "PYTHONHASHSEED": "0"}
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}", *command(driver, workload)],
            capture_output=True,
            text=True,
            env=env,
        )
        if run.returncode:
            raise RuntimeError(f"{workload}: the workload failed under valgrind:\n{run.stderr[-3000:]}")
        text = Path(out_file).read_text()
    # "totals" is what ran while instrumented; "summary" can read 0 after a client request zeroed the stats.
    found = re.search(r"^totals:\s+(\d+)", text, re.MULTILINE) or re.search(r"^summary:\s+(\d+)", text, re.MULTILINE)
    if not found:
        raise RuntimeError(f"{workload}: no instruction total in the callgrind output")
    info = json.loads(run.stdout.strip().splitlines()[-1])
    instructions = int(found.group(1))
    return {
        "instructions": instructions,
        "entries": info["entries"],
        "calls": info["calls"],
        "per_entry": instructions / info["entries"],
    }


def check(measured: Dict[str, Dict[str, float]], budgets: Dict[str, float]) -> List[str]:
    """Returns one message per workload over its budget, or without a budget."""
    failures = []
    for name, m in measured.items():
        budget = budgets.get(name)
        if budget is None:
            failures.append(f"{name}: no budget in {BUDGETS.name}; run benchmarks/perf_guard.py --update and commit it")
        elif m["per_entry"] > budget:
            over = m["per_entry"] - budget
            failures.append(
                f"{name}: {m['per_entry']:.2f} instructions/entry exceeds its budget {budget:.2f} "
                f"by {over:.2f} ({over / budget:+.1%}); find the regression with "
                f"callgrind_annotate, or raise the budget in {BUDGETS.name} if the cost is intended"
            )
    return failures


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--show", action="store_true", help="print the counts, check nothing")
    mode.add_argument("--update", action="store_true", help="write measured * (1 + headroom) as the budgets")
    p.add_argument("--headroom", type=float, default=0.08, help="budget slack over the measured count (0.08)")
    p.add_argument("--build-dir", type=Path, default=BUILD)
    p.add_argument("--only", default="", help="comma-separated workloads (default: all)")
    args = p.parse_args(argv)
    for tool in ("valgrind", "cmake"):
        if shutil.which(tool) is None:
            print(f"perf guard: {tool} not found; install it (apt-get install {tool})", file=sys.stderr)
            return 2
    driver = build(args.build_dir)
    names = args.only.split(",") if args.only else workloads(driver)
    budgets = json.loads(BUDGETS.read_text())["instructions_per_entry"] if BUDGETS.exists() else {}
    measured = {}
    print(f"{'workload':<22} {'instr/entry':>12} {'budget':>9} {'instr/call':>12}")
    for name in names:
        m = measured[name] = measure(driver, name)
        budget = budgets.get(name)
        print(
            f"{name:<22} {m['per_entry']:>12.2f} {budget if budget is not None else '-':>9} "
            f"{m['instructions'] / m['calls']:>12.0f}"
        )
    if args.update:
        data = {
            "_comment": "Instructions per entry under callgrind (benchmarks/perf_guard.py): the native core, and "
            "whole Python calls (py_*); "
            "budget = max(measured * (1 + headroom), measured + 0.05).",
            "headroom": args.headroom,
            # Near-zero counts (construct, the sorted evict) get an absolute slack of 0.05 as well.
            "instructions_per_entry": {
                n: round(max(m["per_entry"] * (1 + args.headroom), m["per_entry"] + 0.05), 2)
                for n, m in measured.items()
            },
            "measured": {n: round(m["per_entry"], 2) for n, m in measured.items()},
        }
        BUDGETS.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {BUDGETS}")
        return 0
    if args.show:
        return 0
    failures = check(measured, budgets)
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    print("perf guard: " + ("FAILED" if failures else f"all {len(measured)} workloads within budget"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
