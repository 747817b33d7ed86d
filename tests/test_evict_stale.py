"""evict_stale: the one-pass compaction (vectorised where the CPU allows) and the binary-search path."""

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from _helpers import assert_balanced

import pyfast_buffer as pfb

# meta too: the vectorised pass once zeroed the meta (response length, source, flags) of a row the scalar tail
# after it moved without its meta (a put-only ring's shortcut); only a comparison of the column shows it.
KEYS = ("traj_id", "group_id", "sample_step", "policy_version", "finish_step", "uses", "group_len", "meta")


def _contents(buf):
    entries = buf.state_dict()["entries"]
    return {k: entries[k].tolist() for k in KEYS}


def _assert_same_released(native, ref):
    a, b = native.released(), ref.released()
    assert a.ids.tolist() == b.ids.tolist() and a.reasons.tolist() == b.reasons.tolist()


@pytest.mark.parametrize("seed", range(12))
def test_compaction_matches_the_reference_across_the_wrap_point(seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(40, 400))
    native = pfb.StalenessBuffer(capacity, max_age=3, max_uses=2, track_released=True)
    ref = pfb.ReferenceBuffer(capacity, max_age=3, max_uses=2, track_released=True)
    step = 10
    for _ in range(6):
        n = int(rng.integers(1, capacity))
        ids = np.arange(n, dtype=np.int64) + step * 1000
        stamps = rng.integers(step - 8, step + 1, size=n)  # shuffled: some stale, some fresh
        take = int(rng.integers(1, 20))
        for buf in (native, ref):
            buf.put(ids, stamps)
            buf.take(take, step)  # moves the head, so the live region wraps around the ring
        assert native.evict_stale(step) == ref.evict_stale(step)
        assert _contents(native) == _contents(ref)
        _assert_same_released(native, ref)  # the compaction (SIMD where the CPU has it) reported the stale ids
        step += int(rng.integers(0, 3))
    assert_balanced(native)
    assert native.ledger() == ref.ledger()


def test_the_vectorised_pass_keeps_every_survivors_meta():
    """Eight rows for the vectorised pass (four kept), then two for the scalar tail: the tail's kept row sits
    where the vector store left zeros. Its meta must stay "no length, untagged" (as put), and so must a
    completed row's response length (a ring whose metas differ moves them in both passes)."""
    stamps = [11, 11, 11, 11, 12, 13, 13, 12, 13, 10]
    for lengths in (False, True):
        pair = (pfb.StalenessBuffer(64, max_age=2), pfb.ReferenceBuffer(64, max_age=2))
        for buf in pair:
            for i, stamp in enumerate(stamps):
                if lengths:
                    buf.dispatch([i], stamp)
                    buf.complete([30 + i], [i], lengths=[100 + i])
                else:
                    buf.put([30 + i], stamp)
            assert buf.evict_stale(14) == 5
        assert _contents(pair[0]) == _contents(pair[1])
        meta = pair[0].state_dict()["entries"]["meta"].tolist()
        if lengths:
            assert [m & 0xFFFFFFFF for m in meta] == [104, 105, 106, 107, 108]
        else:
            assert meta == [0xFFFFFFFF] * 5


def test_survivors_that_are_sorted_are_then_cut_by_binary_search():
    stamps = np.array([5, 1, 6, 0, 7, 8, 2, 9] * 100)  # out of order; the ones kept at step 9 are not sorted
    native = pfb.StalenessBuffer(1000, max_age=2, track_released=True)
    ref = pfb.ReferenceBuffer(1000, max_age=2, track_released=True)
    for buf in (native, ref):
        buf.put(np.arange(len(stamps)), stamps)
    assert native.evict_stale(9) == ref.evict_stale(9) == 500  # keeps 7, 8, 9 per block
    assert _contents(native) == _contents(ref)
    assert native.evict_stale(11) == ref.evict_stale(11) == 200  # keeps only the 9s: sorted again
    assert _contents(native) == _contents(ref)
    assert native.evict_stale(12) == ref.evict_stale(12) == 100  # the binary-search cut
    assert len(native) == len(ref) == 0
    released = native.released()
    assert sorted(released.ids.tolist()) == list(range(len(stamps))) and set(released.reasons.tolist()) == {1}
    assert released.ids.tolist() == ref.released().ids.tolist()


def test_the_scalar_pass_matches_too():
    """PYFAST_BUFFER_NO_SIMD forces the portable pass that CPUs without AVX-512 run."""
    code = """
import numpy as np, pyfast_buffer as pfb
for seed in range(20):
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(40, 300))
    pair = (pfb.StalenessBuffer(cap, max_age=2, track_released=True),
            pfb.ReferenceBuffer(cap, max_age=2, track_released=True))
    for step in (8, 9, 11):
        n = int(rng.integers(1, cap)); stamps = rng.integers(step - 6, step + 1, size=n); k = int(rng.integers(1, 30))
        for buf in pair:
            buf.put(np.arange(n) + 1000 * step, stamps)
            buf.take(k, step)
        assert pair[0].evict_stale(step) == pair[1].evict_stale(step)
        entries = [buf.state_dict()["entries"] for buf in pair]
        for key in ("traj_id", "group_id", "sample_step", "uses", "group_len", "meta"):
            assert entries[0][key].tolist() == entries[1][key].tolist(), key
        released = [buf.released() for buf in pair]
        assert released[0].ids.tolist() == released[1].ids.tolist(), "released ids"
        assert released[0].reasons.tolist() == released[1].reasons.tolist(), "released reasons"
print("ok")
"""
    env = {**os.environ, "PYFAST_BUFFER_NO_SIMD": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tempfile.gettempdir()
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# Every column survives the compaction: the rows after evict_stale are exactly the rows before it that were fresh,
# in order, whatever mix of calls filled the ring (the compaction leaves out columns that flags prove unchanged:
# meta, uses and group_len, and the columns that mirror others after plain puts; each flag is exercised here).
_EVERY_COLUMN_CHECK = """
import sys
import numpy as np, pyfast_buffer as pfb
COLUMNS = ("traj_id", "group_id", "sample_step", "finish_step", "dispatch_ns", "complete_ns", "uses", "group_len",
           "meta")
MAX_AGE = 2

def check(buf, step):
    before = buf.state_dict()["entries"]
    fresh = before["sample_step"] >= step - MAX_AGE
    buf.evict_stale(step)
    after = buf.state_dict()["entries"]
    for key in COLUMNS:
        assert after[key].tolist() == before[key][fresh].tolist(), (key, step)

def fill(buf, rng, step, next_id, kinds):
    for kind in kinds:
        n = int(rng.integers(1, 40))
        ids = np.arange(next_id, next_id + n); next_id += n
        stamps = rng.integers(step - 5, step + 1, size=n)
        if kind == "plain":
            buf.put(ids, stamps)
        elif kind == "grouped":
            buf.put(ids, int(stamps[0]), group_ids=ids // 4)
        elif kind == "finish":  # finished one step later, never past the trainer's step
            buf.put(ids, np.minimum(stamps, step - 1), finish_step=np.minimum(stamps, step - 1) + 1)
        elif kind == "source":
            buf.put(ids, stamps, source=int(rng.integers(0, 3)))
        else:  # dispatched and completed: a prompt's id, its own completion time
            s = int(rng.integers(step - 5, step + 1))
            buf.dispatch([next_id], s)
            buf.complete(ids, [next_id] * n)
            next_id += 1
    return next_id

KINDS = ["plain", "grouped", "finish", "source", "completed"]
for seed in range(int(sys.argv[1])):
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(100, 7000))  # past the 2048-row blocks, and wrapping (on_full evicts the oldest)
    buf = pfb.StalenessBuffer(cap, max_age=MAX_AGE, max_uses=int(rng.choice([1, 3])))
    next_id = 0
    for step in range(10, 16):
        kinds = ["plain"] * 3 if rng.random() < 0.4 else list(rng.choice(KINDS, size=int(rng.integers(1, 5))))
        for _ in range(int(rng.integers(1, 1 + 2 * cap // 40))):
            next_id = fill(buf, rng, step, next_id, kinds)
        if rng.random() < 0.5:
            buf.take(int(rng.integers(1, 60)), step)
        if rng.random() < 0.3:  # the flags come back from a state_dict
            fresh = pfb.StalenessBuffer(cap, max_age=MAX_AGE, max_uses=buf.config.max_uses)
            fresh.load_state_dict(buf.state_dict())
            buf = fresh
        check(buf, step)
# Reused entries (uses 1), half of them stale a step later, then untaken ones (uses 0) that move onto their rows.
buf = pfb.StalenessBuffer(64, max_age=MAX_AGE, max_uses=3)
buf.put(np.arange(10), np.tile([8, 10], 5))
assert len(buf.take(10, 10)) == 10
buf.put(np.arange(10, 20), 10)
check(buf, 11)
# A ring past the size where the compaction writes past the caches (non-temporal stores, on every CPU).
big = 2_200_000
buf = pfb.StalenessBuffer(big, max_age=MAX_AGE)
rng = np.random.default_rng(7)
buf.put(np.arange(big), rng.integers(5, 11, size=big))
check(buf, 10)
buf.put(np.arange(big, big + 1000), 10, group_ids=np.arange(1000) // 8)  # grouped: every column moves
check(buf, 12)
print("ok")
"""


@pytest.mark.parametrize("simd", ["off", "default"])
def test_every_column_of_the_fresh_rows_survives_the_compaction_in_order(simd):
    env = dict(os.environ)
    env.pop("PYFAST_BUFFER_NO_SIMD", None)
    if simd == "off":
        env["PYFAST_BUFFER_NO_SIMD"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", _EVERY_COLUMN_CHECK, "12"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
