"""GPU check (about a minute): pinned ring and batches, async H2D overlap, take-to-GPU latency.

Run ``python benchmarks/gpu_check.py``. Without CUDA it checks the CPU path and says it skipped the
GPU part. With CUDA it verifies that the ring columns and every batch are pinned, that
``batch.to("cuda", non_blocking=True)`` returns before the copy finishes (so host work overlaps
it), and measures take-to-GPU latency for B=4096 and host-to-device bandwidth against a plain
pinned ``copy_`` of the same bytes.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
import torch

import pyfast_buffer as pfb

B = 4096


def cpu_part() -> dict:
    buf = pfb.StalenessBuffer(1 << 20, max_age=8)
    buf.put(np.arange(B, dtype=np.int64), 0)
    batch = buf.take(B, 0)
    assert len(batch) == B and batch.columns.is_contiguous()
    return {"pinned_ring": buf.pin_memory, "batch_pinned": batch.columns.is_pinned()}


def gpu_part() -> dict:
    dev = torch.device("cuda")
    buf = pfb.StalenessBuffer(1 << 22, max_age=8)
    assert buf.pin_memory and all(c.is_pinned() for c in buf._columns), "ring columns are not pinned"
    ids = np.arange(B, dtype=np.int64)
    out = {"device": torch.cuda.get_device_name(0)}

    # Overlap: a large async copy must return to the host before the GPU has finished it.
    big = pfb.StalenessBuffer(1 << 22, max_age=8)
    big.put(np.arange(1 << 22, dtype=np.int64), 0)
    batch = big.take(1 << 22, 0)
    assert batch.columns.is_pinned(), "batch tensor is not pinned"
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    moved = batch.to(dev, non_blocking=True)
    returned_after = time.perf_counter() - t0
    done_event = torch.cuda.Event()
    done_event.record()
    busy = not done_event.query()
    torch.cuda.synchronize()
    finished_after = time.perf_counter() - t0
    assert torch.equal(moved.traj_ids.cpu(), batch.traj_ids), "copied data differs"
    out.update(async_returned_s=returned_after, async_finished_s=finished_after, copy_still_running=busy)

    # take -> GPU latency for B=4096.
    lat = []
    for step in range(200):
        buf.put(ids, step)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        gb = buf.take(B, step).to(dev, non_blocking=True)
        torch.cuda.synchronize()
        lat.append(time.perf_counter() - t0)
        assert gb.traj_ids.device.type == "cuda"
    out.update(
        take_to_gpu_p50_us=statistics.median(lat) * 1e6, take_to_gpu_p99_us=sorted(lat)[int(0.99 * len(lat))] * 1e6
    )

    # H2D bandwidth: batch.to vs a plain pinned copy_ of the same bytes.
    nbytes = batch.columns.numel() * 8
    dst = torch.empty_like(batch.columns, device=dev)
    plain = torch.empty_like(batch.columns).pin_memory()

    def bandwidth(fn) -> float:
        times = []
        for _ in range(10):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        return nbytes / statistics.median(times) / 1e9

    out["h2d_batch_to_GBps"] = bandwidth(lambda: batch.to(dev, non_blocking=True))
    out["h2d_plain_pinned_copy_GBps"] = bandwidth(lambda: dst.copy_(plain, non_blocking=True))
    return out


def main() -> int:
    report = {"cpu": cpu_part()}
    if torch.cuda.is_available():
        report["gpu"] = gpu_part()
    else:
        report["gpu"] = "skipped: CUDA is not available on this machine (the CPU path ran, unpinned)"
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
