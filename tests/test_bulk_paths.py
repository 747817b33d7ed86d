"""The native core's bulk paths against the reference twin, at sizes the stateful test does not reach.

The core copies whole column runs (ungrouped and contiguous-group puts, takes of 16 or more
consecutive entries, wrap-around splits) and falls back to a hash-map grouping for interleaved
group ids; each path must hand out exactly what the twin hands out.
"""

import random

import numpy as np
import pytest
from _helpers import assert_balanced

import pyfast_buffer as pfb


def _rows(batch):
    return batch.columns[[0, 1, 2, 3, 4, 5]].tolist()  # the stamps in ns differ between the two


def _group_ids(rng: random.Random, trajs, kind: str):
    if kind == "none":
        return None
    if kind == "contiguous":
        size = rng.choice([1, 2, 8])
        return [t // size for t in trajs]
    ids = [t // 4 for t in trajs]  # interleaved: the same group ids, shuffled within the call
    rng.shuffle(ids)
    return ids


@pytest.mark.parametrize("seed", range(6))
def test_bulk_put_and_take_match_the_twin(seed):
    rng = random.Random(seed)
    kwargs = dict(
        capacity=rng.choice([97, 128, 300]),
        max_age=rng.choice([2, 5]),
        max_uses=rng.choice([1, 1, 2]),
        parameter_sync_step=rng.choice([None, 3]),
        track_released=rng.random() < 0.5,
    )
    native, ref = pfb.StalenessBuffer(**kwargs), pfb.ReferenceBuffer(**kwargs)
    next_traj, clock = 0, 0
    for _ in range(60):
        n = rng.choice([1, 7, 16, 40, 64])
        trajs = list(range(next_traj, next_traj + n))
        next_traj += n
        kind = rng.choice(["none", "contiguous", "interleaved"])
        groups = _group_ids(rng, trajs, kind)
        if kind == "interleaved" or rng.random() < 0.5:
            stamps = max(0, clock - rng.randint(0, 6))  # groups must share a stamp: one for the call
        else:
            stamps = [max(0, clock - rng.randint(0, 6))] * n
        for buf in (native, ref):
            buf.put(np.array(trajs, np.int64), stamps, group_ids=groups)
        clock += rng.randint(0, 1)
        batch = rng.choice([8, 16, 33, 64, 128])
        a, b = native.take(batch, clock), ref.take(batch, clock)
        assert _rows(a) == _rows(b)
        assert a.metrics == b.metrics
        if rng.random() < 0.2:
            assert native.evict_stale(clock) == ref.evict_stale(clock)
        assert len(native) == len(ref)
        if kwargs["track_released"]:  # the released-id hooks see what the bulk paths moved
            a_ids, b_ids = native.released(), ref.released()
            assert a_ids.ids.tolist() == b_ids.ids.tolist() and a_ids.reasons.tolist() == b_ids.reasons.tolist()
    assert native.ledger() == ref.ledger()
    assert_balanced(native)


@pytest.mark.parametrize("interleaved", [False, True])
def test_complete_groups_match_the_twin(interleaved):
    rng = random.Random(7)
    native, ref = pfb.StalenessBuffer(200, max_age=3), pfb.ReferenceBuffer(200, max_age=3)
    for call in range(20):
        prompts = list(range(10 * call, 10 * call + 10))
        prompt_of = [p for p in prompts for _ in range(8)]
        if interleaved:
            rng.shuffle(prompt_of)
        trajs = list(range(80 * call, 80 * call + 80))
        for buf in (native, ref):
            buf.dispatch(prompts, call)
            buf.complete(trajs, prompt_of)
        a, b = native.take(48, call + 1), ref.take(48, call + 1)
        assert _rows(a) == _rows(b) and a.metrics == b.metrics
    assert native.ledger() == ref.ledger()
