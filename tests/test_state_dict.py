"""state_dict / load_state_dict: a checkpoint restores contents, in-flight prompts and ledger exactly."""

import io

import pytest
import torch
from _helpers import assert_balanced, rows
from hypothesis import given, settings
from hypothesis import strategies as st

import pyfast_buffer as pfb


def _busy(impl):
    buf = impl(6, max_age=3, max_uses=2)
    buf.put([1, 2], 0, group_ids=[5, 5])
    buf.put([3, 4, 5], [1, 2, 2])
    buf.put([6, 7], 2)  # evicts group 5
    buf.take(2, 2)  # 3 and 4 stay with uses=1
    buf.dispatch([70, 71], 2)
    return buf


@pytest.mark.parametrize("target", [pfb.StalenessBuffer, pfb.ReferenceBuffer])
def test_round_trip_through_torch_save_into_either_implementation(impl, target):
    src = _busy(impl)
    blob = io.BytesIO()
    torch.save(src.state_dict(), blob)
    blob.seek(0)
    dst = target(6, max_age=3, max_uses=2)
    dst.load_state_dict(torch.load(blob))
    assert dst.ledger() == src.ledger() and dst.in_flight == src.in_flight == 2
    assert_balanced(dst)
    with pytest.raises(ValueError, match="lower than step 2"):
        dst.take(1, 1)  # the clock came along
    a, b = src.take(6, 3), dst.take(6, 3)
    assert rows(a) == rows(b) and a.metrics == b.metrics
    assert a.dispatch_ns.tolist() == b.dispatch_ns.tolist()
    src.complete([9], [70])
    dst.complete([9], [70])
    assert rows(src.take(6, 3)) == rows(dst.take(6, 3))


def test_load_checks_capacity_and_max_uses_and_changes_nothing(impl):
    sd = _busy(impl).state_dict()
    small = impl(2, max_uses=2)
    small.put([1], 0)
    before = small.ledger()
    with pytest.raises(ValueError, match="more than capacity=2"):
        small.load_state_dict(sd)
    once = impl(8, max_uses=1)
    with pytest.raises(ValueError, match="not below max_uses=1"):
        once.load_state_dict(sd)
    assert small.ledger() == before and len(small) == 1


def test_load_rejects_an_edited_ledger(impl):
    sd = _busy(impl).state_dict()
    sd["ledger"]["retired"] += 1
    with pytest.raises(ValueError, match="does not balance"):
        impl(8, max_uses=2).load_state_dict(sd)


def test_load_rejects_a_broken_group(impl):
    sd = _busy(impl).state_dict()
    sd["entries"]["group_len"][0] = 5
    with pytest.raises(ValueError, match="not contiguous and uniform"):
        impl(8, max_uses=2).load_state_dict(sd)


def _frozen(value):
    """A deep copy of a state_dict (tensors cloned), to compare with what the same dict holds later."""
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value


def _assert_same(a, b, where="state"):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


@settings(max_examples=25, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from("pdcftS"), st.integers(0, 5)), min_size=1, max_size=40))
@pytest.mark.parametrize("impl_name", ["StalenessBuffer", "ReferenceBuffer"])
def test_a_state_dict_is_a_snapshot_that_later_calls_never_change(impl_name, ops):
    """Every state_dict taken along a random run still holds what it held when it was taken: it shares no memory
    with the live buffer (the twin's source counts once did, issue 55), so a save() of it is consistent."""
    buf = getattr(pfb, impl_name)(64, max_age=2, max_uses=2, on_full="evict_oldest")
    snapshots, step = [], 0
    for tid, (op, k) in enumerate(ops, start=1):
        if op == "p":
            buf.put([tid, tid + 1000], step, source=k)
        elif op == "d":
            buf.dispatch([tid], step, source=k)
        elif op == "c" and buf.in_flight:
            prompt = int(buf.state_dict()["in_flight"]["prompt_id"][0])
            buf.complete([tid], [prompt])
        elif op == "f" and buf.in_flight:
            buf.fail([int(buf.state_dict()["in_flight"]["prompt_id"][0])])
        elif op == "t":
            step += k % 2
            buf.take(1 + k, step)
        elif op == "S":
            sd = buf.state_dict()
            snapshots.append((sd, _frozen(sd)))
    snapshots.append((buf.state_dict(), None))
    buf.put([10**6], step, source=1)  # one more of everything that is counted
    buf.dispatch([10**6 + 1], step, source=1)
    buf.take(4, step + 1)
    for sd, frozen in snapshots[:-1]:
        _assert_same(sd, frozen)
    last, _ = snapshots[-1]
    assert int(last["source_counts"].sum()) < int(buf.state_dict()["source_counts"].sum())  # the counts moved on
