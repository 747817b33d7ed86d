"""The buffer as a Ray actor: one put and one take round trip per batch size, beside ray.util.queue.Queue.

Per batch size, one group for put and one for take, each with the buffer actor, ray Queue (batched
calls), the in-process buffer and the floor (an actor call that carries the same bytes and does nothing).
Producer-process throughput and wake-up latency are in ``pyfast-buffer bench --cases ray``.
"""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from pyfast_buffer import StalenessBuffer  # noqa: E402
from pyfast_buffer._core import BATCH_COLUMNS  # noqa: E402
from pyfast_buffer.bench.plan import CURRENT_STEP  # noqa: E402
from pyfast_buffer.bench.ray_cluster import init_local_cluster  # noqa: E402
from pyfast_buffer.ray import RemoteBuffer  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import this module

BATCHES = [64, 512, 4096]
CONTENDERS = ["pyfast_buffer actor", "ray Queue", "pyfast_buffer in-process", "actor call floor"]


@ray.remote(num_cpus=0)
class Floor:
    def sink(self, ids: np.ndarray) -> int:
        return len(ids)

    def give(self, n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.int64)


@pytest.fixture(scope="module")
def targets():
    from ray.util.queue import Queue

    init_local_cluster(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        namespace="pyfast_buffer_bench_tests",
    )
    # A ring of 2^16: the size of the docs' tables (the journal's cost per call no longer depends on it).
    remote = RemoteBuffer.create(1 << 16, max_age=10, num_cpus=0)
    try:
        yield {
            "pyfast_buffer actor": remote,
            "ray Queue": Queue(actor_options={"num_cpus": 0}),
            "pyfast_buffer in-process": StalenessBuffer(1 << 20, max_age=10, pin_memory=False),
            "actor call floor": Floor.remote(),
        }
    finally:
        remote.kill()  # detached by default: it would outlive this module
        ray.shutdown()


def _put(name, target, ids):
    if name == "ray Queue":
        return lambda: target.put_nowait_batch(ids.tolist())
    if name == "actor call floor":
        return lambda: ray.get(target.sink.remote(ids))
    return lambda: target.put(ids, CURRENT_STEP)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", CONTENDERS)
def test_put_round_trip(benchmark, targets, name, batch):
    benchmark.group = f"ray put B={batch}"
    target = targets[name]
    ids = np.arange(batch, dtype=np.int64)
    before = _count(name, target)
    benchmark.pedantic(_put(name, target, ids), rounds=30, warmup_rounds=1)
    if name != "actor call floor":  # every call stored its batch
        assert _count(name, target) - before == 31 * batch or (name == "pyfast_buffer actor" and _full(target))


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", CONTENDERS)
def test_take_round_trip(benchmark, targets, name, batch):
    benchmark.group = f"ray take B={batch}"
    target = targets[name]
    chunk = np.arange(8 * batch, dtype=np.int64)

    def refill():
        if name != "actor call floor" and _count(name, target) < batch:
            _put(name, target, chunk)()
        return (), {}

    if name == "ray Queue":

        def take():
            return len(target.get_nowait_batch(batch))
    elif name == "actor call floor":  # the bytes of a batch's int64 columns

        def take():
            return ray.get(target.give.remote(BATCH_COLUMNS * batch)).size // BATCH_COLUMNS
    else:

        def take():
            return len(target.take(batch, CURRENT_STEP))

    returned = benchmark.pedantic(take, setup=refill, rounds=30, warmup_rounds=1)
    assert returned == batch


def _count(name, target) -> int:
    if name == "ray Queue":
        return target.size()
    if name == "actor call floor":
        return 0
    return len(target)


def _full(target) -> bool:
    return len(target) == target.config.capacity
