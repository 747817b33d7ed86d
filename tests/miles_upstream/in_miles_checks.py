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
