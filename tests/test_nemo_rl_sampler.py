"""pyfast_buffer's NeMo RL sampler against a fake of NeMo's buffer surface and its pumps' call order
(``_nemo_fake``, written from NeMo's source): the protocol, each strategy's select/evict/admit/abort, the
accounting of every attempt, the straggler of NeMo RL #3238 under drop, wait and pace, and a resume."""

from __future__ import annotations

import asyncio

import pytest
from _nemo_fake import PROTOCOL, FakeTQReplayBuffer, NemoLoop, Rollout, balanced, create_sampler

from pyfast_buffer import checkpoint
from pyfast_buffer.integrations.nemo_rl import StalenessSampler

TARGET = "pyfast_buffer.integrations.nemo_rl:StalenessSampler"
LIVENESS_S = 60.0


def build(strategy="drop", max_age=1, per_step=4, **extras):
    buffer = FakeTQReplayBuffer()
    sampler = create_sampler(buffer, TARGET, strategy=strategy, max_age=max_age, **extras)
    sampler.set_dispatch_index(0)
    sampler.required_buffer_capacity(per_step)
    return buffer, sampler


def ready_group(buffer, start, end=None):
    gid = buffer.reserve(weight_version=start)
    asyncio.run(buffer.commit(gid, [3, 4], start, start if end is None else end))
    return gid


# ---- the protocol and the config --------------------------------------------------------------------------
def test_nemos_create_sampler_loads_it_with_the_extras_and_the_protocol_holds():
    _buffer, sampler = build("pace", max_age=2, per_step=4, lookahead=1)
    assert all(hasattr(sampler, m) for m in PROTOCOL) and isinstance(sampler, StalenessSampler)
    assert asyncio.iscoroutinefunction(sampler.admit) and asyncio.iscoroutinefunction(sampler.select)
    assert not sampler.is_on_policy and build(max_age=0)[1].is_on_policy
    assert sampler.required_buffer_capacity(4) == (1 + 1) * 4  # the pace window NeMo checks max_buffered against
    assert build("drop")[1].required_buffer_capacity(4) is None
    assert StalenessSampler.supports_buffer_checkpoint is False


@pytest.mark.parametrize(
    "extras, error, match",
    [
        ({"max_age": "2"}, TypeError, r"max_age='2' must be an int \(write it unquoted"),
        ({"strategy": "fast"}, ValueError, "strategy='fast' is unknown"),
        ({"max_ages": 2}, TypeError, "unknown key 'max_ages'; did you mean 'max_age'"),
        ({"max_attempts": 2}, ValueError, "max_attempts cannot be honoured: NeMo RL gives a sampler no prompt"),
        ({"strategy": "drop", "lookahead": 1}, ValueError, "lookahead=1 needs strategy=pace"),
    ],
)
def test_bad_extra_keys_are_refused_naming_the_key_and_the_fix(extras, error, match):
    with pytest.raises(error, match=match):
        StalenessSampler(FakeTQReplayBuffer(), **extras)


def test_set_dispatch_index_refuses_a_negative_step():
    with pytest.raises(ValueError, match="resume_from_step=-1"):
        build()[1].set_dispatch_index(-1)


# ---- select, evict, abort ------------------------------------------------------------------------------------
def test_drop_selects_the_stalest_within_max_age_and_evict_clears_the_rest():
    buffer, sampler = build("drop", max_age=1)
    old, mid, new = ready_group(buffer, 0), ready_group(buffer, 1), ready_group(buffer, 2)
    unready = buffer.reserve(weight_version=2)

    async def main():
        assert await sampler.evict(current_train_weight=2) == 1  # age 2 > 1: dropped, its rows cleared
        meta, n = await sampler.select(current_train_weight=2, min_prompt_groups=1, max_prompt_groups=1)
        return meta, n

    meta, n = asyncio.run(main())
    assert n == 1 and meta.sample_ids == [f"{mid}_g0", f"{mid}_g1"]  # the stalest fresh group first
    assert buffer._group_ids == [new, unready] and buffer.cleared == [f"{old}_g0", f"{old}_g1"]
    assert sampler.last_selection_trajectory_ages == [1] and sampler.metrics()["buffer/trajectory_age/max"] == 1
    assert sampler.ledger()["dropped_stale"] == 1 and sampler.ledger()["in_flight"] == 1


def test_select_honours_min_and_max_and_never_removes_an_unfinished_group():
    buffer, sampler = build("drop", max_age=3)
    groups = [ready_group(buffer, 0) for _ in range(3)]
    buffer.reserve(weight_version=0)

    async def main():
        assert await sampler.select(current_train_weight=0, min_prompt_groups=4, max_prompt_groups=5) == (None, 0)
        meta, n = await sampler.select(current_train_weight=0, min_prompt_groups=2, max_prompt_groups=5)
        assert n == 3 and {s.rsplit("_g", 1)[0] for s in meta.sample_ids} == set(groups)
        with pytest.raises(ValueError, match="need 1 <= min <= max"):
            await sampler.select(current_train_weight=0, min_prompt_groups=0, max_prompt_groups=1)

    asyncio.run(main())
    assert len(buffer) == 1 and not buffer.ready_list[0]


def test_should_abort_inflight_under_drop_only_past_the_bound():
    _, drop = build("drop", max_age=2)
    assert drop.should_abort_inflight(start_weight_version=2, current_train_weight=5)
    assert not drop.should_abort_inflight(start_weight_version=3, current_train_weight=5)
    for strategy in ("wait", "pace"):
        assert not build(strategy, max_age=2)[1].should_abort_inflight(start_weight_version=0, current_train_weight=9)
    assert not build("drop", max_age=2, abort_inflight=False)[1].should_abort_inflight(
        start_weight_version=0, current_train_weight=9
    )


def test_wait_selects_nothing_while_an_unfinished_group_is_at_max_age():
    buffer, sampler = build("wait", max_age=1)
    fresh = ready_group(buffer, 1)
    late = buffer.reserve(weight_version=0)  # age 1 at version 1: nothing is taken until it ends

    async def main():
        assert await sampler.select(current_train_weight=1, min_prompt_groups=1, max_prompt_groups=1) == (None, 0)
        await buffer.commit(late, [3, 4], 0, 1)
        meta, _n = await sampler.select(current_train_weight=1, min_prompt_groups=2, max_prompt_groups=2)
        return meta

    assert {s.rsplit("_g", 1)[0] for s in asyncio.run(main()).sample_ids} == {fresh, late}
    assert sampler.ledger()["taken"] == 2 and sampler.ledger()["dropped_stale"] == 0  # waited, then both trained


def test_pace_admit_holds_a_batch_until_room_without_blocking_the_loop():
    buffer, sampler = build("pace", max_age=1, per_step=2)  # window (1 + 1) * 2 = 4 groups

    async def main():
        version = 0
        await sampler.admit(trainer_version_fn=lambda: version)
        await sampler.admit(trainer_version_fn=lambda: version)
        gids = [buffer.reserve(weight_version=0) for _ in range(4)]
        third = asyncio.create_task(sampler.admit(trainer_version_fn=lambda: version))
        ticks = 0
        for _ in range(20):  # the loop runs while admit waits
            await asyncio.sleep(0.001)
            ticks += 1
        assert not third.done() and ticks == 20
        for gid in gids[:2]:
            await buffer.commit(gid, [3], 0, 0)
        _meta, n = await sampler.select(current_train_weight=0, min_prompt_groups=2, max_prompt_groups=2)
        assert n == 2
        version = 1  # the step is trained: the next batch is stamped 1 and fits
        await asyncio.wait_for(third, LIVENESS_S)

    asyncio.run(main())
    assert sampler.ledger()["admitted"] == 6


# ---- NeMo's loop --------------------------------------------------------------------------------------------
def loop_for(strategy, max_age=1, per_step=4, rollout=None, **extras):
    buffer, sampler = build(strategy, max_age=max_age, per_step=per_step, **extras)
    capacity = sampler.required_buffer_capacity(per_step) or per_step * (max_age + 2)
    return NemoLoop(sampler, buffer, per_step, rollout or Rollout(seed=1), max_buffered=capacity)


@pytest.mark.parametrize("strategy", ["drop", "wait", "pace"])
def test_thirty_steps_of_nemos_loop_account_for_every_attempt(strategy):
    loop = loop_for(strategy, max_age=1, rollout=Rollout(seed=3, fail_rate=0.1))
    asyncio.run(asyncio.wait_for(loop.run(30), LIVENESS_S))
    led = balanced(loop)
    lags = [lag for _, _, lags in loop.trained for lag in lags]
    assert sum(n for _, n, _ in loop.trained) == 30 * 4
    assert led["failed"] + led["slots_returned"] >= loop.counts["failed_attempts"]
    if strategy in ("drop", "pace"):
        assert max(lags) <= 1  # NeMo's own lag measure, per trained row
    if strategy == "pace":
        assert led["dropped_stale"] == 0 and led["trained_over_age"] == 0


@pytest.mark.parametrize("strategy", ["drop", "wait", "pace"])
def test_a_straggler_in_a_group_never_wedges_training_and_its_cost_is_counted(strategy):
    # NeMo RL #3238: one slow session holds its whole group; here prompt 5's rollout takes 0.3 s (others ~4 ms).
    rollout = Rollout(seed=2, fail_rate=0.0, straggler=lambda p: 0.3 if p == 5 else None)
    loop = loop_for(strategy, max_age=1, rollout=rollout)
    asyncio.run(asyncio.wait_for(loop.run(20), LIVENESS_S))
    led = balanced(loop)
    assert sum(n for _, n, _ in loop.trained) == 20 * 4  # training went on
    if strategy == "drop":  # not waited for: aborted in flight (lost, counted) or dropped when it came back
        assert led["aborted"] + led["dropped_stale"] >= 1 and loop.counts["aborted"] == led["aborted"]
    else:  # waited for: nothing dropped, the wait is the cost (trainer idle)
        assert led["dropped_stale"] == 0 and loop.idle_s > 0.2
        lags = [lag for _, _, lags in loop.trained for lag in lags]
        assert strategy == "wait" or max(lags) <= 1


def test_a_straggler_that_never_finishes_is_failed_by_nemos_timeout_and_training_goes_on():
    rollout = Rollout(seed=2, fail_rate=0.0, straggler=lambda p: 1e9 if p == 5 else None, timeout_s=0.2)
    for strategy in ("wait", "pace"):
        loop = loop_for(strategy, max_age=1, rollout=rollout)
        asyncio.run(asyncio.wait_for(loop.run(10), LIVENESS_S))
        assert loop.counts["failed_attempts"] >= 1 and balanced(loop)["failed"] >= 1


def test_a_resume_keeps_the_admission_state_and_counts_what_nemo_lost(tmp_path):
    state = str(tmp_path / "sampler.pfb")
    loop = loop_for("pace", max_age=1, state_path=state)
    asyncio.run(asyncio.wait_for(loop.run(6), LIVENESS_S))
    loop.sampler.save_state(state)  # as the run stopped: attempts cancelled mid-generation, their slots held
    saved = asyncio.run(loop.buffer.state_dict())  # NeMo keeps finished groups only
    in_flight_saved = len(checkpoint.load_state(state)["core"]["in_flight"]["prompt_id"])  # at the last save
    # A new process: NeMo builds the buffer, the sampler (same state_path), restores the groups, resumes at step 6.
    buffer = FakeTQReplayBuffer()
    sampler = create_sampler(buffer, TARGET, strategy="pace", max_age=1, state_path=state)
    sampler.set_dispatch_index(6)
    sampler.required_buffer_capacity(4)
    asyncio.run(buffer.load_state_dict(saved))
    led = sampler.ledger()
    assert led["lost_in_resume"] >= 0 and led["in_flight"] == 0
    resumed = NemoLoop(sampler, buffer, 4, Rollout(seed=5), max_buffered=8, start_version=6)
    resumed.capacity = asyncio.Semaphore(8 - len(buffer))  # NeMo holds a permit per restored group
    asyncio.run(asyncio.wait_for(resumed.run(6), LIVENESS_S))
    led = sampler.ledger()
    assert led["trained_over_age"] == 0 and led["dropped_stale"] == 0
    assert max(lag for _, _, lags in resumed.trained for lag in lags) <= 1
    assert in_flight_saved > 0 and led["lost_in_resume"] == in_flight_saved


@pytest.mark.parametrize("max_age", [0, 1])
def test_pace_at_a_tight_bound_survives_a_slow_failed_first_attempt(max_age):
    # Issue 59, item 1: 2 groups a step, one prompt's first attempt fails after 20 ms; at max_age 0 NeMo's retry
    # started unadmitted, was evicted, and training waited for it forever.
    rollout = Rollout(seed=4, fail_rate=0.0, fail_first=lambda p: 0.02 if p == 1 else None)
    loop = loop_for("pace", max_age=max_age, per_step=2, rollout=rollout)
    asyncio.run(asyncio.wait_for(loop.run(8), LIVENESS_S))
    led = balanced(loop)
    assert sum(n for _, n, _ in loop.trained) == 8 * 2 and loop.counts["failed_attempts"] == 1
    assert led["evicted_unadmitted"] == 0 and led["dropped_stale"] == 0 and led["trained_over_age"] == 0
    assert max(lag for _, _, lags in loop.trained for lag in lags) <= max_age


@pytest.mark.parametrize("seed", range(3))
def test_pace_with_random_failures_and_give_ups_never_hangs_and_keeps_the_bound(seed):
    # 20% of attempts fail and a prompt is given up after one retry: NeMo closes that step one group short
    # through the target step admit returns (its _credit_shortfall).
    rollout = Rollout(seed=seed, fail_rate=0.2)
    loop = loop_for("pace", max_age=0, per_step=6, rollout=rollout)
    loop.retries = 1
    asyncio.run(asyncio.wait_for(loop.run(12), LIVENESS_S))
    led = balanced(loop)
    assert sum(n for _, n, _ in loop.trained) == 12 * 6 - sum(loop.shortfall[v] for v in range(12))
    assert led["dropped_stale"] == 0 and led["trained_over_age"] == 0
    assert max(lag for _, _, lags in loop.trained for lag in lags) == 0


@pytest.mark.parametrize("strategy", ["pace", "drop"])
def test_a_fresh_run_never_reads_an_earlier_runs_state_path(strategy, tmp_path, caplog):
    # Issue 59, item 2: NeMo calls set_dispatch_index(0) on a fresh run; the sampler read the old run's state, and
    # pace hung at version 0 with its ledger while drop crashed at the first evict.
    state = str(tmp_path / "sampler.pfb")
    old = loop_for(strategy, max_age=1, state_path=state)
    asyncio.run(asyncio.wait_for(old.run(6), LIVENESS_S))
    buffer = FakeTQReplayBuffer()
    sampler = create_sampler(buffer, TARGET, strategy=strategy, max_age=1, state_path=state)
    sampler.set_dispatch_index(0)
    sampler.required_buffer_capacity(4)
    assert sampler.ledger()["dispatched"] == 0 and "does not read" in caplog.text
    fresh = NemoLoop(sampler, buffer, 4, Rollout(seed=7), max_buffered=sampler.required_buffer_capacity(4) or 12)
    asyncio.run(asyncio.wait_for(fresh.run(4), LIVENESS_S))
    assert sum(n for _, n, _ in fresh.trained) == 16 and balanced(fresh)["lost_in_resume"] == 0


@pytest.mark.parametrize("strategy", ["pace", "drop"])
def test_a_resume_under_a_tighter_bound_trains_nothing_past_it(strategy, tmp_path):
    # Issue 59, item 3: saved under max_age 2, resumed under 1: restored groups older than the new bound were
    # trained (lag 2, trained_over_age 3). They are dropped at the resume and counted.
    state = str(tmp_path / "sampler.pfb")
    rollout = Rollout(seed=9, median_s=0.02)  # slow generation: groups wait, and age, in the buffer
    loop = loop_for(strategy, max_age=2, state_path=state, rollout=rollout)
    asyncio.run(asyncio.wait_for(loop.run(6), LIVENESS_S))
    loop.sampler.save_state(state)
    saved = asyncio.run(loop.buffer.state_dict())
    buffer = FakeTQReplayBuffer()
    sampler = create_sampler(buffer, TARGET, strategy=strategy, max_age=1, state_path=state)
    resume_at = loop.trainer_version + 1  # one step later than saved: the ready groups aged by one
    sampler.set_dispatch_index(resume_at)
    sampler.required_buffer_capacity(4)
    asyncio.run(buffer.load_state_dict(saved))
    capacity = sampler.required_buffer_capacity(4) or 12
    resumed = NemoLoop(
        sampler, buffer, 4, Rollout(seed=5), max_buffered=capacity + len(buffer), start_version=resume_at
    )
    resumed.capacity = asyncio.Semaphore(capacity)
    asyncio.run(asyncio.wait_for(resumed.run(4), LIVENESS_S))
    led = sampler.ledger()
    assert led["dropped_at_resume"] >= 1 and led["trained_over_age"] == 0
    assert max(lag for _, _, lags in resumed.trained for lag in lags) <= 1
