"""What the bound does to the data, through RemoteBuffer: ``source=`` and ``lengths=`` reach the index's buffer.

The same scripted run (issue 19's acceptance scenario: one source whose rollouts always take longer than
max_age, under drop) goes through a local StalenessBuffer and through RemoteBuffer on the session's real
cluster, completes with payloads (the payload owner's path) and dispatches tagged per prompt; starved(),
the per-source metrics and the length sketches must agree (latencies are wall-clock: only their counts).
"""

from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

import pyfast_buffer as pfb  # noqa: E402
from pyfast_buffer import bias  # noqa: E402
from pyfast_buffer.ray import RemoteBuffer  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_namespace", "buffers_ended")

NAMESPACE = "pyfast_buffer_data_accounting_tests"
SLOW, FAST = list(range(100, 104)), list(range(4))


def slow_source_run(buf: Any, payloads: bool) -> Dict[int, int]:
    """Source 1's rollouts take 5 steps, source 0's one, max_age 2, drop: returns trajectories per prompt."""
    generated = {p: 0 for p in SLOW + FAST}
    pending: Dict[int, int] = {}
    next_traj = 0
    for step in range(bias.WINDOW_PARTS * bias.WINDOW_TAKES):
        free = [p for p in SLOW + FAST if p not in pending]
        if free:
            buf.dispatch(free, step, source=[1 if p in SLOW else 0 for p in free])  # one tag per prompt
            pending.update((p, step + (5 if p in SLOW else 1)) for p in free)
        done = [p for p, at in sorted(pending.items()) if at == step]
        if done:
            trajs = list(range(next_traj, next_traj + 2 * len(done)))
            prompts = [p for p in done for _ in range(2)]
            lengths = [900 if p in SLOW else 100 for p in prompts]
            extra = {"payloads": [np.full(8, t) for t in trajs]} if payloads else {}
            buf.complete(trajs, prompts, lengths=lengths, **extra)
            next_traj += len(trajs)
            for p in done:
                generated[p] += 1
                del pending[p]
        buf.take(64, step)
    return generated


def comparable(metrics: Dict[str, float]) -> Dict[str, float]:
    """Every data metric but the wall-clock latencies (their counts stay)."""
    return {k: v for k, v in metrics.items() if "latency" not in k or k.endswith("/n")}


def test_the_slow_source_scenario_counts_the_same_through_remote_buffer():
    local = pfb.StalenessBuffer(256, max_age=2, starvation_share=0.1, pin_memory=False)
    remote = RemoteBuffer.create(256, max_age=2, starvation_share=0.1)
    generated = slow_source_run(local, payloads=False)
    assert slow_source_run(remote, payloads=True) == generated
    starved = remote.starved()
    assert sorted(starved) == SLOW and starved == local.starved()  # exactly the slow source's prompts
    m = remote.data_metrics()
    assert m["buffer/source/1/starved"] == 4 and m["buffer/source/0/starved"] == 0
    assert m["buffer/source/1/trained"] == 0 and m["buffer/source/1/dropped"] == 2 * sum(generated[p] for p in SLOW)
    assert m["buffer/bias/length/trained/mean"] == 100 and m["buffer/bias/length/lost/mean"] == 900
    share_slow = sum(generated[p] for p in SLOW) / sum(generated.values())
    assert m["buffer/bias/length_ks"] == pytest.approx(share_slow)  # the lengths crossed with the payloads
    assert comparable(m) == comparable(local.data_metrics())
    led, local_led = remote.ledger(), local.ledger()
    assert {k: led[k] for k in local_led} == local_led


def test_put_source_reaches_the_batch_with_and_without_payloads():
    local = pfb.StalenessBuffer(64, max_age=1, source_max_age={3: 10}, pin_memory=False)
    remote = RemoteBuffer.create(64, max_age=1, source_max_age={3: 10})
    batches: List[Any] = []
    for buf, extra in ((local, {}), (remote, {"payloads": [np.arange(4)] * 3})):
        buf.put([1, 2, 3], 0, group_ids=[7, 7, 8], source=[3, 3, 4], **extra)  # one tag per trajectory
        buf.put([4], 0, source=3)  # one tag for the call, without payloads
        batches.append(buf.take(8, 5))
    local_batch, remote_batch = batches
    assert remote_batch.traj_ids.tolist() == local_batch.traj_ids.tolist() == [1, 2, 4]
    assert remote_batch.source.tolist() == local_batch.source.tolist() == [3, 3, 3]
    assert remote_batch.metrics["buffer/source/4/dropped"] == 1
    assert [int(v[0]) for v in ray.get(remote_batch.payloads[:2])] == [0, 0]


def test_bad_source_and_lengths_raise_the_local_errors_and_change_nothing():
    remote = RemoteBuffer.create(8, max_age=2)
    local = pfb.StalenessBuffer(8, max_age=2, pin_memory=False)
    calls = [
        (lambda b: b.dispatch([1], 0, source=64), ValueError, r"source=64 is out of range; pass a source in \[0, 63\]"),
        (lambda b: b.dispatch([1, 2], 0, source=[1]), ValueError, "source has 1 tags for 2 prompts"),
        (lambda b: b.dispatch([1], 0, source="a"), TypeError, "source"),
        (lambda b: b.put([1, 2], 0, source=[-1, 2]), ValueError, r"source=-1 is out of range"),
        (lambda b: b.put([1, 2], 0, group_ids=[3, 3], source=[1, 2]), ValueError, "a group shares one source"),
        (lambda b: b.complete([1, 2], [1, 1], lengths=[3]), ValueError, "lengths has 1 entries for 2 trajectories"),
        (lambda b: b.complete([1], [1], lengths=[-3]), ValueError, "is not a token count"),
    ]
    for buf in (local, remote):
        buf.dispatch([1], 0)
    before = remote.ledger()
    for call, error, message in calls:
        with pytest.raises(error, match=message) as remote_error:
            call(remote)
        with pytest.raises(error, match=message) as local_error:
            call(local)
        assert str(remote_error.value) == str(local_error.value)
    assert remote.ledger() == before and remote.in_flight == 1
    with pytest.raises(ValueError, match="a group shares one source"):  # checked by the index: nothing admitted
        remote.put([1, 2], 0, group_ids=[3, 3], source=[1, 2], payloads=[1, 2])
    assert remote.ledger() == before and remote.payloads_held() == 0
