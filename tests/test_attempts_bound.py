"""The prompt-attempt table past its bound: the core's open-addressing table against the twin's OrderedDict.

The buffers' constructors keep the default bound (max(2 * capacity, 65536) records); here both are rebuilt
with a bound of a few records right after construction, before any call, so random runs cross it many times:
forgetting order, the forgotten count, the starved gauges and the retry counts must agree exactly, and a
checkpoint taken past the bound must load back to the same table.
"""

from __future__ import annotations

from typing import List

from hypothesis import given, settings
from hypothesis import strategies as st

import pyfast_buffer as pfb
from pyfast_buffer import _core
from pyfast_buffer.attempts import PromptAttempts

ATTEMPT_KEYS = (
    "buffer/retries",
    "buffer/prompts_retried",
    "buffer/regenerations",
    "buffer/prompts_starved",
    "buffer/protected",
    "buffer/attempts_forgotten",
)


def _small_table(buf, bound: int, max_attempts: int) -> None:
    """Gives `buf` (fresh, never called) an attempt table of `bound` records."""
    if isinstance(buf, pfb.StalenessBuffer):
        c = buf.config
        buf._ring = _core.Ring(
            c.capacity, c.max_age, c.strategy, 1, "evict_oldest", 0, None,
            max_attempts=max_attempts, attempts_bound=bound,
        )  # fmt: skip
        for source, age in c.source_bounds():
            buf._ring.set_source_max_age(source, age)
    else:
        buf._attempts = PromptAttempts(bound)


def _pair(bound: int, max_attempts: int) -> List:
    bufs = [
        cls(32, max_age=1, max_attempts=max_attempts or None, source_max_age={1: 2})
        for cls in (pfb.StalenessBuffer, pfb.ReferenceBuffer)
    ]
    for buf in bufs:
        _small_table(buf, bound, max_attempts)
    return bufs


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("dispatch"), st.lists(st.integers(0, 15), min_size=1, max_size=5, unique=True)),
        st.tuples(st.just("complete"), st.integers(0, 15)),
        st.tuples(st.just("fail"), st.integers(0, 15)),
        st.tuples(st.just("take"), st.integers(1, 3)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_OPS, st.integers(1, 6), st.sampled_from([0, 2]))
def test_past_its_bound_the_table_forgets_alike_on_both_implementations(ops, bound, max_attempts):
    bufs = _pair(bound, max_attempts)
    step, next_traj, in_flight, seen = 0, 0, set(), set()
    for op, arg in ops:
        if op == "dispatch":
            fresh = [p for p in arg if p not in in_flight]
            if not fresh:
                continue
            for buf in bufs:
                buf.dispatch(fresh, step, source=fresh[0] % 2)
            in_flight.update(fresh)
            seen.update(fresh)
        elif op in ("complete", "fail") and in_flight:
            arg = sorted(in_flight)[arg % len(in_flight)]  # always an in-flight prompt
            in_flight.discard(arg)
            for buf in bufs:
                if op == "complete":
                    buf.complete([next_traj, next_traj + 1], [arg, arg])
                else:
                    buf.fail([arg])
            next_traj += 2
        elif op == "take":
            step += arg
            got = [buf.take(4, step).traj_ids.tolist() for buf in bufs]
            assert got[0] == got[1]
        native, twin = (buf.data_metrics() for buf in bufs)
        assert [native[k] for k in ATTEMPT_KEYS] == [twin[k] for k in ATTEMPT_KEYS]
        assert bufs[0].starved(1) == bufs[1].starved(1) and bufs[0].starved(2) == bufs[1].starved(2)
        assert len(bufs[0].starved(1)) <= bound  # never more records than the bound
        # Every prompt seen beyond the bound's worth is forgotten at least once.
        assert native["buffer/attempts_forgotten"] >= len(seen) - bound
    # A checkpoint past the bound loads back to the same table (the records and their order).
    for buf in bufs:
        state = buf.state_dict()
        again = type(buf)(32, max_age=1, max_attempts=max_attempts or None, source_max_age={1: 2})
        _small_table(again, bound, max_attempts)
        again.load_state_dict(state)
        assert again.starved(1) == buf.starved(1)
        assert [again.data_metrics()[k] for k in ATTEMPT_KEYS] == [buf.data_metrics()[k] for k in ATTEMPT_KEYS]
        # The recency order survived: one more prompt forgets the same (least recently touched) record in both.
        for b in (buf, again):
            b.dispatch([1000], step + 1)
        assert again.starved(1) == buf.starved(1)


def test_the_least_recently_touched_goes_first_and_a_completion_touches(impl):
    buf = impl(16, max_age=5)
    _small_table(buf, 3, 0)
    buf.dispatch([1, 2, 3], 0)
    buf.complete([10], [1])  # prompt 1 touched last now: 2 is the least recently touched
    buf.dispatch([4], 0)
    assert sorted(buf.starved(1)) == [1, 3, 4] and buf.data_metrics()["buffer/attempts_forgotten"] == 1
    buf.fail([2])  # forgotten while in flight: nothing to attribute, nothing counted
    buf.dispatch([2], 0)  # back as a first attempt; forgets 3
    assert sorted(buf.starved(1)) == [1, 2, 4] and buf.data_metrics()["buffer/retries"] == 0
