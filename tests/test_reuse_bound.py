"""max_uses > 1 under drop and pace: no use is ever trained past max_age, and the ledger balances exactly.

Randomized runs drive the native buffer and its twin in lockstep (same calls, same batches, same ledger): under
drop a reused entry that went stale is dropped at the take; under pace every use is a group's last, counted in
retired_early (docs/design.md, "Reuse under the bound").
"""

import random

import pytest
from _helpers import assert_balanced

import pyfast_buffer as pfb


def _both(**kwargs):
    return pfb.StalenessBuffer(**kwargs), pfb.ReferenceBuffer(**kwargs)


def _same_batch(a, b):
    assert a.traj_ids.tolist() == b.traj_ids.tolist()
    assert a.age.tolist() == b.age.tolist() and a.uses.tolist() == b.uses.tolist()
    assert a.blocked_by == b.blocked_by
    return a


def _run_pace(seed):
    rng = random.Random(seed)
    max_age, per_step, max_uses = rng.randint(0, 4), rng.randint(1, 4), rng.randint(2, 5)
    lookahead = rng.randint(0, max_age)
    bufs = _both(
        capacity=256,
        max_age=max_age,
        strategy="pace",
        prompts_per_step=per_step,
        lookahead=lookahead,
        max_uses=max_uses,
    )
    next_id, late, ages, taken_total = 0, [], [], 0
    for t in range(rng.randint(5, 40)):
        for b in bufs:  # the stragglers of the previous step complete before this step's take
            b.complete([p + 10_000 for p in late], late)
        n = rng.randint(0, bufs[0].admissible(t))
        assert n <= bufs[1].admissible(t)
        ids = list(range(next_id, next_id + n))
        next_id += n
        for b in bufs:
            b.dispatch(ids, step=t)
        now = [p for p in ids if rng.random() < 0.6]
        late = [p for p in ids if p not in now]
        for b in bufs:
            b.complete([p + 10_000 for p in now], now)
        batches = [_same_batch(*(b.take(per_step, current_step=t) for b in bufs))]
        if batches[0].blocked_by == "in_flight_at_max_age":
            # pace's assumption: the trainer does not move on past the gate; the stragglers complete, it takes again
            for b in bufs:
                b.complete([p + 10_000 for p in late], late)
            late = []
            batches.append(_same_batch(*(b.take(per_step, current_step=t) for b in bufs)))
        for batch in batches:
            ages += batch.age.tolist()
            taken_total += len(batch)
            assert set(batch.uses.tolist()) <= {1}  # every use is the first and the last
    led = [assert_balanced(b, quiescent=False) for b in bufs]
    assert led[0] == led[1]
    assert all(a <= max_age for a in ages), (seed, max_age, max(ages))
    assert led[0]["trained_over_age"] == 0 and led[0]["dropped_stale"] == 0
    assert led[0]["retired_early"] == led[0]["retired"] == led[0]["taken"] == taken_total
    return taken_total


def _run_drop(seed):
    rng = random.Random(seed)
    max_age, max_uses = rng.randint(0, 4), rng.randint(2, 5)
    bufs = _both(capacity=64, max_age=max_age, strategy="drop", max_uses=max_uses, on_full="evict_oldest")
    next_id, step, reused = 0, 0, 0
    for _ in range(rng.randint(5, 60)):
        if rng.random() < 0.6:
            n = rng.randint(1, 6)
            stamp = max(0, step - rng.randint(0, max_age + 2))
            ids = list(range(next_id, next_id + n))
            next_id += n
            for b in bufs:
                b.put(ids, [stamp] * n)
        else:
            step += rng.randint(0, 2)
            size = rng.randint(1, 8)
            batch = _same_batch(*(b.take(size, current_step=step) for b in bufs))
            assert all(a <= max_age for a in batch.age.tolist()), (seed, batch.age.tolist())
            assert all(u <= max_uses for u in batch.uses.tolist())
            reused += sum(u > 1 for u in batch.uses.tolist())
    led = [assert_balanced(b) for b in bufs]
    assert led[0] == led[1]
    assert led[0]["trained_over_age"] == 0 and led[0]["retired_early"] == 0
    return reused


@pytest.mark.parametrize("seed", range(40))
def test_pace_with_reuse_never_trains_past_max_age(seed):
    _run_pace(seed)


@pytest.mark.parametrize("seed", range(40))
def test_drop_with_reuse_never_trains_past_max_age(seed):
    _run_drop(seed)


def test_the_randomized_runs_reach_reuse_and_retire_early():
    # The runs above are not vacuous: drop reuses entries, pace retires groups below max_uses.
    assert sum(_run_drop(seed) for seed in range(40)) > 0
    assert sum(_run_pace(seed) for seed in range(40)) > 0


def test_a_paced_group_retires_after_one_use_and_says_so(impl, caplog):
    buf = impl(8, max_age=3, strategy="pace", prompts_per_step=1, max_uses=3)
    buf.dispatch([1], step=0)
    buf.complete([10], [1])
    with caplog.at_level("INFO", logger="pyfast_buffer"):
        batch = buf.take(1, current_step=0)
    assert batch.traj_ids.tolist() == [10] and len(buf) == 0
    assert batch.metrics[pfb.batch.metric_key("retired_early")] == 1
    assert "retired_early=1" in caplog.records[-1].getMessage()
    led = assert_balanced(buf)
    assert led["retired"] == led["retired_early"] == 1 and led["trained_over_age"] == 0
    assert len(buf.take(1, current_step=1)) == 0  # no second use


def test_retired_early_survives_a_state_dict_and_an_old_one_loads(impl):
    buf = impl(8, max_age=3, strategy="pace", prompts_per_step=1, max_uses=2)
    buf.dispatch([1, 2], step=0)
    buf.complete([10], [1])
    buf.take(1, current_step=0)
    sd = buf.state_dict()
    again = impl(8, max_age=3, strategy="pace", prompts_per_step=1, max_uses=2)
    again.load_state_dict(sd)
    assert again.ledger()["retired_early"] == 1
    del sd["ledger"]["retired_early"]  # a state_dict from before the counter
    old = impl(8, max_age=3, strategy="pace", prompts_per_step=1, max_uses=2)
    old.load_state_dict(sd)
    assert old.ledger()["retired_early"] == 0


def test_audit_reconciles_retired_early_and_refuses_more_than_retired(impl, tmp_path, caplog):
    from pyfast_buffer.workflow.audit import audit, format_result

    caplog.set_level("INFO", logger="pyfast_buffer")
    buf = impl(8, max_age=3, strategy="pace", prompts_per_step=2, max_uses=4)
    buf.dispatch([1, 2], step=0)
    buf.complete([10, 20], [1, 2])
    buf.take(2, current_step=0)
    log = tmp_path / "train.log"
    log.write_text("\n".join(r.getMessage() for r in caplog.records) + "\n")
    result = audit([str(log)])
    assert result.balanced and result.segments[0].pace["retired_early"] == 2
    assert "retired below max_uses (pace, one use a group): 2 of 2 (<= retired: ok)" in format_result(result)
    bad = tmp_path / "bad.log"
    bad.write_text("dropped_stale=0 taken=2 buffer_left=0 sampled_total=2 retired=2 evicted=0 retired_early=3\n")
    assert not audit([str(bad)]).balanced
