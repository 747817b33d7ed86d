"""Miles's fully-async data buffer and paced producer on our buffer, without Miles (CI cannot install it).

The Miles types come from ``_miles_contract`` (our stand-ins, checked against Miles's real classes by
``tests/miles_upstream/run_miles_suite.py``). The producer is ours too: ``run_producer``, the loop
``StalenessRolloutFn`` runs inside Miles, driven here by a group-level scheduler like Miles's. Both buffer
implementations (native and reference) run every guarantee test.
"""

from __future__ import annotations

import asyncio
import random
from argparse import Namespace
from typing import Any, Dict, List

import pytest
from _miles_contract import DataBufferConstructorInput, DataBufferInput, DynamicFilterOutput, Sample
from conftest import IMPLEMENTATIONS
from hypothesis import given, settings
from hypothesis import strategies as st

from pyfast_buffer.integrations.miles import StalenessDataBuffer
from pyfast_buffer.integrations.miles._buffer import group_budget
from pyfast_buffer.integrations.miles._producer import run_producer

N = 2  # samples per prompt
BOTH = pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))


def miles_args(**overrides: Any) -> Namespace:
    values: Dict[str, Any] = dict(
        rollout_batch_size=3,
        n_samples_per_prompt=N,
        max_weight_staleness=1,
        async_max_concurrent_samples=None,
        async_data_buffer_capacity_factor=4.0,
        async_unused_samples_handler="retry",
        dynamic_sampling_filter_path=None,
    )
    values.update(overrides)
    return Namespace(**values)


def group(index: int, version: Any = None, status: Sample.Status = Sample.Status.COMPLETED) -> List[Sample]:
    versions = [] if version is None else [str(version)]
    return [Sample(group_index=index, index=index * 10 + k, status=status, weight_versions=versions) for k in range(N)]


def make(impl: str = "native", strategy: str = "drop", clock: str = "version", **overrides: Any):
    unused: List[Any] = []
    buf = StalenessDataBuffer(
        DataBufferConstructorInput(args=miles_args(**overrides), unused_handler_fn=unused.append),
        strategy=strategy,
        clock=clock,
        buffer_class=IMPLEMENTATIONS[impl],
    )
    return buf, unused


async def put(buf: StalenessDataBuffer, g: List[Sample]) -> None:
    await buf.put(DataBufferInput(prompt_group=g, group=g))


# ---- drop, on Miles's own clock (weight versions) ---------------------------------------------------------------
@BOTH
@given(data=st.data())
def test_drop_never_hands_out_a_group_past_the_bound_and_accounts_for_every_group(impl, data):
    max_age = data.draw(st.integers(0, 3), label="max_age")
    plan = data.draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=30), label="plan")

    async def run() -> None:
        buf, unused = make(impl, max_weight_staleness=max_age, async_data_buffer_capacity_factor=100.0)
        got: List[int] = []
        for version, (lag, gets) in enumerate(plan):  # one group put `lag` versions old, up to `gets` gets, a push
            await put(buf, group(version, max(0, version - lag)))
            for _ in range(gets):
                if not len(buf._store) and not buf._stash:
                    break
                try:
                    entry = await asyncio.wait_for(buf.get(current_version=version), 0.05)
                except asyncio.TimeoutError:
                    break  # everything left was stale: the get dropped it and waits for a fresh group
                got.append(version - entry.group[0].oldest_weight_version)
        assert all(age <= max_age for age in got)
        ledger = buf._store.buffer.ledger()
        assert ledger["taken"] == len(got) and ledger["dropped_stale"] == len(unused)
        assert len(plan) == len(got) + len(unused) + len(buf._store) + len(buf._stash)

    asyncio.run(run())


@BOTH
def test_before_the_first_weight_update_nothing_is_filtered(impl):
    async def run() -> None:
        buf, unused = make(impl, max_weight_staleness=0)
        await put(buf, group(1, version=5))
        assert (await buf.get()).group[0].group_index == 1 and unused == []

    asyncio.run(run())


@BOTH
def test_a_take_without_the_bound_never_changes_the_buffers_max_age(impl):
    """Before the first weight update Miles's get takes without the bound. That is the one take's property: the
    ledger records no max_age change, and a take on another thread meanwhile keeps the bound (the store once set
    max_age to 'unbounded' and back around every such get, issue 55)."""

    async def run() -> None:
        buf, _ = make(impl, max_weight_staleness=0, async_data_buffer_capacity_factor=100.0)
        ring = buf._store.buffer
        for i in range(6):
            await put(buf, group(i, version=i))
            assert (await buf.get()).group[0].group_index == i
        assert ring.ledger()["max_age_changes"] == 0 and ring.max_age == 0

    asyncio.run(run())


@BOTH
def test_a_bounded_take_on_another_thread_keeps_the_bound_while_unbounded_takes_run(impl):
    """The store is shared by Miles's get and whatever else takes: a bounded take racing unbounded ones still
    hands out nothing past max_age (payloads here are their own stamps)."""
    import threading

    from pyfast_buffer.integrations._slime_family import GroupStore

    store = GroupStore(strategy="drop", max_age=0, capacity=1 << 14, buffer_class=IMPLEMENTATIONS[impl])
    step, stop, errors = [1], threading.Event(), []

    def unbounded() -> None:
        try:
            while not stop.is_set():
                try:
                    store.take_now(1, step[0], bounded=False)
                except ValueError as exc:  # read step[0] just before the main thread moved on: a step back
                    if "lower than step" not in str(exc):
                        raise
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=unbounded)
    worker.start()
    taken_stamps = []
    try:
        for s in range(1, 600):
            store.put(s - 1, s - 1)  # past max_age=0 at step s
            store.put(s, s)
            step[0] = s
            taken, _ = store.take_now(4, s)
            taken_stamps.extend((s, stamp) for stamp in taken)
    finally:
        stop.set()
        worker.join()
    assert errors == []
    assert store.buffer.ledger()["max_age_changes"] == 0 and store.buffer.max_age == 0
    assert taken_stamps, "the bounded takes got nothing: the race was not run"
    assert [(s, stamp) for s, stamp in taken_stamps if stamp < s] == []  # nothing past max_age=0


@BOTH
def test_put_blocks_at_the_capacity_until_a_get(impl):
    async def run() -> None:
        buf, _ = make(impl, rollout_batch_size=1, async_data_buffer_capacity_factor=2.0)
        await put(buf, group(1, 0))
        await put(buf, group(2, 0))
        blocked = asyncio.ensure_future(put(buf, group(3, 0)))
        await asyncio.sleep(0.01)
        assert not blocked.done() and buf.get_metrics()["rollout/fully_async/queue_size"] == 2
        assert (await buf.get(current_version=0)).group[0].group_index == 1
        await asyncio.wait_for(blocked, 1)
        assert [(await buf.get(current_version=0)).group[0].group_index for _ in range(2)] == [2, 3]

    asyncio.run(run())


def reject_odd(args: Any, g: Any) -> DynamicFilterOutput:
    keep = g[0].group_index % 2 == 0
    return DynamicFilterOutput(keep=keep, reason=None if keep else "odd")


@BOTH
def test_aborted_groups_are_recycled_and_filtered_groups_dropped_each_counted(impl):
    async def run() -> None:
        buf, unused = make(impl, dynamic_sampling_filter_path=f"{__name__}.reject_odd")
        aborted = group(2, 0, Sample.Status.ABORTED)
        await put(buf, aborted)
        await put(buf, group(3, 0))  # the filter rejects it
        await put(buf, group(4, 0))
        assert (await buf.get(current_version=0)).group[0].group_index == 4
        assert unused == [aborted]  # the unused handler gets aborted groups; filtered ones have no signal to retry
        metrics = buf.get_metrics()
        assert metrics["rollout/fully_async/aborted_groups_filtered"] == 1
        assert metrics["rollout/dynamic_filter/drop_odd"] == 1
        ours = {k.rsplit("/", 1)[-1]: v for k, v in metrics.items() if "/miles/" in k}
        assert ours["aborted_groups"] == 1 and ours["dynamic_filter_groups"] == 1 and ours["recycled_groups"] == 1

    asyncio.run(run())


# ---- the rollout clock: run_producer, as StalenessRolloutFn runs it ---------------------------------------------
class Source:
    """A data source: fresh prompt groups, recycled ones first; counts what it handed out."""

    def __init__(self) -> None:
        self.next, self.handed_out, self.recycled = 0, 0, []

    def get_samples(self, n: int) -> List[List[Sample]]:
        self.handed_out += n
        out = []
        for _ in range(n):
            if self.recycled:
                out.append(self.recycled.pop(0))
            else:
                self.next += 1
                out.append(group(self.next))
        return out


async def next_group(buf: StalenessDataBuffer, version: int, producer: asyncio.Task[Any]) -> Any:
    """One get, failing at once if the producer died (as Miles's drain watches its worker)."""
    get = asyncio.ensure_future(buf.get(current_version=version))
    done, _ = await asyncio.wait({get, producer}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if producer in done:
        get.cancel()
        producer.result()
        raise AssertionError("the producer returned")
    if get not in done:
        get.cancel()
        raise AssertionError("no group for 10 s: the loop is stuck")
    return get.result()


class SampleBackfill:
    """Miles's default submission for the fully-async rollout (``--rollout-submission-granularity sample``), as its
    scheduler counts: every finished sample frees its slot, and one more group may start once a group's worth of
    samples is free, so far more groups than the budget can be in flight, each with few samples left."""

    def __init__(self, budget_groups: int) -> None:
        self.room, self.in_flight = budget_groups * N, 0
        self.done = asyncio.Event()

    def has_capacity(self, pending: int) -> bool:
        if self.in_flight + N <= self.room:
            return True
        self.done.clear()
        return False

    def submitted(self) -> None:
        self.in_flight += N

    def sample_done(self) -> None:
        self.in_flight -= 1
        self.done.set()

    async def wait_for_progress(self, active: Any) -> Any:
        waiter = asyncio.ensure_future(self.done.wait())
        try:
            done, pending = await asyncio.wait(set(active) | {waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return done - {waiter}, pending - {waiter}


async def rollout_loop(
    impl: str,
    strategy: str,
    max_age: int,
    seed: int,
    steps: int = 8,
    granularity: str = "group",
    group_tail: float = 0.0,
    **extra: Any,
) -> Dict[str, Any]:
    rng = random.Random(seed)
    source = Source()
    holder: Dict[str, Any] = {}
    # Miles's budget rule (in_flight_budget), here twice a step's groups in flight.
    args = {"max_weight_staleness": max_age, "async_max_concurrent_samples": 2 * miles_args().rollout_batch_size * N}
    args.update(rollout_submission_granularity=granularity, **extra)
    buf, unused = make(impl, strategy, "rollout", **args)
    budget = group_budget(miles_args(**args))
    backfill = SampleBackfill(budget) if granularity == "sample" else None
    buf._unused_handler_fn = lambda g: (unused.append(g), source.recycled.append(g))  # retry, as Miles wires it
    version = {"now": 0}
    stamps: Dict[int, int] = {}

    async def generate(g: List[Sample]) -> DataBufferInput:
        started = version["now"]
        if backfill is None:
            await asyncio.sleep(rng.choice([0.0, 0.001, 0.002, 0.004, 0.012]))
        else:  # one sample far slower than the others (a long tail), each finished sample reported at once
            for k in range(N):
                await asyncio.sleep(rng.choice([0.0, 0.001]) if k < N - 1 else rng.choice([0.0, 0.004, 0.03]))
                backfill.sample_done()
            # Miles's --group-rm awaits the group's reward after every sample reported done: the scheduler has
            # freed the group's slots while it is still in flight for us.
            await asyncio.sleep(group_tail)
        for s in g:
            s.weight_versions = [str(started)]
        return DataBufferInput(prompt_group=g, group=g)

    def submit() -> asyncio.Task[Any]:
        [g] = source.get_samples(1)
        if backfill is not None:
            backfill.submitted()
        buf.dispatch(g)
        stamps[g[0].group_index] = buf._step  # the rollout clock's stamp
        return asyncio.ensure_future(generate(g))

    resumed = asyncio.Event()
    resumed.set()
    holder["producer"] = asyncio.ensure_future(
        run_producer(
            buf,
            resumed=resumed,
            has_capacity=backfill.has_capacity if backfill is not None else lambda pending: pending < budget,
            wait_for_progress=(
                backfill.wait_for_progress
                if backfill is not None
                else lambda active: asyncio.wait(active, return_when=asyncio.FIRST_COMPLETED)
            ),
            submit=submit,
        )
    )
    ages: List[int] = []  # weight staleness, as Miles measures it
    rollout_ages: List[int] = []  # our clock's age: rollout id of the take minus that of the dispatch
    try:
        for step in range(steps):
            buf.begin_step(step)
            for _ in range(buf._per_step):
                entry = await next_group(buf, version["now"], holder["producer"])
                ages.append(version["now"] - entry.group[0].oldest_weight_version)
                rollout_ages.append(step - stamps[entry.group[0].group_index])
            await asyncio.sleep(rng.choice([0.0, 0.003]))  # the train step; generation goes on
            version["now"] += 1
    finally:
        holder["producer"].cancel()
    store = buf._store
    outstanding = len(store) + store.in_flight + len(buf._stash)
    # Weights move at most once per rollout, so Miles's staleness never exceeds our clock's age.
    assert all(a <= r for a, r in zip(ages, rollout_ages))
    return {
        "ages": ages,
        "rollout_ages": rollout_ages,
        "unused": unused,
        "ledger": store.buffer.ledger(),
        "source": source,
        "left": outstanding,
    }


@BOTH
@settings(max_examples=12)  # each example runs a whole loop of real asyncio generations
@given(max_age=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_pace_trains_nothing_past_the_bound_drops_nothing_and_loses_no_prompt(impl, max_age, seed):
    out = asyncio.run(rollout_loop(impl, "pace", max_age, seed))
    assert max(out["rollout_ages"]) <= max_age
    assert out["unused"] == [] and out["ledger"]["dropped_stale"] == 0
    # A refused prompt never left the source: everything handed out is trained, ready or in flight.
    assert out["source"].handed_out == len(out["ages"]) + out["left"]


@BOTH
@settings(max_examples=12)  # each example runs a whole loop of real asyncio generations
@given(seed=st.integers(0, 2**16))
def test_drop_under_the_rollout_clock_trains_nothing_past_the_bound(impl, seed):
    out = asyncio.run(rollout_loop(impl, "drop", 1, seed))
    assert max(out["rollout_ages"]) <= 1
    assert out["ledger"]["dropped_stale"] == len(out["unused"])
    assert out["source"].handed_out == len(out["ages"]) + len(out["unused"]) + out["left"]


@BOTH
@pytest.mark.parametrize("strategy", ["wait", "drop", "pace"])
@settings(max_examples=8)  # each example runs a whole loop of real asyncio generations
@given(max_age=st.integers(0, 2), seed=st.integers(0, 2**16), group_tail=st.sampled_from([0.0, 0.01]))
def test_mileses_default_sample_backfill_never_overflows_the_ring(impl, strategy, max_age, seed, group_tail):
    """Miles's fully-async default submits by sample (``--rollout-submission-granularity sample``): a group may
    start whenever a group's worth of samples finished, so many more groups than the group budget can be in flight.
    The ring must hold them all: it once held capacity + the budget, and a finished group's put raised
    BufferFullError, killing the producer (issue 58). With ``--group-rm`` a group stays in flight after its
    samples freed the scheduler's slots, and the same error came back (the hostile review)."""
    out = asyncio.run(rollout_loop(impl, strategy, max_age, seed, granularity="sample", group_tail=group_tail))
    if strategy != "wait":
        assert max(out["rollout_ages"]) <= max_age
    assert out["source"].handed_out == len(out["ages"]) + len(out["unused"]) + out["left"]


@BOTH
@settings(max_examples=12)  # each example runs a whole loop of real asyncio generations
@given(seed=st.integers(0, 2**16))
def test_wait_drops_nothing_and_counts_every_use_trained_old(impl, seed):
    out = asyncio.run(rollout_loop(impl, "wait", 1, seed))
    assert out["unused"] == []
    assert out["ledger"]["trained_over_age"] == sum(1 for a in out["rollout_ages"] if a > 1)


# ---- save and load ----------------------------------------------------------------------------------------------
@BOTH
def test_a_saved_buffer_resumes_with_its_ready_groups_and_gives_back_those_in_flight(impl, tmp_path):
    async def run() -> None:
        buf, _ = make(impl, "pace", "rollout")
        buf.begin_step(0)
        flying, ready = group(1), group(2)
        buf.dispatch(flying)
        buf.dispatch(ready)
        await put(buf, ready)
        buf.save(str(tmp_path / "state.pkl"))

        again, _ = make(impl, "pace", "rollout")
        lost = again.load(str(tmp_path / "state.pkl"))
        assert [g[0].group_index for g in lost] == [1]
        assert [e.group[0].group_index for e in again._store.ready_payloads()] == [2]
        ledger = again._store.buffer.ledger()
        assert ledger["dispatched"] == 2 and ledger["completed"] == 1 and ledger["failed"] == 1

    asyncio.run(run())


def test_loading_a_state_saved_under_another_strategy_is_refused(tmp_path):
    buf, _ = make("native", "pace", "rollout")
    buf.save(str(tmp_path / "s.pkl"))
    other, _ = make("native", "wait", "rollout")
    with pytest.raises(ValueError, match="saved under 'pace', not 'wait'"):
        other.load(str(tmp_path / "s.pkl"))


# ---- bad input --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, strategy, clock, message",
    [
        ({"async_data_buffer_capacity_factor": 0.0}, "drop", "version", "--async-data-buffer-capacity-factor"),
        ({"async_data_buffer_capacity_factor": 0.1}, "drop", "version", "raise --async-data-buffer-capacity-factor"),
        ({"max_weight_staleness": -1}, "drop", "version", "--max-weight-staleness=-1 must be an int >= 0"),
        ({"max_weight_staleness": None}, "pace", "rollout", "needs --max-weight-staleness"),
        ({}, "pace", "version", "--rollout-function-path pyfast_buffer.integrations.miles.StalenessRolloutFn"),
        ({}, "bogus", "version", "use one of drop, wait, pace"),
    ],
)
def test_bad_arguments_name_the_flag_and_the_fix(overrides, strategy, clock, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("-1", r"-1")):
        make("native", strategy, clock, **overrides)


@pytest.mark.parametrize("strategy", ["wait", "pace"])
def test_a_capacity_below_one_batch_is_refused_under_the_strategies_that_take_a_batch_at_once(strategy):
    """--async-data-buffer-capacity-factor 0.5 holds half a batch: the producer stops submitting at the capacity,
    and wait and pace take the whole batch at once, so the first take waited forever (issue 58). Refused at
    construction, naming the flag; drop (one group per get, as Miles's own buffer) still runs it."""
    with pytest.raises(ValueError, match=r"--async-data-buffer-capacity-factor=0\.5 holds 1 groups"):
        make("native", strategy, "rollout", async_data_buffer_capacity_factor=0.5)
    make("native", "drop", "rollout", async_data_buffer_capacity_factor=0.5)
