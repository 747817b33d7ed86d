"""Every call reads its inputs once: another thread rewriting the caller's array during calls cannot unbalance
the ledger, make a raised call change anything, or leave a state_dict that does not load.

The rewriter uses in-place numpy/torch operations on arrays large enough that numpy and torch release the
GIL while they run, so rewrites overlap the buffer's calls (and the native core's GIL-free sections).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import pyfast_buffer as pfb
from _helpers import assert_balanced

N = 4096  # ids per call: large enough that in-place numpy/torch loops run without the GIL
BIG = 65536  # native dispatch/fail: a GIL-free window long enough that an unowned input is caught every run
ROUNDS = 120


class Rewriter:
    """Rewrites `array` in place in a tight loop until stopped: shifted ids, duplicates and negative stamps."""

    def __init__(self, array: np.ndarray | torch.Tensor) -> None:
        self.array = array
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        a = self.array
        base = a.clone() if isinstance(a, torch.Tensor) else a.copy()
        k = 0
        while not self.stop.is_set():
            k += 1
            if k % 3 == 0:
                a[: len(a) // 2] = a[len(a) // 2:]  # duplicates of the second half's values
            elif k % 3 == 1:
                a[:] = base  # the original values again...
                a += k % 5  # ...shifted: a different, still distinct set of ids
            else:
                a *= -1  # negative stamps or ids for a moment
                a *= -1

    def __enter__(self) -> "Rewriter":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def checked_call(buf, call) -> bool:
    """Runs call; asserts the ledger balances after it and that a raised call changed nothing."""
    before, size = buf.ledger(), len(buf)
    try:
        call()
    except ValueError:
        assert buf.ledger() == before and len(buf) == size
        assert_balanced(buf)
        return False
    assert_balanced(buf)
    return True


def reload_works(buf) -> None:
    sd = buf.state_dict()
    buf.load_state_dict(sd)
    assert_balanced(buf)


def fail_everything_in_flight(buf) -> None:
    prompts = buf.state_dict()["in_flight"]["prompt_id"].tolist()
    if prompts:
        buf.fail(prompts)


def test_dispatch_and_fail_against_a_rewriter(impl):
    buf = impl(8)
    # Reading the caller's array without the GIL (the bug this guards) unbalanced the ledger within a few rounds
    # at this size; the twin's per-id Python loop would take seconds at it, and it reads its copy in one go.
    ids = np.arange(BIG if impl is pfb.StalenessBuffer else N, dtype=np.int64)
    with Rewriter(ids):
        for i in range(ROUNDS):
            checked_call(buf, lambda: buf.dispatch(ids, 0))
            checked_call(buf, lambda: buf.fail(ids))
            if i % 10 == 0:
                reload_works(buf)
                fail_everything_in_flight(buf)
    reload_works(buf)


def test_complete_against_a_rewriter(impl):
    buf = impl(2 * N)
    prompts = np.arange(N, dtype=np.int64)
    trajs = np.arange(N, dtype=np.int64) + 10**9
    with Rewriter(prompts), Rewriter(trajs):
        for i in range(ROUNDS):
            fail_everything_in_flight(buf)
            buf.dispatch(np.arange(N, dtype=np.int64) + (i % 7) * N // 3, 0)  # overlaps what the rewriter makes
            checked_call(buf, lambda: buf.complete(trajs, prompts))
            if i % 10 == 0:
                reload_works(buf)
            buf.take(2 * N, 0)
    reload_works(buf)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_put_against_a_rewriter(impl, as_tensor):
    buf = impl(2 * N, max_age=4)
    make = (lambda a: torch.from_numpy(a)) if as_tensor else (lambda a: a)
    trajs = make(np.arange(N, dtype=np.int64))
    steps = make(np.full(N, 3, dtype=np.int64))
    groups = make(np.arange(N, dtype=np.int64) // 4)
    with Rewriter(trajs), Rewriter(steps), Rewriter(groups):
        for i in range(ROUNDS):
            checked_call(buf, lambda: buf.put(trajs, steps, group_ids=groups if i % 2 else None))
            if i % 10 == 0:
                reload_works(buf)
            buf.take(2 * N, 10**6)  # everything is stale by now: empties the ring
    reload_works(buf)
