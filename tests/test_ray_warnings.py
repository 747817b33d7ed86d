"""No warning from Ray or torch leaks out of our code: a RemoteBuffer session (payloads, a take and a fetch, the
ledger, a restart of the index from its journal) runs with warnings as errors in this driver (pytest's
filterwarnings), and the index's and the payload owner's worker logs on the real local cluster hold no warning."""

from __future__ import annotations

import glob
import os
import signal
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from pyfast_buffer.ray import RemoteBuffer  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_namespace", "buffers_ended")  # the session's two-node cluster

NAMESPACE = "pyfast_buffer_warning_tests"


def _worker_logs(cluster, pids):
    paths = glob.glob(os.path.join(cluster.temp_dir, "session_*", "logs", "worker-*"))
    return [p for p in paths if any(p.endswith(f"-{pid}.err") or p.endswith(f"-{pid}.out") for pid in pids)]


def test_a_remote_buffer_session_leaks_no_warning(ray_cluster):
    buf = RemoteBuffer.create(64, max_age=3)
    buf.put(np.arange(4), 0, payloads=[b"x" * 100] * 4)
    _, values = buf.fetch(buf.take(4, 0))
    assert values == [b"x" * 100] * 4 and buf.ledger()["taken"] == 4
    first = ray.get(buf.actor.pid.remote(), timeout=60)
    pids = {first}
    pids |= {pid for owner in buf.payload_owners() for pid in [owner.get("pid")] if pid is not None}
    os.kill(first, signal.SIGKILL)  # the index restarts from its journal: the restart path runs too
    deadline = time.monotonic() + 60
    restarted = None
    while restarted is None and time.monotonic() < deadline:
        try:  # until the restarted actor answers (calls in between may reach the dying one or find none)
            pid = ray.get(buf.actor.pid.remote(), timeout=10)
            restarted = pid if pid != first else None
        except Exception:
            pass
        if restarted is None:
            time.sleep(0.2)
    assert restarted is not None, "the index did not come back within 60 s"
    pids.add(restarted)
    assert buf.ledger()["index_restarts"] == 1
    time.sleep(1.0)  # Ray's log monitor flushes worker output to the files
    logs = _worker_logs(ray_cluster, pids)
    assert logs, f"no worker logs found for pids {pids} under {ray_cluster.temp_dir}"
    warned = []
    for path in logs:
        with open(path, errors="replace") as f:
            warned += [line for line in f if "Warning" in line or "warnings.warn" in line]
    assert not warned, "warnings in the actors' logs:\n" + "".join(warned[:10])
