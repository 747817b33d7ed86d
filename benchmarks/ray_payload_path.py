"""Where a RemoteBuffer payload's time goes, against producer refs in a queue (docs/ray.md, "payloads the trainer
reads"): medians of single calls on one local node.

    python benchmarks/ray_payload_path.py

- put of 4 payloads (64 KiB, 1 MiB): ``RemoteBuffer.put(payloads=)`` against 4 ``ray.put`` + one queue call;
- take + fetch of 16 against a queue get of 16 refs + ``ray.get``; a take alone;
- the call that carries 4 MiB to an actor as inline pieces (our owner's path for small puts), through a memory file
  (``pyfast_buffer/ray/_shm.py``: written by the caller, mapped by the actor; the path of puts of 256 KiB or
  more), as one numpy argument (an argument object in the store), and a ``ray.put`` of 4 MiB.
"""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np
import ray


def median_ms(fn, n=20):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    from ray.util.queue import Queue

    from pyfast_buffer.bench.ray_cluster import init_local_cluster
    from pyfast_buffer.ray import RemoteBuffer, _wire

    init_local_cluster(
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        namespace="pyfast_buffer_payload_path",
    )

    @ray.remote(num_cpus=0)
    class Sink:
        def take(self, *pieces):
            return len(pieces)

        def take_file(self, ticket):
            from pyfast_buffer.ray import _shm

            return len(_shm.read(ticket))

    try:
        for size in (64 * 1024, 1024 * 1024):
            value = np.random.default_rng(0).integers(0, 2**31, size // 8, dtype=np.int64)
            buf = RemoteBuffer.create(4096, max_age=10, on_full="evict_oldest", num_cpus=0)
            queue = Queue(maxsize=4096, actor_options={"num_cpus": 0})
            queue.size()
            next_id = [0]

            def put_ours(buf=buf, value=value, next_id=next_id):
                buf.put(np.arange(next_id[0], next_id[0] + 4), 0, payloads=[value] * 4)
                next_id[0] += 4

            def put_queue(queue=queue, value=value):
                queue.put_nowait_batch([ray.put(value) for _ in range(4)])

            print(
                f"{size // 1024} KiB: put x4 ours {median_ms(put_ours, 30):.1f} ms, "
                f"queue {median_ms(put_queue, 30):.1f} ms"
            )
            for _ in range(40):
                put_ours()
                put_queue()
            read_ours = median_ms(lambda buf=buf: buf.fetch(buf.take(16, 0)), 8)
            read_queue = median_ms(lambda queue=queue: ray.get(queue.get_nowait_batch(16)), 8)
            print(f"{size // 1024} KiB: take+fetch 16 ours {read_ours:.1f} ms, queue get+ray.get {read_queue:.1f} ms")
            buf.kill()
            queue.shutdown()
        sink = Sink.remote()
        ray.get(sink.take.remote())
        value = np.random.default_rng(0).integers(0, 2**31, 2**20 // 8, dtype=np.int64)
        pieces = [p for _, whole in (_wire.pack(value) for _ in range(4)) for p in _wire.cut(whole)]
        joined = np.frombuffer(b"".join(pieces), np.uint8)
        inline = median_ms(lambda: ray.get(sink.take.remote(*pieces)))
        one_arg = median_ms(lambda: ray.get(sink.take.remote(joined)))
        stored = median_ms(lambda: ray.put(joined))
        from pyfast_buffer.ray import _shm

        whole = [b for _, bufs in (_wire.pack(value) for _ in range(4)) for b in bufs]

        def through_file():
            ticket, region = _shm.write(whole)  # a kept region after the first call, as in a producer
            try:
                ray.get(sink.take_file.remote(ticket))
            finally:
                _shm.done(region, True)

        filed = median_ms(through_file)
        print(
            f"4 MiB to an actor: {len(pieces)} inline pieces {inline:.1f} ms, through a memory file {filed:.1f} ms, "
            f"one numpy argument {one_arg:.1f} ms, ray.put {stored:.1f} ms"
        )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
