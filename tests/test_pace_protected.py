"""strategy="pace" with max_attempts: a prompt's protected (max_attempts-th untrained) attempt is admitted first.

Real threads on both implementations. No assertion depends on timing: a test waits for a state it can see
(the buffer's repr names the calls waiting for admission, the ledger counts what was admitted) and only then
acts, and every wait in a test is bounded by a generous timeout that fails the test instead of hanging it.
"""

import re
import threading
import time

import pytest
from _helpers import assert_balanced

import pyfast_buffer as pfb

PATIENCE_S = 60.0  # how long a test waits for a state it expects (only reached when something is broken)


def paced(impl, max_age=1, per_step=1, **kwargs):
    """A paced buffer admitting (max_age + 1) * per_step prompt groups, protecting every second attempt."""
    return impl(64, max_age=max_age, strategy="pace", prompts_per_step=per_step, max_attempts=2, **kwargs)


def waiting(buf):
    """(calls waiting for admission, of them protected), as the buffer's repr shows them."""
    found = re.search(r"admission_waiting=(\d+), protected_waiting=(\d+)", repr(buf))
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def wait_for(condition, what):
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)


def lose_first_attempt(buf, prompt):
    """Dispatches `prompt` and fails it: its next attempt is its second untrained one, protected."""
    buf.dispatch([prompt], step=0)
    buf.fail([prompt])


class Producer(threading.Thread):
    """Dispatches once in a thread and records, in the shared `events` list, when it is admitted or why not."""

    def __init__(self, buf, name, prompts, step, timeout, events, lock):
        super().__init__(daemon=True)
        self.buf, self.label, self.prompts, self.step, self.timeout = buf, name, prompts, step, timeout
        self.events, self.lock, self.error = events, lock, None

    def run(self):
        try:
            self.buf.dispatch(self.prompts, step=self.step, timeout=self.timeout)
            outcome = "admitted"
        except Exception as exc:  # recorded for the test to assert on
            self.error, outcome = exc, type(exc).__name__
        with self.lock:
            self.events.append((self.label, outcome))


def start_waiting(buf, log, name, prompts, step, timeout, until):
    """Starts a Producer and returns it once the buffer shows `until` (calls waiting, of them protected)."""
    producer = Producer(buf, name, prompts, step, timeout, *log)
    producer.start()
    wait_for(lambda: waiting(buf) == until, f"the {name} dispatch to wait")
    return producer


def test_a_protected_dispatch_is_admitted_before_an_unprotected_one_waiting_longer(impl):
    buf = paced(impl)  # admits 2 prompt groups
    lose_first_attempt(buf, 7)
    buf.dispatch([1, 2], step=0)
    buf.complete([10], [1])
    assert buf.admissible(1) == 0
    events, lock = [], threading.Lock()
    log = (events, lock)
    unprotected = start_waiting(buf, log, "unprotected", [3], 1, PATIENCE_S, until=(1, 0))
    protected = start_waiting(buf, log, "protected", [7], 1, PATIENCE_S, until=(2, 1))

    buf.take(1, current_step=0)  # frees one slot: the protected call takes it although the other waited first
    protected.join(PATIENCE_S)
    assert not protected.is_alive() and events == [("protected", "admitted")]
    wait_for(lambda: waiting(buf) == (1, 0), "the protected waiter to leave")
    led = buf.ledger()
    assert (led["protected_admitted"], led["admitted_ahead"], led["admission_waits"]) == (1, 1, 1)
    assert buf.in_flight == 2 and buf.admissible(1) == 0  # prompts 2 and 7: no slot left for prompt 3

    buf.fail([2])  # a slot again, and nobody protected waiting: the unprotected call is admitted now
    unprotected.join(PATIENCE_S)
    assert not unprotected.is_alive()
    assert events == [("protected", "admitted"), ("unprotected", "admitted")]
    led = assert_balanced(buf)
    assert (led["admitted"], led["protected_admitted"], led["admitted_ahead"]) == (5, 1, 1)
    assert (led["admission_waits"], led["admission_refused"]) == (2, 0)
    buf.complete([70], [7])
    assert buf.data_metrics()["buffer/protected"] == 1  # the admitted attempt was the protected one
    metrics = buf.take(1, current_step=1).metrics
    assert (metrics["buffer/protected_admitted"], metrics["buffer/admitted_ahead"]) == (1, 1)


def test_an_unprotected_dispatch_that_fits_is_refused_while_a_protected_one_waits(impl):
    buf = paced(impl)
    lose_first_attempt(buf, 7)
    buf.dispatch([1], step=0)  # one slot left; the protected call below (prompts 7 and 8) needs two
    assert buf.admissible(0) == 1
    events, lock = [], threading.Lock()
    log = (events, lock)
    # Prompts 7 (protected) and 8 (a first attempt): a mixed call counts as protected.
    protected = start_waiting(buf, log, "protected", [7, 8], 0, PATIENCE_S, until=(1, 1))

    before = buf.ledger()
    with pytest.raises(pfb.AdmissionError, match=r"1 protected \(max_attempts\) dispatch.*waiting.*timeout="):
        buf.dispatch([3], step=0)  # would fit the one slot
    after = buf.ledger()
    assert after["admission_refused"] == before["admission_refused"] + 1
    assert {k: v for k, v in after.items() if k != "admission_refused"} == {
        k: v for k, v in before.items() if k != "admission_refused"
    }
    assert buf.in_flight == 1 and buf.admissible(0) == 1
    with pytest.raises(pfb.AdmissionError, match="protected"):
        buf.put([50], 0)  # a put is no protected attempt either
    with pytest.raises(TimeoutError, match=r"dispatch timed out after 0.05 s.*behind a protected dispatch"):
        buf.dispatch([3], step=0, timeout=0.05)
    assert events == [] and waiting(buf) == (1, 1)

    buf.fail([1])  # two slots: the protected call is admitted whole
    protected.join(PATIENCE_S)
    assert events == [("protected", "admitted")] and waiting(buf) == (0, 0)
    led = assert_balanced(buf)
    assert (led["protected_admitted"], led["admitted_ahead"]) == (1, 0)  # prompt 8 was a first attempt
    assert (led["admission_refused"], led["admission_waits"]) == (3, 2)
    buf.fail([8])
    buf.dispatch([3], step=0)  # nobody protected waits any more: admitted at once, without a timeout
    assert buf.in_flight == 2 and buf.ledger()["admitted"] == 5


def test_unprotected_waiters_are_woken_when_the_protected_one_times_out_or_is_closed(impl):
    buf = paced(impl)
    lose_first_attempt(buf, 7)
    buf.dispatch([1], step=0)  # one slot left
    events, lock = [], threading.Lock()
    log = (events, lock)
    protected = Producer(buf, "protected", [7, 8], 0, 1.5, events, lock)  # cannot fit: it times out
    protected.start()
    wait_for(lambda: waiting(buf) == (1, 1), "the protected dispatch to wait")
    behind = Producer(buf, "behind", [3], 0, PATIENCE_S, events, lock)
    behind.start()
    # (Had the protected call timed out before the other started, that one is admitted at once: same result.)
    wait_for(lambda: waiting(buf)[0] == 2 or events, "the unprotected dispatch to wait behind it")
    protected.join(PATIENCE_S)
    behind.join(PATIENCE_S)
    assert sorted(events) == [("behind", "admitted"), ("protected", "TimeoutError")]
    assert "waiting for admission under pace" in str(protected.error)
    led = assert_balanced(buf)
    assert (led["protected_admitted"], led["admitted_ahead"], led["admitted"]) == (0, 0, 3)

    events.clear()  # prompts 1 and 3 in flight fill the limit
    protected = start_waiting(buf, log, "protected", [7], 0, PATIENCE_S, until=(1, 1))
    behind = start_waiting(buf, log, "behind", [4], 0, PATIENCE_S, until=(2, 1))
    buf.close()
    protected.join(PATIENCE_S)
    behind.join(PATIENCE_S)
    assert sorted(events) == [("behind", "BufferClosedError"), ("protected", "BufferClosedError")]
    assert waiting(buf) == (0, 0)


NEW_KEYS = ("protected_admitted", "admitted_ahead")


def test_protected_admission_counts_survive_a_checkpoint_and_old_checkpoints_load(impl, tmp_path):
    buf = paced(impl)
    lose_first_attempt(buf, 7)
    buf.dispatch([7], step=0)
    led = buf.ledger()
    assert (led["protected_admitted"], led["admitted_ahead"]) == (1, 0)
    state = buf.state_dict()
    assert state["ledger"]["protected_admitted"] == 1
    buf.save(tmp_path / "ckpt")
    for target in (pfb.StalenessBuffer, pfb.ReferenceBuffer):
        for source in (state, pfb.checkpoint.load_state(tmp_path / "ckpt")):
            other = paced(target)
            other.load_state_dict(source)
            assert other.ledger()["protected_admitted"] == 1
        older = {**state, "ledger": {k: v for k, v in state["ledger"].items() if k not in NEW_KEYS}}
        other = paced(target)
        other.load_state_dict(older)  # written before these counters existed: they start at 0
        assert (other.ledger()["protected_admitted"], other.ledger()["admitted_ahead"]) == (0, 0)
        forged = {**state, "ledger": {**state["ledger"], "protected_admitted": state["ledger"]["admitted"] + 1}}
        with pytest.raises(ValueError, match="does not balance"):
            paced(target).load_state_dict(forged)


def test_max_attempts_two_under_pace_generates_no_prompt_more_than_twice(impl):
    """The acceptance property on pace: the slow prompts' first attempts run past their lease and are lost; the
    retry is protected (counted as admitted protected), nothing is generated a third time, the ledger balances."""
    slow, fast = list(range(100, 104)), list(range(24))
    buf = impl(256, max_age=2, strategy="pace", prompts_per_step=2, max_attempts=2)
    generated = {p: 0 for p in slow + fast}
    pending = {}  # prompt -> (step its rollout finishes, step its lease passes or None)
    trained, lost_once, queue, next_traj = set(), set(), slow + fast, 0
    for step in range(60):
        buf._set_lease_clock(step * 10**9)  # one second per step: a 2.5 s lease passes within 3 steps
        for p, (done, lost) in sorted(pending.items()):
            if lost is not None and lost <= step:
                del pending[p]  # the buffer expired it: dispatch it again, first
                lost_once.add(p)
                queue.insert(0, p)
            elif done == step:
                buf.complete([next_traj], [p])
                generated[p] += 1
                next_traj += 1
                del pending[p]
        while queue:
            p = queue[0]
            first_slow = p in slow and p not in lost_once
            try:
                buf.dispatch([p], step, lease=2.5 if first_slow else None)
            except pfb.AdmissionError:
                break  # full: the rest of the queue waits for the next step, in order
            queue.pop(0)
            pending[p] = (step + (4 if p in slow else 1), step + 3 if first_slow else None)
        trained.update(buf.take(2, step).group_ids.tolist())
    assert not queue and not pending and trained == set(slow + fast)
    assert all(generated[p] == 1 for p in slow + fast)  # a lost attempt generates nothing
    led = assert_balanced(buf)
    assert led["dropped_stale"] == 0 and led["expired"] == len(slow) and led["dispatched"] == len(fast) + 8
    assert led["protected_admitted"] == len(slow) and buf.data_metrics()["buffer/protected"] == len(slow)
    assert buf.starved() == {}


def test_the_log_line_carries_the_protected_counters_and_audit_reads_them(impl, tmp_path, caplog):
    import logging

    from pyfast_buffer.workflow.audit import audit, format_result

    caplog.set_level(logging.INFO, logger="pyfast_buffer")
    buf = paced(impl)
    lose_first_attempt(buf, 7)
    buf.dispatch([7, 8], step=0)  # prompt 7 protected, 8 a first attempt
    buf.complete([70, 80], [7, 8])
    buf.take(2, current_step=0)
    assert caplog.records[-1].getMessage().endswith(" protected_admitted=1 admitted_ahead=0 retired_early=0")
    log = tmp_path / "train.log"
    log.write_text("\n".join(r.getMessage() for r in caplog.records) + "\n")
    result = audit([str(log)])
    assert result.balanced and result.segments[0].pace["protected_admitted"] == 1
    assert "protected_admitted=1 admitted_ahead=0" in format_result(result)


def test_data_metrics_carry_the_protected_admissions(impl):
    buf = paced(impl)
    lose_first_attempt(buf, 7)
    buf.dispatch([7], step=0)
    m = buf.data_metrics()
    assert (m["buffer/protected_admitted"], m["buffer/admitted_ahead"]) == (1, 0)
