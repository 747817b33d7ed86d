"""Producer threads racing the process's first ``import torch`` in a fresh interpreter (issue 55), for the lazy-torch,
concurrency and hostile-input suites.

While a thread is inside ``import torch`` (about 2 s), ``sys.modules["torch"]`` holds a half-built module without
``Tensor``; a buffer that took it for torch raised AttributeError in every producer asking "is this a tensor?". Each
producer draws its calls from a seeded mix (dispatch and complete, put from lists and numpy, grouped and finish
stamped puts, fail, and with ``hostile`` bad arguments that must be refused with TypeError or ValueError), while the
trainer's first tensor (``how="batch"``) or another thread (``how="thread"``) imports torch for real.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict

_SCRIPT = """
import json, random, sys, threading, time
import numpy as np
import pyfast_buffer
cls, how, seed, hostile = getattr(pyfast_buffer, sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
buf = cls(capacity=1 << 16, max_age=10**6, strategy="drop", on_full="evict_oldest")
errors, stop, imported = [], threading.Event(), threading.Event()
after, refused = [0, 0, 0, 0], [0, 0, 0, 0]  # calls once torch had finished importing; bad calls refused
BAD = (
    lambda t: buf.put([1.5], 0),
    lambda t: buf.put("ids", 0),
    lambda t: buf.put([[t]], 0),
    lambda t: buf.put([True, t], 0),
    lambda t: buf.put([t], True),
    lambda t: buf.dispatch([t], -1),
    lambda t: buf.put(np.array([t], dtype=np.float32), 0),
    lambda t: buf.complete([t], [10**18 + t]),  # never dispatched
)
def producer(k):
    rng = random.Random(seed * 10 + k)
    try:
        for i in range(10**9):
            if stop.is_set():
                return
            tid = k * 10**8 + i
            op = rng.randrange(7 if hostile else 5)
            if op == 0:
                buf.dispatch([tid], 0); buf.complete([tid], [tid])
            elif op == 1:
                buf.put([tid], 0)
            elif op == 2:
                buf.put(np.array([tid], dtype=np.int64), [0], group_ids=[tid])
            elif op == 3:
                buf.dispatch([tid], 0); buf.fail([tid])
            elif op == 4:
                buf.put([tid], 0, finish_step=[0])
            else:
                try:
                    rng.choice(BAD)(tid)
                except (TypeError, ValueError):
                    refused[k] += 1
                else:
                    raise AssertionError("a bad call was accepted")
            if imported.is_set():
                after[k] += 1
    except BaseException as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
time.sleep(0.05)
assert "torch" not in sys.modules
if how == "thread":  # another thread imports torch itself while the producers run
    importer = threading.Thread(target=lambda: __import__("torch"))
    importer.start(); importer.join()
ids = buf.take(8, current_step=0).traj_ids.tolist()  # how == "batch": the trainer's first tensor imports torch
imported.set()
import torch
buf.put(torch.tensor([10**12]), 0)  # a tensor from a producer works after the import
deadline = time.monotonic() + 60  # ends as soon as every producer made 50 calls
while min(after) < 50 and time.monotonic() < deadline and not errors:
    time.sleep(0.01)
stop.set()
for t in threads:
    t.join()
print(json.dumps({"errors": errors[:4], "alive_after": after, "ids": len(ids), "refused": sum(refused)}))
"""


def race_first_torch_import(cwd: Any, impl: str, how: str, seed: int, hostile: bool = False) -> Dict[str, Any]:
    """Runs the race in a fresh interpreter (this pytest process imported torch long ago); returns its report."""
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, impl, how, str(seed), "1" if hostile else "0"],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_race_survived(out: Dict[str, Any], hostile: bool = False) -> None:
    assert out["errors"] == [], out
    assert min(out["alive_after"]) >= 50, out  # every producer kept working once torch had loaded
    assert out["ids"] == 8, out
    if hostile:
        assert out["refused"] > 0, out  # bad calls were drawn, and each was refused as bad input
