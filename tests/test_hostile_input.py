"""What a hostile user finds at the edges: huge steps, NaN through the private core, capacities that cannot fit,
copies of a buffer, and batches far smaller than their request."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
from _helpers import assert_balanced
from _torch_race import assert_race_survived, race_first_torch_import
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import pyfast_buffer as pfb
from pyfast_buffer import _core

TOP = 2**63 - 1  # the largest step the API accepts


def test_age_sums_past_int64_are_exact(impl):
    buf = impl(8, max_age=TOP)
    buf.put([1, 2, 3], 0)
    batch = buf.take(3, TOP)
    assert batch.age.tolist() == [TOP] * 3
    assert batch.metrics["buffer/age_mean"] == float(TOP) and batch.metrics["buffer/age_max"] == TOP


def test_native_and_twin_agree_on_huge_ages():
    a, b = pfb.StalenessBuffer(8, max_age=TOP), pfb.ReferenceBuffer(8, max_age=TOP)
    for buf in (a, b):
        buf.put([1, 2], [0, 5])
        buf.put([3], 7)
    assert a.take(8, TOP).metrics == b.take(8, TOP).metrics


@pytest.mark.parametrize("target", [pfb.StalenessBuffer, pfb.ReferenceBuffer])
def test_a_buffer_that_saw_the_top_step_checkpoints_and_loads(impl, target):
    buf = impl(8, max_age=5)
    buf.put([1], TOP)
    buf.dispatch([7], TOP)
    other = target(8)
    other.load_state_dict(buf.state_dict())
    assert len(other) == 1 and other.in_flight == 1
    assert_balanced(other)


def test_a_clock_past_int64_is_refused(impl):
    buf = impl(8)
    sd = buf.state_dict()
    sd["clock"] = 2**63
    with pytest.raises(ValueError, match="clock outside int64"):
        buf.load_state_dict(sd)


def test_ledger_counters_the_buffer_could_not_add_to_are_refused(impl):
    # Raised together the ledger still balances, but the next put would overflow put_total.
    buf = impl(8)
    buf.put([1], 0)
    sd = buf.state_dict()
    sd["ledger"]["put_total"] += 2**63 - 2
    sd["ledger"]["evicted"] += 2**63 - 2
    with pytest.raises(ValueError, match=r"counters outside \[0, 2\*\*60\]"):
        buf.load_state_dict(sd)
    assert buf.ledger()["put_total"] == 1 and len(buf) == 1


def test_the_core_refuses_out_of_range_counters_itself():
    ring = _core.Ring(8, 3, "drop", 1, "block", 0)
    ring.put(np.array([1], dtype=np.int64), None, np.array([0], dtype=np.int64), None)
    state = ring.export_state()
    state["ledger"]["evicted"] = 2**63 - 1  # would overflow the balance check's sum
    with pytest.raises(ValueError, match="outside"):
        ring.import_state(state)
    assert len(ring) == 1


def _ring() -> _core.Ring:
    return _core.Ring(8, 3, "drop", 1, "block", 0)


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf, -1.0, 1e300])
def test_no_nan_or_inf_reaches_the_clock_through_the_private_core(seconds):
    ring = _ring()
    ring.put(np.arange(8, dtype=np.int64), None, np.zeros(1, dtype=np.int64), None)
    out = np.empty(_core.BATCH_COLUMNS * 8, dtype=np.int64)
    ring.dispatch(np.array([1], dtype=np.int64), 0)
    before = ring.ledger()
    for call in (
        lambda: ring.take(out, 9, 0, seconds),
        lambda: ring.put(np.array([99], dtype=np.int64), None, np.zeros(1, dtype=np.int64), seconds),
        lambda: ring.complete(np.array([5], dtype=np.int64), np.array([1], dtype=np.int64), seconds),
        lambda: ring.dispatch(np.array([2], dtype=np.int64), 0, seconds),
        lambda: ring.renew(np.array([1], dtype=np.int64), seconds),
        lambda: ring.expire_in_flight(seconds),
    ):
        with pytest.raises(ValueError, match="must be a finite number of seconds"):
            call()
    assert ring.ledger() == before


def test_a_capacity_too_large_for_memory_names_capacity_and_bytes(impl):
    with pytest.raises(MemoryError, match=r"capacity=1000000000000 needs 64000000000000 bytes .*lower capacity"):
        impl(10**12)


def test_the_core_reports_a_failed_allocation_as_memory_error():
    with pytest.raises(MemoryError, match=r"capacity=1000000000000 needs 64000000000000 bytes"):
        _core.Ring(10**12, 3, "drop", 1, "error", 0)


@pytest.mark.parametrize("clone", [copy.copy, copy.deepcopy, lambda b: pickle.dumps(b)])
def test_copies_are_refused_pointing_to_state_dict(impl, clone):
    buf = impl(4)
    buf.put([1], 0)
    with pytest.raises(TypeError, match=r"cannot be copied or pickled.*state_dict\(\)"):
        clone(buf)
    assert len(buf) == 1 and not buf.closed


def test_a_small_batch_of_a_huge_request_owns_only_its_rows(impl):
    buf = impl(1_000_000)
    buf.put([1], 0)
    batch = buf.take(10**9, 0)
    assert batch.traj_ids.tolist() == [1]
    assert batch.columns.untyped_storage().nbytes() == 8 * len(pfb.FIELDS)  # the int64 fields of one row, not 1e6
    assert batch.columns.is_contiguous()


def test_a_full_batch_is_not_copied():
    buf = pfb.StalenessBuffer(64)
    buf.put(list(range(64)), 0)
    batch = buf.take(64, 0)
    assert batch.columns.untyped_storage().nbytes() == 8 * len(pfb.FIELDS) * 64


@settings(max_examples=2, deadline=None, derandomize=True, phases=[Phase.generate])  # no shrinking: seconds each
@given(impl=st.sampled_from(["StalenessBuffer", "ReferenceBuffer"]), seed=st.integers(0, 2**16))
def test_bad_arguments_during_the_first_torch_import_are_refused_as_bad_input(tmp_path_factory, impl, seed):
    """Bad arguments (floats, strings, nested lists, bools, a negative step...) drawn by producers while another
    thread runs the process's first `import torch`: each is refused with TypeError or ValueError, never torch's
    half-built module's AttributeError (issue 55; tests/_torch_race.py)."""
    out = race_first_torch_import(tmp_path_factory.mktemp("race"), impl, "thread", seed, hostile=True)
    assert_race_survived(out, hostile=True)
