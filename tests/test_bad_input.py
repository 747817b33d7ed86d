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


_META = r"traj_ids is a meta tensor \(a shape without data\); pass a tensor that holds the values"
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
    # numpy reads [True, 2] as int64 [1, 2]: a bool among ints must not become id 1 (issue 55, item 8).
    ("put bool among ids", lambda b: b.put([True, 2], 0), TypeError, r"traj_ids holds a bool at index 0 \(True\)"),
    ("put np.bool_ among ids", lambda b: b.put((3, np.True_), 0), TypeError, "traj_ids holds a bool at index 1"),
    ("put bool among stamps", lambda b: b.put([3, 4], [1, True]), TypeError, "sample_step holds a bool at index 1"),
    ("put bool among groups", lambda b: b.put([3, 4], 2, group_ids=[False, 7]), TypeError, "group_ids holds a bool"),
    ("dispatch bool among ids", lambda b: b.dispatch([False, 41], 2), TypeError, "prompt_ids holds a bool"),
    ("put bool step", lambda b: b.put([42], True), TypeError, "sample_step=True is a bool; pass .* an int"),
    ("put numpy bool step", lambda b: b.put([42], np.False_), TypeError, "sample_step=np.False_ is a bool"),
    ("put 0-d bool tensor step", lambda b: b.put([42], torch.tensor(True)), TypeError, "sample_step=True is a bool"),
    ("take bool step", lambda b: b.take(1, True), TypeError, "current_step=True is a bool"),
    ("put meta ids", lambda b: b.put(torch.empty(2, dtype=torch.long, device="meta"), 0), ValueError, _META),
    (
        "put meta ids grouped",
        lambda b: b.put(torch.empty(2, dtype=torch.long, device="meta"), 0, group_ids=[1, 1]),
        ValueError,
        _META,
    ),
    (
        "put meta stamps",
        lambda b: b.put([3, 4], torch.empty(2, dtype=torch.long, device="meta")),
        ValueError,
        "sample_step is a meta tensor",
    ),
    ("put meta 0-d stamp", lambda b: b.put([3], torch.tensor(1, device="meta")), ValueError, "sample_step is a meta"),
    (
        "dispatch meta ids",
        lambda b: b.dispatch(torch.empty(1, dtype=torch.long, device="meta"), 2),
        ValueError,
        "prompt_ids is a meta tensor",
    ),
    (
        "put meta source",
        lambda b: b.put([3], 2, source=torch.tensor(1, device="meta")),
        ValueError,
        "source is a meta tensor",
    ),
    # A negative view's memory holds x for the value -x: refused on the general path (group_ids given) and in
    # every other call; a conjugate view is complex, refused by its dtype.
    (
        "put negative view grouped",
        lambda b: b.put(torch._neg_view(torch.tensor([5, 6])), 2, group_ids=[1, 1]),
        ValueError,
        r"traj_ids is a negative view .*traj_ids.resolve_neg\(\)",
    ),
    (
        "put negative-view stamps",
        lambda b: b.put([5, 6], torch._neg_view(torch.tensor([1, 2]))),
        ValueError,
        r"sample_step is a negative view",
    ),
    (
        "dispatch negative view",
        lambda b: b.dispatch(torch._neg_view(torch.tensor([41])), 2),
        ValueError,
        r"prompt_ids is a negative view .*resolve_neg",
    ),
    (
        "complete negative view",
        lambda b: b.complete(torch._neg_view(torch.tensor([3])), [40]),
        ValueError,
        r"traj_ids is a negative view",
    ),
    # A 0-d bool array or tensor in a list of ids is read as 0/1 by numpy, as a bool is: refused the same way.
    (
        "put 0-d bool array among ids",
        lambda b: b.put([np.array(True), 2], 0),
        TypeError,
        r"traj_ids holds a bool at index 0 \(array\(True\)\) among ints; pass ints, not bools",
    ),
    (
        "put 0-d bool tensor among ids",
        lambda b: b.put([torch.tensor(True), 2], 0),
        TypeError,
        r"traj_ids holds a bool at index 0 \(tensor\(True\)\) among ints",
    ),
    (
        "dispatch 0-d bool array among ids",
        lambda b: b.dispatch([41, np.array(False)], 2),
        TypeError,
        r"prompt_ids holds a bool at index 1 \(array\(False\)\)",
    ),
    (
        "put 0-d bool tensor among int64s",
        lambda b: b.put([np.int64(3), torch.tensor(False)], 2, group_ids=[1, 1]),
        TypeError,
        r"traj_ids holds a bool at index 1 \(tensor\(False\)\)",
    ),
    # Tensors numpy cannot read, inside a list or as the argument: named, with the fix (not torch's bare error).
    (
        "put negative view in a list",
        lambda b: b.put([torch._neg_view(torch.tensor(4)), 2], 0),
        ValueError,
        r"traj_ids\[0\] is a negative view .*pass traj_ids\[0\]\.resolve_neg\(\) instead",
    ),
    (
        "put meta tensor in a list",
        lambda b: b.put([3, torch.tensor(4, device="meta")], 0),
        ValueError,
        r"traj_ids\[1\] is a meta tensor",
    ),
    (
        "put sparse tensor",
        lambda b: b.put(torch.tensor([5, 6]).to_sparse(), 0),
        TypeError,
        r"traj_ids is a torch.sparse_coo tensor; pass traj_ids\.to_dense\(\) instead",
    ),
    (
        "dispatch sparse tensor",
        lambda b: b.dispatch(torch.tensor([41, 42]).to_sparse(), 2),
        TypeError,
        r"prompt_ids is a torch.sparse_coo tensor; pass prompt_ids\.to_dense\(\)",
    ),
    (
        "put sparse tensor in a list",
        lambda b: b.put([torch.tensor(5).to_sparse(), 6], 0),
        TypeError,
        r"traj_ids\[0\] is a torch.sparse_coo tensor; pass traj_ids\[0\]\.to_dense\(\)",
    ),
    (
        "put grad tensor in a list",
        lambda b: b.put([torch.tensor(5.0, requires_grad=True), 6], 0),
        TypeError,
        r"traj_ids holds an element numpy cannot read as an id \(.*requires grad",
    ),
    # A set or dict has no order: numpy makes one object of it, which read as "ids that do not fit int64".
    ("put set", lambda b: b.put({3, 4}, 0), TypeError, r"traj_ids is a set \(set\), not a sequence of ids"),
    ("put dict", lambda b: b.put({3: 4}, 0), TypeError, r"traj_ids is a dict \(dict\), not a sequence of ids"),
    ("put empty set", lambda b: b.put(set(), 0), TypeError, r"traj_ids is a set \(set\)"),
    ("dispatch frozenset", lambda b: b.dispatch(frozenset({41}), 2), TypeError, r"prompt_ids is a set \(frozenset\)"),
    ("dispatch dict keys", lambda b: b.dispatch({41: 0}.keys(), 2), TypeError, r"prompt_ids is a set \(dict_keys\)"),
    (
        "put complex conj view",
        lambda b: b.put(torch.tensor([1 + 1j]).conj(), 0),
        TypeError,
        "traj_ids has dtype torch.complex64",
    ),
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


def test_put_fast_path_refuses_a_negative_view():
    """The native put's fast path copies a CPU int64 tensor's memory; a negative view's memory is not its values,
    so the fast path declines it and the general path refuses it by name (it once stored [5, 6] for [-5, -6])."""
    buf = _loaded(pfb.StalenessBuffer)
    before = buf.ledger()
    with pytest.raises(ValueError, match=r"traj_ids is a negative view .*resolve_neg"):
        buf.put(torch._neg_view(torch.tensor([5, 6])), 2)
    assert buf.ledger() == before


def test_put_of_a_negative_view_in_the_reference_is_refused_not_stored():
    buf = _loaded(pfb.ReferenceBuffer)
    before = buf.ledger()
    with pytest.raises(ValueError, match=r"traj_ids is a negative view .*traj_ids.resolve_neg\(\) instead"):
        buf.put(torch._neg_view(torch.tensor([5, 6])), 2)
    assert buf.ledger() == before and buf.take(8, 2).traj_ids.tolist() == [1, 2]


def test_resolved_views_and_int_lists_still_go_in(impl):
    buf = impl(8)
    buf.put(torch._neg_view(torch.tensor([5, 6])).resolve_neg(), 0, group_ids=[1, 1])
    buf.put([7, 8], [0, 1])
    assert buf.take(8, 1).traj_ids.tolist() == [-5, -6, 7, 8]


def test_int_scalars_arrays_and_tensors_in_a_list_still_go_in(impl):
    # The bool check looks at each element only when the list holds an array or tensor; their ints still go in.
    buf = impl(8)
    buf.put([np.int64(3), np.array(4), torch.tensor(5), 6], 0)
    buf.put((7, 8), 0)
    assert buf.take(8, 0).traj_ids.tolist() == [3, 4, 5, 6, 7, 8]
