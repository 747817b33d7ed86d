"""Several producer threads and one consumer: the ledger balances and every id is accounted for once."""

import threading
import time

from _helpers import assert_balanced
from _torch_race import assert_race_survived, race_first_torch_import
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

PRODUCERS = 3
SECONDS = 1.0  # at least this long, and on until every producer made MIN_CALLS calls (a loaded machine is slow)
MIN_CALLS = 40
LIMIT_S = 60.0


def _run(buf, produce, consume_step):
    stop = threading.Event()
    taken, errors = [], []

    calls = [0] * PRODUCERS

    def producer(k):
        try:
            i = 0
            while not stop.is_set():
                produce(buf, k, i)
                i += 1
                calls[k] = i
        except Exception as exc:
            errors.append(exc)

    def consumer():
        step = 0
        try:
            while not stop.is_set() or len(buf):
                batch = buf.take(8, consume_step(step), timeout=None)
                taken.extend(batch.traj_ids.tolist())
                step += 1
                if not len(batch):
                    time.sleep(0.0005)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(PRODUCERS)]
    threads.append(threading.Thread(target=consumer))
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    deadline = time.monotonic() + LIMIT_S
    while min(calls) < MIN_CALLS and not errors and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    return taken


def test_every_id_is_taken_exactly_once_with_blocking_producers(impl):
    buf = impl(64, max_age=10**9, on_full="block")
    put_ids = [[] for _ in range(PRODUCERS)]

    def produce(b, k, i):
        base = (k << 40) + 4 * i
        prompt = (k << 40) + i
        if i % 2:
            b.dispatch([prompt], 0)
            b.complete([base, base + 1, base + 2], [prompt] * 3, timeout=5)
            put_ids[k].extend([base, base + 1, base + 2])
        else:
            b.put([base, base + 1], 0, timeout=5)
            put_ids[k].extend([base, base + 1])

    taken = _run(buf, produce, lambda step: 0)
    everything = [t for ids in put_ids for t in ids]
    assert len(everything) > 100
    left = buf.state_dict()["entries"]["traj_id"].tolist()  # a producer may finish after the consumer
    assert sorted(taken + left) == sorted(everything)  # each once, none lost, none invented
    led = assert_balanced(buf)
    assert led["retired"] == len(taken) and led["buffer_left"] == len(left)
    assert led["sampled_total"] == len(everything) and led["in_flight"] == 0


def test_ledger_balances_under_drops_evictions_and_failures(impl):
    buf = impl(32, max_age=2, on_full="evict_oldest")
    clock = {"step": 0}

    def produce(b, k, i):
        prompt = (k << 40) + i
        b.dispatch([prompt], max(0, clock["step"] - i % 4))
        if i % 5 == 0:
            b.fail([prompt])
        else:
            b.complete([prompt * 2, prompt * 2 + 1], [prompt, prompt])

    def consume_step(step):
        clock["step"] = step // 10
        return clock["step"]

    taken = _run(buf, produce, consume_step)
    assert len(taken) == len(set(taken)) > 0
    led = assert_balanced(buf)
    assert led["dropped_stale"] > 0 and led["failed"] > 0 and led["evicted"] >= 0
    assert led["retired"] == len(taken)


@settings(max_examples=3, deadline=None, derandomize=True, phases=[Phase.generate])  # no shrinking: seconds each
@given(
    impl=st.sampled_from(["StalenessBuffer", "ReferenceBuffer"]),
    how=st.sampled_from(["batch", "thread"]),
    seed=st.integers(0, 2**16),
)
def test_producers_race_a_real_first_torch_import(tmp_path_factory, impl, how, seed):
    """Four producer threads, one drawn mix of calls each, while the process's first `import torch` runs (issue 55;
    tests/_torch_race.py): no producer dies, each keeps working once torch has loaded."""
    assert_race_survived(race_first_torch_import(tmp_path_factory.mktemp("race"), impl, how, seed))
