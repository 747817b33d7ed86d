"""Our checks inside a slime checkout (run by ``run_slime_suite.py``, which puts the checkout and ``tests/`` on
``sys.path``): (a) ``tests/_slime_contract.py`` matches slime's real classes, (b) slime's ``load_function`` loads
our three paths, (c) our rollout function runs over slime's real data source classes with a fake generate
function of varying latency, for each strategy. Not collected by the project's pytest run."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import random
from types import SimpleNamespace
from typing import Any, Dict, List

import _slime_contract as contract
import pytest
from slime.rollout import data_source as slime_ds
from slime.rollout.base_types import RolloutFnTrainOutput
from slime.utils.misc import load_function
from slime.utils.types import Sample

from pyfast_buffer.integrations.slime import stop_worker
from pyfast_buffer.integrations.slime._rollout import collect_rollout

PATHS = {
    "--data-source-path": "pyfast_buffer.integrations.slime.StalenessDataSource",
    "--rollout-function-path": "pyfast_buffer.integrations.slime.generate_rollout_fully_async",
    "--buffer-filter-path": "pyfast_buffer.integrations.slime.buffer_filter",
}
#: Our wrapper of slime's own (non-fully-async) rollout function, telling the buffer filter the engine's version.
SYNC_ROLLOUT_PATH = "pyfast_buffer.integrations.slime.generate_rollout"


# ---- (a) our copies are slime's interfaces -------------------------------------------------------------------
def test_the_data_source_abc_has_slimes_methods_and_parameters():
    assert contract.DataSource.__abstractmethods__ == slime_ds.DataSource.__abstractmethods__
    for name in slime_ds.DataSource.__abstractmethods__:
        ours = inspect.signature(getattr(contract.DataSource, name)).parameters
        theirs = inspect.signature(getattr(slime_ds.DataSource, name)).parameters
        assert [(p.name, p.default) for p in ours.values()] == [(p.name, p.default) for p in theirs.values()], name


def test_our_sample_fields_are_slimes_with_slimes_defaults():
    theirs = {f.name: f for f in dataclasses.fields(Sample)}
    for field in dataclasses.fields(contract.Sample):
        assert field.name in theirs, field.name
        if field.name == "status":
            continue
        mine = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        other = theirs[field.name]
        real = other.default_factory() if other.default_factory is not dataclasses.MISSING else other.default
        assert mine == real, field.name
    assert {s.name: s.value for s in contract.Sample.Status} == {s.name: s.value for s in Sample.Status}
    assert Sample().status.value == contract.Sample().status.value == "pending"


def test_the_prompt_source_and_the_output_match_slimes():
    assert list(inspect.signature(contract.RolloutDataSourceWithBuffer.__init__).parameters) == ["self", "args"]
    assert list(inspect.signature(slime_ds.RolloutDataSourceWithBuffer.__init__).parameters) == ["self", "args"]
    assert list(inspect.signature(contract.pop_first).parameters) == list(
        inspect.signature(slime_ds.pop_first).parameters
    )
    real = slime_ds.RolloutDataSourceWithBuffer(make_args("drop"))
    assert real.buffer == [] and real.buffer_filter is slime_ds.pop_first
    groups = real.get_samples(2)
    assert [[s.index for s in g] for g in groups] == [[0, 1], [2, 3]]  # as our copy numbers them
    assert [[s.index for s in g] for g in contract.RolloutDataSourceWithBuffer(make_args("drop")).get_samples(2)] == [
        [0, 1],
        [2, 3],
    ]
    fields = lambda cls: [(f.name, f.default) for f in dataclasses.fields(cls)]  # noqa: E731
    assert fields(contract.RolloutFnTrainOutput) == fields(RolloutFnTrainOutput)


# ---- (b) slime loads ours --------------------------------------------------------------------------------------
def test_slimes_load_function_loads_our_paths():
    cls = load_function(PATHS["--data-source-path"])
    assert issubclass(cls, slime_ds.DataSource) and not inspect.isabstract(cls)
    source = cls(make_args("pace"))
    assert isinstance(source.prompts, slime_ds.RolloutDataSourceWithBuffer)
    fn = load_function(PATHS["--rollout-function-path"])
    from plugin_contracts.test_plugin_rollout_contracts import assert_rollout_function_signature_matches_default

    assert_rollout_function_signature_matches_default(fn)
    assert_rollout_function_signature_matches_default(load_function(SYNC_ROLLOUT_PATH))
    filt = load_function(PATHS["--buffer-filter-path"])
    assert list(inspect.signature(filt).parameters) == ["args", "rollout_id", "buffer", "num_samples"]


def test_our_buffer_filter_runs_inside_slimes_data_source():
    args = make_args("drop", buffer_filter_path=PATHS["--buffer-filter-path"])
    source = slime_ds.RolloutDataSourceWithBuffer(args)
    old = [Sample(index=0, weight_versions=["1"]), Sample(index=1, weight_versions=["1"])]
    new = [Sample(index=2, weight_versions=["4"]), Sample(index=3, weight_versions=["5"])]
    source.add_samples([new, old])
    assert source.get_samples(1) == [new]  # max_age 1: ``old`` (versions 1, newest 5) is discarded
    assert source.buffer == []


@pytest.mark.parametrize("max_age", [0, 1, 2])
def test_our_rollout_wrapper_keeps_the_buffer_filter_within_the_bound_in_slimes_data_source(max_age, monkeypatch):
    # slime's generate_rollout with --partial-rollout, faked at the engine: each rollout draws 4 groups through
    # slime's RolloutDataSourceWithBuffer (its buffer first, through our filter), generates a turn of each at the
    # engine's version (one update between rollouts), trains about half and puts the rest back partial.
    import slime.rollout.sglang_rollout as sglang_rollout

    from pyfast_buffer.integrations.slime import buffer_filter

    rng = random.Random(max_age)
    staleness: List[int] = []

    def slimes_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
        trained, partial = [], []
        for group in data_source.get_samples(4):
            for sample in group:
                sample.weight_versions.append(str(rollout_id))
            (trained if rng.random() < 0.5 else partial).append(group)
        data_source.add_samples(partial)
        staleness.extend(rollout_id - min(int(v) for s in g for v in s.weight_versions) for g in trained)
        return RolloutFnTrainOutput(samples=trained)

    monkeypatch.setattr(sglang_rollout, "generate_rollout", slimes_rollout)
    buffer_filter.__init__()  # the module's one filter: fresh for this run
    args = make_args("drop", pyfast_buffer_max_age=max_age, buffer_filter_path=PATHS["--buffer-filter-path"])
    source = slime_ds.RolloutDataSourceWithBuffer(args)
    rollout = load_function(SYNC_ROLLOUT_PATH)
    for rollout_id in range(60):
        rollout(args, rollout_id, source)
    assert max(staleness) == max_age, staleness  # up to the bound, never past it


# ---- (c) our rollout function over slime's real classes ----------------------------------------------------------
def make_args(strategy: str, **extra: Any) -> SimpleNamespace:
    args = SimpleNamespace(
        pyfast_buffer_strategy=strategy,
        pyfast_buffer_max_age=1,
        pyfast_buffer_take_timeout=120.0,
        rollout_batch_size=3,
        n_samples_per_prompt=2,
        rollout_global_dataset=True,
        prompt_data=None,  # slime's source then hands out fresh Sample() groups, numbered
        buffer_filter_path=None,
        rollout_shuffle=False,
        save=None,
        load=None,
    )
    for key, value in extra.items():
        setattr(args, key, value)
    return args


def fake_generate(seed: int, engine: Dict[str, int]):
    """slime's generate_and_rm_group faked: ``engine["version"]`` is the engine's weight version now, stamped on
    each sample per generation as slime's ``append_response_tokens`` does (an aborted sample keeps its tokens)."""
    rng = random.Random(seed)
    calls = [0]

    async def generate(args: Any, group: List[Sample]) -> List[Sample]:
        calls[0] += 1
        await asyncio.sleep(rng.random() * 0.005)
        aborted = calls[0] % 6 == 0
        for sample in group:
            sample.status = Sample.Status.ABORTED if aborted else Sample.Status.COMPLETED
            sample.weight_versions.append(str(engine["version"]))
            sample.response, sample.reward, sample.tokens, sample.response_length = "r", 1.0, [1, 2], 1
        return group

    return generate


@pytest.mark.parametrize("strategy", ["drop", "wait", "pace"])
def test_our_rollout_function_over_slimes_data_source(strategy, tmp_path):
    cls = load_function(PATHS["--data-source-path"])
    args = make_args(strategy, save=str(tmp_path))
    source = cls(args)
    engine = {"version": 0}  # the engine's weight version is the rollout id (one update per rollout)
    try:
        for rollout_id in range(6):
            engine["version"] = rollout_id
            out = collect_rollout(
                args, rollout_id, source, generate=fake_generate(0, engine), concurrency=4, output=RolloutFnTrainOutput
            )
            assert isinstance(out, RolloutFnTrainOutput) and len(out.samples) == 3
            assert all(s.status is Sample.Status.COMPLETED for g in out.samples for s in g)
            age = next(v for k, v in out.metrics.items() if k.endswith("trajectory_age/max"))
            assert strategy == "wait" or age <= 1
            # Aged as Miles measures it: the engine's version now minus the group's oldest weight_versions entry.
            staleness = max(rollout_id - min(int(v) for s in g for v in s.weight_versions) for g in out.samples)
            assert strategy == "wait" or staleness <= 1, staleness
            if rollout_id == 5:
                batch5 = [g[0].index for g in out.samples]
        source.save(4)  # train_async.py's order: generate(5) ran before save(4); slime's own state and ours
        assert (tmp_path / "rollout" / "global_dataset_state_dict_4.pt").is_file()
        assert (tmp_path / "rollout" / "pyfast_buffer_state_4.pkl").is_file()
    finally:
        stop_worker()
    led = source.store.buffer.ledger()
    assert led["dispatched"] == led["completed"] + led["failed"] + led["in_flight"]
    assert strategy != "pace" or (led["dropped_stale"] == 0 and led["trained_over_age"] == 0)
    restored = cls(make_args(strategy, load=str(tmp_path)))
    restored.load(4)
    assert restored.store.in_flight == 0 and restored.step == 5
    try:  # the resume's first rollout trains the batch taken before checkpoint 4 was written
        out = collect_rollout(
            args, 5, restored, generate=fake_generate(1, engine), concurrency=4, output=RolloutFnTrainOutput
        )
    finally:
        stop_worker()
    assert [g[0].index for g in out.samples] == batch5
