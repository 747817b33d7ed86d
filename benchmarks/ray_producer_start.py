"""What a fresh Ray producer process pays before its first put lands: import and first call (issue 50).

    python benchmarks/ray_producer_start.py [--producers 4] [--tree DIR]

A local cluster (loopback only) and one RemoteBuffer; each producer is a new actor process that imports
``pyfast_buffer.ray`` and puts 4 numpy payloads of 64 KiB, timing from inside itself the import and the first
put, and reporting whether torch got loaded. ``--tree`` makes the producers import the package from another
checkout (its ``_core`` copied in), bypassing an editable install's finder: how docs/performance.md took the
figure of the previous commit, in the same session, on the same machine. Medians over the producers.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from typing import Any, List, Optional


def _producer_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class Producer:
        def first_put(self, tree: Optional[str], buffer_args: Any, first_id: int) -> dict:
            import time

            preloaded = "pyfast_buffer.ray" in sys.modules  # Ray may import it to unpickle the arguments
            if tree:  # the previous commit's package, as its producers imported it
                sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__]
                sys.path.insert(0, tree)
                for name in [m for m in sys.modules if m.startswith("pyfast_buffer")]:
                    del sys.modules[name]
            start = time.perf_counter()
            import numpy as np

            import pyfast_buffer.ray as pfr

            imported = time.perf_counter()
            buf = pfr.RemoteBuffer(*buffer_args)
            value = np.zeros(64 * 1024 // 8, dtype=np.int64)
            buf.put(np.arange(first_id, first_id + 4, dtype=np.int64), 0, payloads=[value] * 4)
            done = time.perf_counter()
            return {
                "import_s": imported - start,
                "first_put_s": done - imported,
                "torch": "torch" in sys.modules,
                "preloaded": preloaded,
                "done_at": time.time(),
                "from": pfr.__file__,
            }

    return Producer


def main(argv: Optional[List[str]] = None) -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--tree", default=None)
    args = parser.parse_args(argv)
    from pyfast_buffer.bench.ray_cluster import init_local_cluster
    from pyfast_buffer.ray import RemoteBuffer

    init_local_cluster(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        buf = RemoteBuffer.create(capacity=4096, max_age=4)
        producer = _producer_class()
        import time

        started = time.time()  # the producers' clock is this machine's: start to first put landed, per producer
        actors = [producer.remote() for _ in range(args.producers)]
        rows = ray.get([a.first_put.remote(args.tree, buf.__reduce__()[1], 1000 * i) for i, a in enumerate(actors)])
        print(
            json.dumps(
                {
                    "producers": args.producers,
                    "start_to_first_put_median_s": round(statistics.median(r["done_at"] - started for r in rows), 3),
                    "import_median_s": round(statistics.median(r["import_s"] for r in rows), 3),
                    "first_put_median_s": round(statistics.median(r["first_put_s"] for r in rows), 3),
                    "imported_to_unpickle": sorted({r["preloaded"] for r in rows}),
                    "torch_loaded": sorted({r["torch"] for r in rows}),
                    "from": sorted({r["from"] for r in rows}),
                    "ledger_buffer_left": buf.ledger()["buffer_left"],
                }
            )
        )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
