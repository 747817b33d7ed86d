"""Our checks inside Miles (copied by run_miles_suite.py as test_pyfast_in_miles.py; needs Miles importable).

1. ``tests/_miles_contract.py`` (what CI tests against) still matches Miles's real classes.
2. Miles's own ``load_function`` loads both of our classes by the paths docs/miles.md gives.
3. ``StalenessRolloutFn`` in Miles's real rollout machinery (``miles_loop``: the real scheduler and drain, a generate
   function of uneven latency), 3 seeds each: pace trains nothing past the bound and drops nothing; drop trains
   nothing past the bound; wait drops nothing; every prompt group handed out is accounted for; our ledger balances.
4. A save after a rollout and a resume in a fresh rollout function: the ready groups carry over, those in flight
   are regenerated first, and our ledger continues.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect

import _miles_contract as ours
import miles.rollout.fully_async_data_buffer as data_buffer
import miles_loop
import pytest
from miles.rollout.filter_hub.base_types import DynamicFilterOutput
from miles.utils.misc import load_function
from miles.utils.types import Sample

from pyfast_buffer.integrations.miles import StalenessDataBuffer, StalenessRolloutFn, state_path


# ---- 1. our contract copies --------------------------------------------------------------------------------------
def fields(cls):
    return [f.name for f in dataclasses.fields(cls)]


def test_our_input_types_have_miless_fields():
    assert fields(ours.DataBufferInput) == fields(data_buffer.DataBufferInput)
    assert fields(ours.DataBufferConstructorInput) == fields(data_buffer.DataBufferConstructorInput)
    assert fields(ours.DynamicFilterOutput) == fields(DynamicFilterOutput)


def test_our_sample_is_a_subset_of_miless_with_the_same_statuses():
    real = set(fields(Sample))
    assert set(fields(ours.Sample)) <= real
    assert {s.name: s.value for s in ours.Sample.Status} == {s.name: s.value for s in Sample.Status}
    assert isinstance(inspect.getattr_static(Sample, "oldest_weight_version"), property)
    assert callable(Sample.reset_for_retry)


def test_our_data_buffer_contract_is_miless():
    assert data_buffer.DataBuffer.__abstractmethods__ == ours.DataBuffer.__abstractmethods__
    for name in ours.DataBuffer.__abstractmethods__:
        theirs, mine = getattr(data_buffer.DataBuffer, name), getattr(StalenessDataBuffer, name)
        assert inspect.iscoroutinefunction(theirs) == inspect.iscoroutinefunction(mine), name
        kinds = [p.kind for p in inspect.signature(theirs).parameters.values()]
        accepted = {p.kind for p in inspect.signature(mine).parameters.values()}
        assert set(kinds) <= accepted, name  # what Miles may pass (a positional input, or **context), we take
    # Miles's drain passes the trainer's weight version by name.
    assert "current_version" in inspect.signature(StalenessDataBuffer.get).parameters


# ---- 2. loaded by Miles -----------------------------------------------------------------------------------------
def test_miles_loads_both_classes_by_their_documented_paths():
    assert load_function("pyfast_buffer.integrations.miles.StalenessDataBuffer") is StalenessDataBuffer
    assert load_function("pyfast_buffer.integrations.miles.StalenessRolloutFn") is StalenessRolloutFn


# ---- 3. the rollout function in Miles's loop --------------------------------------------------------------------
def accounted(report):
    """Every prompt group the source handed out is trained, filtered, recycled-and-waiting, ready or in flight."""
    fn, source = report.rollout_fn, report.source
    ledger = fn._output._store.buffer.ledger()
    outstanding = len(fn._output._store) + fn._output._store.in_flight + len(fn._output._stash)
    assert source.handed_out == report.trained + report.stale_filtered + outstanding
    return ledger


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("max_age", [0, 1, 2])
async def test_pace_trains_nothing_past_the_bound_and_drops_nothing(seed, max_age):
    args = miles_loop.miles_args(max_weight_staleness=max_age, pyfast_buffer_strategy="pace")
    report = await miles_loop.train_loop(StalenessRolloutFn, args, 10, seed)
    assert report.trained_per_step == [args.rollout_batch_size] * 10
    assert max(report.ages) <= max_age
    assert report.stale_filtered == 0 and report.recycled == 0
    ledger = accounted(report)
    assert ledger["dropped_stale"] == 0 and ledger["taken"] == report.trained


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_drop_trains_nothing_past_the_bound_and_recycles_what_it_filters(seed):
    args = miles_loop.miles_args(max_weight_staleness=1, pyfast_buffer_strategy="drop")
    report = await miles_loop.train_loop(StalenessRolloutFn, args, 10, seed)
    assert max(report.ages) <= 1
    assert report.stale_filtered > 0  # the latency model makes groups stale: the filter is exercised
    assert report.recycled == report.stale_filtered  # --async-unused-samples-handler retry
    ledger = accounted(report)
    assert ledger["dropped_stale"] == report.stale_filtered


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_wait_drops_nothing_and_counts_what_it_trained_old(seed):
    args = miles_loop.miles_args(max_weight_staleness=1, pyfast_buffer_strategy="wait")
    report = await miles_loop.train_loop(StalenessRolloutFn, args, 10, seed)
    assert report.stale_filtered == 0
    ledger = accounted(report)
    # wait bounds what is in flight, not the ready backlog (docs/design.md): what it trains old it counts.
    assert ledger["trained_over_age"] == sum(1 for age in report.ages if age > 1)


def test_our_buffer_reports_miless_metric_names_and_ours():
    args = miles_loop.miles_args(pyfast_buffer_strategy="pace")
    report = asyncio.run(miles_loop.train_loop(StalenessRolloutFn, args, 3, 0))
    metrics = report.metrics[-1]
    assert {"rollout/fully_async/queue_size", "rollout/fully_async/stale_groups_filtered"} <= set(metrics)
    assert any(key.endswith("/miles/in_flight_groups") for key in metrics)


# ---- 4. save and resume -----------------------------------------------------------------------------------------
async def test_a_resume_carries_ready_groups_over_and_regenerates_those_in_flight(tmp_path):
    args = miles_loop.miles_args(pyfast_buffer_strategy="pace", save=str(tmp_path), save_interval=1, num_rollout=8)
    first = await miles_loop.train_loop(StalenessRolloutFn, args, 3, 0)
    saved = StalenessDataBuffer(
        data_buffer.DataBufferConstructorInput(args=args, unused_handler_fn=lambda group: None),
        strategy="pace",
        clock="rollout",
    )
    lost = saved.load(state_path(str(tmp_path), 2))
    ready = [entry.prompt_group[0].group_index for entry in saved._store.ready_payloads()]
    in_flight = [group[0].group_index for group in lost]
    assert ready or in_flight  # generation ran ahead of training: something was outstanding at the save
    trained_before = first.rollout_fn._output._store.buffer.ledger()["taken"]

    resumed_args = miles_loop.miles_args(pyfast_buffer_strategy="pace", load=str(tmp_path), num_rollout=8)
    source = miles_loop.PromptSource()
    source.next_index = first.source.next_index  # the data source's own checkpoint restores its position
    second = await miles_loop.train_loop(StalenessRolloutFn, resumed_args, 2, 0, start=3, source=source)
    trained = [i for step in second.trained_ids for i in step]
    assert set(ready) <= set(trained[: len(ready) + args.rollout_batch_size])  # pace hands the stalest out first
    assert set(in_flight) <= set(trained)  # regenerated, then trained
    ledger = second.rollout_fn._output._store.buffer.ledger()
    assert ledger["taken"] == trained_before + second.trained  # the ledger continues
    assert ledger["failed"] >= len(in_flight)  # what was in flight at the save is counted failed, then redone
    assert source.recycled_total == len(in_flight)
    assert max(second.ages) <= args.max_weight_staleness


# ---- 5. every checkpoint Miles writes, and launches that cannot work (issue 58) ----------------------------------
class EpochSource(miles_loop.PromptSource):
    """A data source with a dataset (the run is sized by --num-epoch) and Miles's ``save`` hook."""

    def __init__(self, prompts: int) -> None:
        super().__init__()
        self.dataset = [None] * prompts
        self.saved: list = []

    def save(self, rollout_id: int) -> None:
        self.saved.append(rollout_id)


async def test_every_checkpoint_train_async_writes_carries_our_state(tmp_path):
    """With --num-epoch (no --num-rollout) train_async.py also saves at each epoch boundary, and whenever its
    --save-trigger-sentinel file exists after a train step; each of those checkpoints carries our state as it was
    at the end of that rollout's call (it once saved on --save-interval alone and lost an epoch's worth)."""
    from miles.utils.misc import should_run_periodic_action

    sentinel = tmp_path / "save-now"
    args = miles_loop.miles_args(
        pyfast_buffer_strategy="pace",
        save=str(tmp_path),
        save_interval=100,
        num_epoch=2,
        save_trigger_sentinel=str(sentinel),
    )
    source = EpochSource(12)  # 12 prompts // rollout_batch_size 4: 3 rollouts per epoch, 6 in all
    report = await miles_loop.train_loop(StalenessRolloutFn, args, 4, 0, source=source)
    per_epoch = len(source.dataset) // args.rollout_batch_size
    expected = [k for k in range(4) if should_run_periodic_action(k, 100, per_epoch, per_epoch * 2)]
    assert expected == [2]  # the epoch boundary: Miles's own rule, as the driver calls it
    written = [k for k in range(4) if (tmp_path / "pyfast_buffer" / f"miles_buffer_{k}.pfb").exists()]
    assert written == expected
    # The sentinel appears while rollout 3 trains (after its call returned); Miles then saves rollout 3 through its
    # data source: our state is the one kept at the end of call 3.
    sentinel.write_text("")
    report.rollout_fn.data_source.save(3)
    assert source.saved == [3]
    resumed = StalenessDataBuffer(
        data_buffer.DataBufferConstructorInput(args=args, unused_handler_fn=lambda group: None),
        strategy="pace",
        clock="rollout",
    )
    resumed.load(state_path(str(tmp_path), 3))
    assert resumed._store.buffer.ledger()["taken"] == 4 * args.rollout_batch_size


@pytest.mark.parametrize(
    "overrides, flag",
    [
        ({"async_data_buffer_capacity_factor": 0.5}, "--async-data-buffer-capacity-factor"),
        ({"max_weight_staleness": None}, "--max-weight-staleness"),
    ],
)
@pytest.mark.parametrize("strategy", ["pace", "wait"])
def test_a_launch_that_cannot_work_is_refused_at_construction(overrides, flag, strategy):
    """Pace and wait take a whole batch at once: a capacity below one batch would hang at the first take (Miles's
    own buffer hands groups out one by one and runs it); both need the bound. Refused when Miles builds the rollout
    function, before any engine call, naming the flag."""
    args = miles_loop.miles_args(pyfast_buffer_strategy=strategy, **overrides)
    with pytest.raises(ValueError, match=flag):
        StalenessRolloutFn(miles_loop.RolloutFnConstructorInput(args=args, data_source=miles_loop.PromptSource()))


@pytest.mark.parametrize("strategy", ["wait", "drop", "pace"])
@pytest.mark.parametrize("max_age", [0, 1, 2])
async def test_mileses_default_sample_granularity_never_overflows_the_ring(strategy, max_age):
    """The fully-async default submits by sample: more groups than the group budget are in flight at once; the ring
    holds them (it once raised BufferFullError in the producer under wait at every run)."""
    args = miles_loop.miles_args(
        pyfast_buffer_strategy=strategy, max_weight_staleness=max_age, rollout_submission_granularity="sample"
    )
    report = await miles_loop.train_loop(StalenessRolloutFn, args, 8, max_age, staggered=True)
    assert report.trained == 8 * args.rollout_batch_size
    if strategy != "wait":
        assert max(report.ages) <= max_age
