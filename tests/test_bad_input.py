"""Every bad call raises ValueError/TypeError naming the argument and the fix, and changes nothing."""

import math

import numpy as np
import pytest
import torch

import pyfast_buffer as pfb


def _loaded(impl):
    buf = impl(8, max_age=3)
    buf.put([1, 2], 2)
    buf.dispatch([40], 2)
    return buf


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"capacity": 0}, ValueError, "capacity=0 must be >= 1"),
        ({"capacity": -5}, ValueError, "capacity=-5"),
        ({"capacity": 2.5}, TypeError, "capacity=2.5 is not an int"),
        ({"capacity": 4, "max_age": -1}, ValueError, "max_age=-1 must be >= 0"),
        ({"capacity": 4, "strategy": "fifo"}, ValueError, "strategy='fifo' is unknown; use 'drop', 'wait' or 'pace'"),
        ({"capacity": 4, "on_full": "grow"}, ValueError, "on_full='grow' is unknown"),
        ({"capacity": 4, "max_uses": 0}, ValueError, "max_uses=0 must be >= 1"),
        ({"capacity": 4, "parameter_sync_step": 0}, ValueError, "parameter_sync_step=0 must be >= 1"),
        ({"capacity": 4, "pin_memory": "yes"}, TypeError, "pin_memory='yes'"),
        ({"capacity": 2**61}, ValueError, "capacity=2305843009213693952 must be <= 1099511627776"),
        ({"capacity": 4, "max_uses": 2**31}, ValueError, "max_uses=2147483648 must be <="),
    ],
)
def test_bad_construction(impl, kwargs, error, match):
    with pytest.raises(error, match=match):
        impl(**kwargs)


BAD_CALLS = [
    ("put float ids", lambda b: b.put([1.5, 2.0], 0), TypeError, "traj_ids has dtype float64"),
    ("put bool ids", lambda b: b.put([True], 0), TypeError, "traj_ids has dtype bool"),
    ("put float tensor", lambda b: b.put(torch.tensor([1.0]), 0), TypeError, "traj_ids has dtype torch.float32"),
    ("put scalar id", lambda b: b.put(5, 0), TypeError, "traj_ids=5 is not a sequence"),
    ("put 2-d ids", lambda b: b.put(np.zeros((2, 2), dtype=np.int64), 0), ValueError, "pass a 1-D sequence"),
    ("put huge id", lambda b: b.put([2**64], 0), ValueError, "fit int64"),
    ("put nan step", lambda b: b.put([3], math.nan), ValueError, "sample_step=nan"),
    ("put float step", lambda b: b.put([3], 1.0), TypeError, "sample_step=1.0 is not an int"),
    ("put negative step", lambda b: b.put([3], -1), ValueError, "sample_step=-1 is negative"),
    ("put negative stamps", lambda b: b.put([3, 4], [1, -2]), ValueError, "negative stamp -2"),
    ("put stamps length", lambda b: b.put([3, 4], [1, 2, 3]), ValueError, "3 stamps for 2 trajectories"),
    ("put group length", lambda b: b.put([3, 4], 2, group_ids=[1]), ValueError, "group_ids has 1"),
    ("complete lengths", lambda b: b.complete([3, 4], [40]), ValueError, "traj_ids has 2 entries but prompt_ids has 1"),
    ("complete not in flight", lambda b: b.complete([3], [41]), ValueError, "prompt 41 is not in flight"),
    ("fail not in flight", lambda b: b.fail([41]), ValueError, "prompt 41 is not in flight"),
    ("dispatch twice", lambda b: b.dispatch([40], 3), ValueError, "prompt 40 is already in flight"),
    ("dispatch negative", lambda b: b.dispatch([41], -3), ValueError, "step=-3 is negative"),
    ("dispatch float step", lambda b: b.dispatch([41], 2.0), TypeError, "step=2.0 is not an int"),
    ("take zero", lambda b: b.take(0, 3), ValueError, "batch_size=0 must be >= 1"),
    ("take float size", lambda b: b.take(2.0, 3), TypeError, "batch_size=2.0 is not an int"),
    ("clock goes back", lambda b: b.take(1, 1), ValueError, "current_step=1 is lower than step 2"),
    ("evict clock goes back", lambda b: b.evict_stale(0), ValueError, "current_step=0 is lower than step 2"),
    ("dispatch huge step", lambda b: b.dispatch([41], 2**63), ValueError, "does not fit int64"),
    ("put huge step", lambda b: b.put([3], 2**64), ValueError, "does not fit int64"),
    ("take huge step", lambda b: b.take(1, 2**63), ValueError, "current_step=9223372036854775808 does not fit"),
    ("take huge batch", lambda b: b.take(2**63, 3), ValueError, "batch_size=9223372036854775808 must be <="),
    ("evict huge step", lambda b: b.evict_stale(2**64), ValueError, "does not fit int64"),
    ("take nan step", lambda b: b.take(1, math.nan), ValueError, "current_step=nan"),
    ("negative timeout", lambda b: b.take(1, 3, timeout=-1), ValueError, "timeout=-1.0 must be"),
    ("infinite timeout", lambda b: b.take(1, 3, timeout=math.inf), ValueError, "finite number of seconds"),
    ("string timeout", lambda b: b.take(1, 3, timeout="1"), TypeError, "timeout='1' is not a number"),
    ("load garbage", lambda b: b.load_state_dict({"x": 1}), TypeError, "state_dict must be a dict made by state_dict"),
]


@pytest.mark.parametrize("name, call, error, match", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_call_names_the_argument_and_changes_nothing(impl, name, call, error, match):
    buf = _loaded(impl)
    before, size, in_flight = buf.ledger(), len(buf), buf.in_flight
    with pytest.raises(error, match=match):
        call(buf)
    assert buf.ledger() == before and len(buf) == size and buf.in_flight == in_flight
    assert buf.take(8, 2).traj_ids.tolist() == [1, 2]  # the contents are intact too


def test_a_huge_batch_size_returns_what_is_ready(impl):
    buf = impl(4, max_age=9)
    buf.put([1, 2], 0)
    batch = buf.take(10**12, 0)
    assert batch.traj_ids.tolist() == [1, 2] and batch.blocked_by == "too_few_ready"


def test_state_dict_counters_outside_int64_are_rejected(impl):
    buf = impl(4)
    sd = buf.state_dict()
    sd["ledger"]["dispatched"] = sd["ledger"]["completed"] = 2**64
    with pytest.raises(ValueError, match="counters outside"):
        impl(4).load_state_dict(sd)


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.put([1], 0),
        lambda b: b.dispatch([1], 0),
        lambda b: b.complete([1], [40]),
        lambda b: b.fail([40]),
        lambda b: b.take(1, 3),
        lambda b: b.evict_stale(3),
        lambda b: b.load_state_dict(b.state_dict()),
    ],
)
def test_any_call_after_close_raises_buffer_closed(impl, call):
    buf = _loaded(impl)
    buf.close()
    buf.close()  # idempotent
    with pytest.raises(pfb.BufferClosedError, match="the buffer is closed"):
        call(buf)
    assert isinstance(pfb.BufferClosedError("x"), ValueError)
    assert buf.ledger()["buffer_left"] == 2 and buf.closed  # introspection still works after close
