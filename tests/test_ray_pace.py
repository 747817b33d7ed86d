"""strategy="pace" through RemoteBuffer on a real local Ray: producer processes block in dispatch until admitted,
the actor serves them from its blocking concurrency group (never a thread per producer), and the acceptance
scenario of tests/test_pace_scenario.py holds through the actor.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")
psutil = pytest.importorskip("psutil")

import test_pace_scenario as scenario  # noqa: E402

from pyfast_buffer.ray import RemoteBuffer  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_namespace", "buffers_ended")  # the session's two-node cluster

NAMESPACE = "pyfast_buffer_pace_tests"

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(scenario)

PRODUCERS = 8
REMOTE_STEPS = 60
ADMISSION_CALLS = 4  # fewer threads for waiting dispatches than producers that wait


@ray.remote(num_cpus=0)
class Producer:
    """A rollout worker in its own process: dispatches one prompt and reports how long admission took."""

    def __init__(self, buf: RemoteBuffer) -> None:
        self.buf = buf

    def dispatch(self, prompt: int, step: int) -> float:
        start = time.monotonic()
        self.buf.dispatch([prompt], step, timeout=120)
        return time.monotonic() - start


def _actor_threads(buf: RemoteBuffer) -> int:
    pid = ray.get(buf.actor.__ray_call__.remote(lambda actor: os.getpid()))
    return psutil.Process(pid).num_threads()


def test_eight_producer_processes_wait_for_admission_in_the_blocking_group(capsys):
    # The limit (lookahead + 1) * prompts_per_step is 2: six of the eight producers must wait, one slot per take.
    buf = RemoteBuffer.create(
        64, max_age=8, strategy="pace", prompts_per_step=1, lookahead=1, admission_calls=ADMISSION_CALLS
    )
    producers = [Producer.remote(buf) for _ in range(PRODUCERS)]
    ray.get([p.__ray_ready__.remote() for p in producers])
    idle_threads = _actor_threads(buf)
    waits = [p.dispatch.remote(i, 0) for i, p in enumerate(producers)]
    deadline = time.monotonic() + 60
    while buf.ledger()["admitted"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # every producer has sent its call by now; six of them block in (or queue for) the actor
    blocked_threads = _actor_threads(buf)
    start = time.monotonic()
    buf.ping()  # a quick call still gets a thread while six dispatches wait
    ping_s = time.monotonic() - start
    assert buf.in_flight == 2 and buf.admissible(0) == 0
    # The trainer: complete one in-flight prompt, take it, next step; each take admits one waiting producer.
    step = 0
    while buf.ledger()["taken"] < PRODUCERS:
        deadline = time.monotonic() + 60
        while buf.in_flight == 0 and time.monotonic() < deadline:  # the last take admitted the next producer
            time.sleep(0.01)
        flying = buf.state_dict()["in_flight"]["prompt_id"].tolist()
        buf.complete([100 + flying[0]], [flying[0]])
        assert len(buf.take(1, step, timeout=60)) == 1
        step += 1
    waited = ray.get(waits, timeout=120)
    led = buf.ledger()
    with capsys.disabled():
        print(
            f"\nRemoteBuffer pace, {PRODUCERS} producer processes, admission_calls={ADMISSION_CALLS}: actor threads "
            f"{idle_threads} idle, {blocked_threads} with 6 dispatches waiting; ping while they wait "
            f"{ping_s * 1e3:.1f} ms; admission waits {led['admission_waits']}, longest wait {max(waited):.2f} s"
        )
    # Waiting producers take threads of the admission group only, which Ray sizes at admission_calls: never one
    # thread per producer beyond it (eight producers, four such threads), and the trainer's blocking take, in
    # its own group, is never starved by them.
    assert blocked_threads <= idle_threads + ADMISSION_CALLS
    assert led["admitted"] == PRODUCERS and led["admission_waits"] == PRODUCERS - 2 and led["taken"] == PRODUCERS
    buf.close()


class _Remote:
    """RemoteBuffer.create with the buffer constructor's signature, for scenario()."""

    def __new__(cls, capacity, **kwargs):
        # No journal: this checks pace through the actor, not its restart (tests/test_ray_cluster.py does),
        # and a journal rewritten on every call makes the 300-step scenario minutes long on two cores.
        return RemoteBuffer.create(capacity, journal=False, **kwargs)


def test_the_pace_scenario_holds_through_the_actor():
    # 60 of the scenario's 300 steps: every call is a round trip to the actor, and 300 steps of four producers
    # take many minutes on two loaded cores; the guarantee is per call and per step, the same at any length.
    run = scenario.scenario(_Remote, "pace", steps=REMOTE_STEPS)
    led = run.ledger
    assert run.violations == [] and run.overruns == []
    assert led["dropped_stale"] == 0 and led["trained_over_age"] == 0 and max(run.ages) <= scenario.MAX_AGE
    assert sorted(run.taken) == sorted(run.completed) and len(set(run.taken)) == len(run.taken)
    assert led["in_flight"] == 0 and led["buffer_left"] == 0 and led["admitted"] == led["dispatched"]


def test_a_blocked_remote_dispatch_is_woken_by_close():
    buf = RemoteBuffer.create(8, max_age=0, strategy="pace", prompts_per_step=1)
    buf.dispatch([0], 0)
    result = {}

    def produce():
        try:
            buf.dispatch([1], 0, timeout=60)
        except Exception as exc:  # the actor's BufferClosedError, re-raised in this process
            result["error"] = type(exc).__name__

    thread = threading.Thread(target=produce)
    thread.start()
    time.sleep(0.5)
    buf.close()
    thread.join(60)
    assert result.get("error") == "BufferClosedError"
