"""In-flight weight updates: ``restamp_in_flight(step)`` under ``age_from="finish"`` (docs/design.md, "In-flight
weight updates"). Examples on both implementations, and a randomized paced run on both, side by side, that checks
the bound the design proves: with restamps, nothing is trained older than max_age (from its finish step), nothing
is dropped, and the two implementations hand out the same batches."""

from __future__ import annotations

import random
import threading
import time

import pytest
from _helpers import assert_balanced

import pyfast_buffer as pfb


def test_it_raises_only_the_prompts_stamped_below_and_counts_them(impl):
    buf = impl(32, max_age=3, age_from="finish")
    buf.dispatch([1, 2], 0)
    buf.dispatch([3], 2)
    assert buf.restamp_in_flight(1) == 2 and buf.restamp_in_flight(1) == 0
    assert buf.restamp_in_flight(3) == 3
    buf.complete([10, 30], [1, 3])  # the default finish step is the stamp now: 3
    batch = buf.take(2, 3)
    assert batch.sample_step.tolist() == [3, 3] and batch.finish_step.tolist() == [3, 3]
    assert_balanced(buf)


def test_it_is_refused_under_age_from_start_and_changes_nothing(impl):
    buf = impl(32, max_age=3, strategy="pace", prompts_per_step=1)
    buf.dispatch([1], 0)
    before = (buf.ledger(), buf.admissible(0))
    with pytest.raises(ValueError, match=r"age_from='start'.*construct it with age_from='finish'"):
        buf.restamp_in_flight(2)
    assert (buf.ledger(), buf.admissible(0)) == before
    with pytest.raises(TypeError, match=r"step=1\.5 is not an int"):
        impl(8, age_from="finish").restamp_in_flight(1.5)
    with pytest.raises(ValueError, match="step=-1 is negative"):
        impl(8, age_from="finish").restamp_in_flight(-1)
    closed = impl(8, age_from="finish")
    closed.close()
    with pytest.raises(pfb.BufferClosedError):
        closed.restamp_in_flight(1)


def test_a_step_past_the_trainers_next_step_is_refused_and_cannot_move_paces_next_take(impl):
    # Without the limit, restamp_in_flight(2) here moved pace's next take from 0 to 2 unchecked, and the take at
    # step 3 trained a group stamped 0 at age 3 > max_age (found in review).
    buf = impl(32, max_age=2, strategy="pace", prompts_per_step=1, lookahead=2, age_from="finish")
    buf.put([10], 0)
    buf.put([11], 0)
    buf.dispatch([1], 0)
    before = (buf.ledger(), buf.admissible(0))
    with pytest.raises(ValueError, match=r"step=2 is past the trainer's next step 0.*\(<= 0\)"):
        buf.restamp_in_flight(2)
    assert (buf.ledger(), buf.admissible(0)) == before
    assert buf.take(1, 0).traj_ids.tolist() == [10]
    assert buf.restamp_in_flight(1) == 1  # after the take at step 0, the weights of step 1 are allowed
    drop = impl(32, max_age=2, age_from="finish")  # elsewhere: one past the largest step seen
    drop.dispatch([1], 3)
    with pytest.raises(ValueError, match="past the trainer's next step 4"):
        drop.restamp_in_flight(5)
    assert drop.restamp_in_flight(4) == 1


def test_a_restamp_wakes_a_blocked_take_and_a_waiting_paced_dispatch(impl):
    buf = impl(32, max_age=1, strategy="pace", prompts_per_step=1, lookahead=1, age_from="finish")
    buf.dispatch([1], 0)  # a straggler: at step 1 it is at max_age
    buf.put([20], 0)
    assert len(buf.take(1, 0)) == 1
    buf.put([21], 1)
    out: dict = {}

    def trainer() -> None:
        began = time.monotonic()
        out["batch"] = buf.take(1, 1, timeout=30)
        out["s"] = time.monotonic() - began

    t = threading.Thread(target=trainer)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()  # held by prompt 1, stamped 0
    assert buf.restamp_in_flight(1) == 1
    t.join(30)
    assert out["batch"].traj_ids.tolist() == [21] and out["s"] < 30
    # A paced dispatch that waits for room: after the take at step 0, prompt 1 (stamped 0) holds the one slot that
    # stamp 0 has left; raised to 1 it no longer does, and the waiting dispatch is admitted.
    paced = impl(32, max_age=1, strategy="pace", prompts_per_step=1, lookahead=1, age_from="finish")
    paced.dispatch([1], 0)
    paced.put([30], 0)
    assert paced.take(1, 0).traj_ids.tolist() == [30]
    assert paced.admissible(0) == 0
    errors: list = []

    def producer() -> None:
        try:
            paced.dispatch([2], 0, timeout=30)
            out["admitted"] = True
        except Exception as exc:  # surfaced below
            errors.append(exc)

    waiter = threading.Thread(target=producer)
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive() and not errors
    assert paced.restamp_in_flight(1) == 1
    waiter.join(30)
    assert not errors and out.get("admitted") is True and paced.in_flight == 2


def test_a_finish_step_below_the_raised_stamp_is_refused(impl):
    buf = impl(32, max_age=3, age_from="finish")
    buf.dispatch([1], 0)
    buf.restamp_in_flight(1)
    with pytest.raises(ValueError, match=r"finish_step=0 .*before step 1, the stamp of prompt 1"):
        buf.complete([10], [1], finish_step=0)
    assert buf.in_flight == 1 and len(buf) == 0


@pytest.mark.parametrize("strategy", ["pace", "wait"])
def test_a_restamped_straggler_no_longer_holds_the_trainer(impl, strategy):
    kwargs = {"prompts_per_step": 1} if strategy == "pace" else {}
    buf = impl(32, max_age=2, strategy=strategy, age_from="finish", **kwargs)
    buf.dispatch([1], 0)  # a long rollout
    buf.dispatch([2], 0)
    buf.complete([20], [2], finish_step=0)
    assert len(buf.take(1, 0)) == 1
    buf.dispatch([3], 1)
    buf.complete([30], [3], finish_step=1)
    assert len(buf.take(1, 1)) == 1
    buf.dispatch([4], 2)
    buf.complete([40], [4], finish_step=2)
    blocked = buf.take(1, 2)  # prompt 1, stamped 0, is at max_age: the gate holds the take
    assert len(blocked) == 0 and blocked.blocked_by == "in_flight_at_max_age"
    assert buf.restamp_in_flight(2) == 1  # the weights of step 2 now write prompt 1: it can finish no earlier
    assert buf.take(1, 2).traj_ids.tolist() == [40]
    buf.complete([10], [1], finish_step=3)
    batch = buf.take(1, 4)
    assert batch.traj_ids.tolist() == [10] and batch.age.tolist() == [1]


def _paced_run(seed: int) -> int:
    """A generator with slots and heavy-tailed rollouts, weights pushed to running generations at every trainer
    step; the trainer takes P groups whenever a batch is ready. Both implementations get the same calls."""
    rng = random.Random(seed)
    max_age, per_step, group, slots = rng.choice([1, 2, 3, 4]), rng.choice([1, 2, 3]), 2, rng.choice([3, 6, 10])
    lag = rng.choice([0, 1])
    bufs = [
        cls(256, max_age=max_age, strategy="pace", prompts_per_step=per_step, age_from="finish")
        for cls in (pfb.StalenessBuffer, pfb.ReferenceBuffer)
    ]
    flying: dict = {}  # prompt -> ticks left
    step = next_prompt = raised = trained = 0
    for _ in range(400):
        weights = max(0, step - lag)
        room = [b.admissible(weights) for b in bufs]
        assert room[0] == room[1]
        k = min(room[0], slots - len(flying))
        if k:
            prompts = list(range(next_prompt, next_prompt + k))
            next_prompt += k
            for b in bufs:
                b.dispatch(prompts, weights)
            flying.update({p: min(12, int(rng.lognormvariate(0, 1))) for p in prompts})
        for p in sorted(flying):
            flying[p] -= 1
            if flying[p] < 0:
                del flying[p]
                if rng.random() < 0.05:
                    for b in bufs:
                        b.fail([p])
                else:
                    for b in bufs:
                        b.complete([p * group + j for j in range(group)], [p] * group, finish_step=weights)
        while len(bufs[0]) >= per_step * group:
            batches = [b.take(per_step * group, step) for b in bufs]
            assert batches[0].traj_ids.tolist() == batches[1].traj_ids.tolist()
            if len(batches[0]) == 0:
                break
            assert int(batches[0].age.max()) <= max_age
            trained += len(batches[0])
            step += 1
            pushed = [b.restamp_in_flight(max(0, step - lag)) for b in bufs]  # the new weights reach the slots
            assert pushed[0] == pushed[1]
            raised += pushed[0]
    for b in bufs:
        led = b.ledger()
        assert led["dropped_stale"] == 0 and led["trained_over_age"] == 0, led
        assert_balanced(b)
    assert bufs[0].ledger() == bufs[1].ledger()
    assert trained > 0
    return raised


def test_paced_runs_with_in_flight_updates_keep_the_bound_on_both_implementations():
    raised = [_paced_run(seed) for seed in range(16)]
    assert sum(1 for r in raised if r) >= 8, raised  # most runs had stragglers that a weight push restamped
