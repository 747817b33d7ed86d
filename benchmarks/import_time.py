"""Cold import of pyfast_buffer (and pyfast_buffer.ray): the median wall time of fresh interpreters.

    python benchmarks/import_time.py [--runs 5] [--tree DIR]

Each run is a new process timing ``import X`` from inside the process (interpreter start-up excluded) and
reporting whether torch got loaded. ``--tree`` imports the package from another checkout (with its built
``_core`` copied in), bypassing an editable install's finder: how the 'before' figure of docs/performance.md
was taken from the previous commit on the same machine, in the same session.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Dict, List, Optional

_CHILD = """
import sys, time
tree = {tree!r}
if tree:
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
    sys.path.insert(0, tree)
start = time.perf_counter()
import {module}
took = time.perf_counter() - start
print(took, "torch" in sys.modules)
"""


def cold_import(module: str, runs: int, tree: Optional[str]) -> Dict[str, object]:
    seconds: List[float] = []
    torch_loaded = set()
    for _ in range(runs + 1):  # the first run warms the page cache and is not counted
        out = subprocess.run(
            [sys.executable, "-c", _CHILD.format(tree=tree, module=module)],
            capture_output=True,
            text=True,
            check=True,
            cwd="/",
        ).stdout.split()
        seconds.append(float(out[0]))
        torch_loaded.add(out[1] == "True")
    counted = seconds[1:]
    return {
        "module": module,
        "median_s": round(statistics.median(counted), 3),
        "min_s": round(min(counted), 3),
        "runs": runs,
        "torch_loaded": sorted(torch_loaded),
    }


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tree", default=None, help="import from this checkout instead of the installed package")
    parser.add_argument("modules", nargs="*", default=["pyfast_buffer", "pyfast_buffer.ray"])
    args = parser.parse_args(argv)
    for module in args.modules:
        print(json.dumps(cold_import(module, args.runs, args.tree)))


if __name__ == "__main__":
    main()
