"""state_dict / load_state_dict: a checkpoint restores contents, in-flight prompts and ledger exactly."""

import io

import pytest
import torch
from _helpers import assert_balanced, rows

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
