"""pyfast_buffer's TorchRL sampler in TorchRL's real replay buffers, storages, writers and collectors: the bound,
drop and wait, groups, max_uses, overwrites, writes from another process, state and pickling, the errors, and a
randomized model check on both core implementations."""

from __future__ import annotations

import pickle
import tempfile

import pytest

torchrl = pytest.importorskip("torchrl", reason="the torchrl extra is not installed: pip install '.[torchrl]'")

import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl.data.replay_buffers.writers import TensorDictMaxValueWriter  # noqa: E402

import pyfast_buffer as pfb  # noqa: E402
from pyfast_buffer.integrations.torchrl import StalenessSampler  # noqa: E402
from pyfast_buffer.integrations.torchrl import _sampler as sampler_module  # noqa: E402

STORAGES = {
    "LazyTensorStorage": lambda n, tmp: LazyTensorStorage(n),
    "LazyMemmapStorage": lambda n, tmp: LazyMemmapStorage(n, scratch_dir=str(tmp)),
    "LazyStackStorage": lambda n, tmp: LazyStackStorage(n),
    "ListStorage": lambda n, tmp: ListStorage(n),
}


def rows(n, version, start=0, group=None, length=None):
    data = {
        "obs": torch.arange(start, start + n, dtype=torch.float32)[:, None],
        "policy_version": torch.full((n,), version),
    }
    if group is not None:
        data["group"] = torch.as_tensor(group)
    if length is not None:
        data["length"] = torch.as_tensor(length)
    return TensorDict(data, [n])


def buffer(storage="LazyTensorStorage", size=64, tmp=None, batch_size=8, **kwargs):
    sampler = StalenessSampler(**kwargs)
    return TensorDictReplayBuffer(storage=STORAGES[storage](size, tmp), sampler=sampler, batch_size=batch_size), sampler


def balanced(sampler):
    led = sampler.ledger()
    assert led["sampled_total"] == led["retired"] + led["dropped_stale"] + led["evicted"] + led["buffer_left"], led
    return led


@pytest.mark.parametrize("storage", sorted(STORAGES))
def test_drop_samples_only_within_max_age_on_every_storage_and_counts_the_rest(storage, tmp_path):
    rb, sampler = buffer(storage, tmp=tmp_path, max_age=2)
    for v in range(5):
        rb.extend(rows(8, v, start=8 * v))
    sampler.consumer_version = 4
    seen = []
    while sampler._sampleable_count(rb.storage) > 0:
        batch = rb.sample()
        assert (4 - batch["policy_version"] <= 2).all() and torch.equal(
            batch["staleness"], 4.0 - batch["policy_version"]
        )
        seen += batch["obs"].reshape(-1).tolist()
    assert sorted(seen) == list(range(16, 40))  # versions 2, 3, 4, each row once (max_uses=1)
    led = balanced(sampler)
    assert led["dropped_stale"] == 16 and led["retired"] == 24 and led["buffer_left"] == 0
    with pytest.raises(RuntimeError, match="no entry can be sampled at consumer_version=4"):
        rb.sample()  # never blocks: says why at once


def test_wait_drops_nothing_and_counts_what_it_trained_past_the_bound():
    rb, sampler = buffer(max_age=1, strategy="wait", batch_size=4)
    rb.extend(rows(4, 0))
    rb.extend(rows(4, 3, start=4))
    sampler.consumer_version = 3
    first = rb.sample()
    assert first["policy_version"].tolist() == [0] * 4  # the stalest first, not dropped
    led = balanced(sampler)
    assert led["dropped_stale"] == 0 and led["trained_over_age"] == 4


def test_the_stalest_fresh_rows_go_first_and_max_uses_retires_them():
    rb, sampler = buffer(max_age=5, max_uses=2, batch_size=4, shuffle=False)
    rb.extend(rows(4, 1))
    rb.extend(rows(4, 2, start=4))
    sampler.consumer_version = 2
    taken = [rb.sample()["obs"].reshape(-1).tolist() for _ in range(4)]
    assert taken == [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]]
    assert balanced(sampler)["retired"] == 8


def test_a_group_is_sampled_whole_or_not_at_all():
    rb, _sampler = buffer(max_age=5, group_key="group", batch_size=5, shuffle=False)
    rb.extend(rows(6, 0, group=[7, 7, 7, 8, 8, 8]))
    batch = rb.sample()
    assert batch["group"].tolist() == [7, 7, 7]  # the next group would split the batch: it waits for the next one
    assert rb.sample()["group"].tolist() == [8, 8, 8]


def test_a_round_robin_overflow_evicts_the_unsampled_rows_it_overwrites():
    rb, sampler = buffer(size=8, max_age=10, batch_size=4)
    for v in range(3):
        rb.extend(rows(4, v, start=4 * v))  # the third write overwrites slots 0-3 (version 0), never sampled
    batch = rb.sample()
    assert set(batch["policy_version"].tolist()) == {1}  # what the slots hold now, the stalest first
    led = balanced(sampler)
    assert led["evicted"] == 4 and led["ghosts"] == 0


def test_a_write_out_of_round_robin_order_leaves_a_ghost_that_is_skipped_and_counted():
    sampler = StalenessSampler(max_age=10, shuffle=False)
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4), sampler=sampler, batch_size=4, writer=TensorDictMaxValueWriter(rank_key="obs")
    )
    first = rows(4, 0)
    first["obs"] = torch.tensor([[5.0], [0.0], [6.0], [7.0]])
    rb.extend(first)
    rb.extend(rows(1, 1, start=10))  # the max-value writer replaces the lowest, slot 1: not where the cursor is
    batch = rb.sample()
    assert sorted(batch["obs"].reshape(-1).tolist()) == [5, 6, 7, 10]  # every row the storage holds, once
    led = balanced(sampler)
    assert led["overwritten_in_place"] == 1 and led["overwritten_skipped"] == 1 and led["ghosts"] == 0


def test_lengths_feed_the_bias_monitor_and_ages_reach_the_metrics():
    rb, sampler = buffer(max_age=3, length_key="length", batch_size=4)
    rb.extend(rows(8, 0, length=[10, 20, 30, 40, 50, 60, 70, 80]))
    sampler.consumer_version = 2
    rb.sample()
    metrics = sampler.metrics()
    assert metrics["buffer/trajectory_age/max"] == 2 and "buffer/retired" in metrics
    assert any("bias" in k or "ks" in k for k in metrics), metrics


def test_a_2d_storage_gets_a_tuple_index_of_whole_rows():
    sampler = StalenessSampler(max_age=3, version_key=None, info_key=None)
    rb = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2), sampler=sampler, batch_size=8)
    rb.extend(TensorDict({"obs": torch.arange(12.0).reshape(4, 3)}, [4, 3]))
    index, info = sampler.sample(rb.storage, 8)
    assert isinstance(index, tuple) and len(index) == 2 and info == {}
    inner = rb.storage.shape[1]
    rows_taken = index[0].reshape(-1, inner)  # each dim-0 row comes whole, its cells in order
    assert (rows_taken == rows_taken[:, :1]).all() and (index[1].reshape(-1, inner) == torch.arange(inner)).all()
    assert len(index[0]) == (8 // inner) * inner


def test_state_dict_dumps_and_pickle_keep_the_ledger_and_what_is_left(tmp_path):
    rb, sampler = buffer(max_age=2, batch_size=4)
    rb.extend(rows(12, 0))
    sampler.consumer_version = 1
    rb.sample()
    before = (sampler.ledger(), sampler._sampleable_count(rb.storage))
    clone = pickle.loads(pickle.dumps(rb))
    assert (clone.sampler.ledger(), clone.sampler._sampleable_count(clone.storage)) == before
    rb.dumps(tmp_path / "rb")
    fresh, fresh_sampler = buffer(max_age=2, batch_size=4)
    fresh.loads(tmp_path / "rb")
    assert fresh_sampler.consumer_version == 1 and fresh_sampler.ledger() == sampler.ledger()
    assert len(fresh.sample()) == 4
    state = sampler.state_dict()
    torch.save(state, tmp_path / "state.pt")  # plain tensors, ints and strings: torch.load's weights_only accepts it
    restored = StalenessSampler(max_age=2)
    restored.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert restored.ledger() == sampler.ledger()


def test_can_sample_tells_the_truth_when_everything_is_stale():
    rb, sampler = buffer(max_age=1)
    rb.extend(rows(8, 0))
    assert rb.can_sample()
    sampler.consumer_version = 5
    assert not rb.can_sample() and balanced(sampler)["dropped_stale"] == 8


def test_bad_arguments_and_missing_versions_say_what_to_do():
    with pytest.raises(TypeError, match="takes max_age="):
        StalenessSampler(max_staleness=3)
    with pytest.raises(ValueError, match="pace needs an admission call"):
        StalenessSampler(strategy="pace")
    with pytest.raises(ValueError, match="max_age=-1 must be an int >= 0"):
        StalenessSampler(max_age=-1)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=StalenessSampler(), batch_size=2)
    rb.extend(TensorDict({"obs": torch.zeros(4, 1)}, [4]))
    with pytest.raises(KeyError, match="PolicyVersion transform"):
        rb.sample()
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=StalenessSampler(), batch_size=2).sample()


def test_a_seeded_buffer_samples_the_same_batches():
    def run():
        sampler = StalenessSampler(max_age=3)
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(64), sampler=sampler, batch_size=8, generator=torch.Generator().manual_seed(3)
        )
        rb.extend(rows(32, 0))
        return [rb.sample()["obs"].reshape(-1).tolist() for _ in range(3)]

    assert run() == run()


# torchrl 0.14.1 warns, at the import of its collectors, about its own deprecated weight updaters.
@pytest.mark.filterwarnings("ignore:Creating .* which inherits from WeightUpdaterBase:DeprecationWarning")
def test_torchrls_collector_with_track_policy_version_drives_it():
    from tensordict.nn import TensorDictModule
    from torch import nn
    from torchrl.collectors import Collector
    from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

    env = ContinuousActionVecMockEnv()
    policy = TensorDictModule(
        nn.Linear(env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]),
        in_keys=["observation"],
        out_keys=["action"],
    )
    sampler = StalenessSampler(max_age=1, version_key=("next", "policy_version"))
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(256), sampler=sampler, batch_size=16)
    collector = Collector(
        env,
        policy,
        frames_per_batch=32,
        total_frames=32 * 8,
        replay_buffer=rb,
        track_policy_version=True,
        auto_register_policy_transforms=False,
    )
    try:
        for _ in collector:
            sampler.consumer_version = collector.policy_version
            batch = rb.sample()
            assert (collector.policy_version - batch["next", "policy_version"] <= 1).all()
            collector.update_policy_weights_()
    finally:
        collector.shutdown()
    led = balanced(sampler)
    assert led["put_total"] == 32 * 8 and led["taken"] == 16 * 8 and led["dropped_stale"] > 0


def test_writes_by_another_process_into_a_shared_buffer_are_found_at_sample():
    import torch.multiprocessing as mp

    sampler = StalenessSampler(max_age=2, shuffle=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(32), sampler=sampler, batch_size=8, shared=True)
    rb.extend(rows(8, 0))
    from _torchrl_child import write_rows  # the child's copy of the sampler sees this write, ours does not

    child = mp.get_context("spawn").Process(target=write_rows, args=(rb, 1, 100))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    sampler.consumer_version = 1
    got = rb.sample()["obs"].reshape(-1).tolist() + rb.sample()["obs"].reshape(-1).tolist()
    assert sorted(got) == list(range(8)) + list(range(100, 108))
    assert sampler.ledger()["foreign_writes"] == 8


@pytest.mark.parametrize("core", [pfb.StalenessBuffer, pfb.ReferenceBuffer])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(st.tuples(st.sampled_from(["write", "sample", "bump"]), st.integers(1, 12)), max_size=40),
    max_age=st.integers(0, 3),
    max_uses=st.integers(1, 3),
)
def test_random_writes_and_samples_keep_the_bound_and_the_accounting(core, ops, max_age, max_uses, monkeypatch):
    # A model of the storage: slot -> (row id, version). Every sample returns rows the storage holds now, within
    # max_age, none more than max_uses times; the ledger balances and every write is an entry.
    monkeypatch.setattr(sampler_module, "StalenessBuffer", _core_factory(core))
    sampler = StalenessSampler(max_age=max_age, max_uses=max_uses)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(16), sampler=sampler, batch_size=4)
    version, next_row, written = 0, 0, 0
    uses: dict = {}
    for op, k in ops:
        if op == "write":
            rb.extend(rows(k, version, start=next_row))
            next_row, written = next_row + k, written + k
        elif op == "bump":
            version += 1
            sampler.consumer_version = version
        elif sampler._sampleable_count(rb.storage) > 0:
            batch = rb.sample()
            held = set(rb.storage.get(torch.arange(len(rb.storage)))["obs"].reshape(-1).tolist())
            for row, v in zip(batch["obs"].reshape(-1).tolist(), batch["policy_version"].tolist()):
                assert row in held and version - v <= max_age
                uses[row] = uses.get(row, 0) + 1
                assert uses[row] <= max_uses
    if written:
        led = balanced(sampler)
        assert led["put_total"] == written - led["overwritten_in_write"]


def _core_factory(core):
    if core is pfb.StalenessBuffer:
        return core

    def reference(capacity, **kwargs):
        kwargs.pop("pin_memory", None)
        return pfb.ReferenceBuffer(capacity, **kwargs)

    return reference


def test_the_library_never_imports_torchrl(tmp_path):
    import subprocess
    import sys

    code = "import sys, pyfast_buffer, pyfast_buffer.integrations; assert 'torchrl' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=tmp_path)  # the installed package


MATRIX = [
    ("LazyTensorStorage", "round_robin", 1),
    ("LazyMemmapStorage", "round_robin", 1),
    ("ListStorage", "round_robin", 1),
    ("LazyStackStorage", "round_robin", 1),
    ("LazyTensorStorage", "max_value", 1),
    ("LazyTensorStorage", "round_robin", 2),
]


def _matrix_run(config, ops, max_age, tmp, read_ledger):
    """Runs ``ops`` on a fresh buffer of ``config``; returns (ledger, sampled rows, dim-0 slots written)."""
    storage_name, writer, ndim = config
    sampler = StalenessSampler(max_age=max_age, shuffle=False)
    if ndim == 2:
        storage = LazyTensorStorage(2 * 12, ndim=2)  # TorchRL stores [2, k] time-major: k dim-0 slots of 2 cells
    else:
        tmp.mkdir(parents=True, exist_ok=True)
        storage = STORAGES[storage_name](12, tempfile.mkdtemp(dir=tmp))  # a fresh folder per hypothesis example
    extra = {"writer": TensorDictMaxValueWriter(rank_key="obs")} if writer == "max_value" else {}
    cls = ReplayBuffer if ndim == 2 else TensorDictReplayBuffer  # TorchRL's TensorDict buffer cannot index 2-d
    rb = cls(storage=storage, sampler=sampler, batch_size=3, **extra)
    version, next_row, slots_written, sampled = 0, 0, 0, []
    for op, k in ops:
        if op == "write":
            data = rows(k, version, start=next_row)
            if ndim == 2:
                data = TensorDict({key: v.reshape(1, k).expand(2, k).clone() for key, v in data.items()}, [2, k])
            index = rb.extend(data)
            written = torch.as_tensor(index)
            slots_written += k if ndim == 2 else int((written >= 0).sum())
            next_row += k
            if read_ledger:
                sampler.ledger()  # an unrelated read between writes must not change what they did
        elif op == "bump":
            version += 1
            sampler.consumer_version = version
        elif sampler._sampleable_count(rb.storage) > 0:
            batch = rb.sample()
            assert (version - batch["policy_version"].reshape(-1) <= max_age).all()
            sampled.append(batch["obs"].reshape(-1).tolist())
    return sampler.ledger(), sampled, slots_written


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    config=st.sampled_from(MATRIX),
    ops=st.lists(st.tuples(st.sampled_from(["write", "write", "sample", "bump"]), st.integers(1, 9)), max_size=30),
    max_age=st.integers(0, 2),
)
def test_every_storage_and_writer_counts_each_row_written_once_whatever_reads_come_between(
    config, ops, max_age, tmp_path
):
    # Issue 59: a max-value writer's rejected rows (-1) were read as the last slot (items 6), a 2-d storage's
    # cells as repeated slots (7), and two writes merged before a ledger read wrapped into one (8).
    quiet, sampled, slots_written = _matrix_run(config, ops, max_age, tmp_path / "a", read_ledger=False)
    read, sampled_read, _ = _matrix_run(config, ops, max_age, tmp_path / "b", read_ledger=True)
    assert quiet == read and sampled == sampled_read
    if slots_written:
        assert quiet["put_total"] == slots_written - quiet["overwritten_in_write"]
        assert quiet["put_total"] == quiet["retired"] + quiet["dropped_stale"] + quiet["evicted"] + quiet["buffer_left"]
        assert quiet["overwritten_in_write"] == 0  # no single write here is longer than the storage


@pytest.mark.filterwarnings("ignore:Got conflicting batch_sizes:UserWarning")
def test_a_2d_storage_overflow_evicts_whole_slots_like_a_1d_one():
    sampler = StalenessSampler(max_age=10)
    rb = ReplayBuffer(storage=LazyTensorStorage(30, ndim=2), sampler=sampler, batch_size=3)
    for k in range(15):  # [2, 3] time-major: 3 dim-0 slots of 2 cells each, 45 slot writes into 15 slots
        rb.extend(
            TensorDict(
                {"obs": torch.full((2, 3), float(k)), "policy_version": torch.zeros(2, 3, dtype=torch.long)}, [2, 3]
            )
        )
    assert tuple(rb.storage.shape) == (15, 2)
    rb.sample(300)
    led = sampler.ledger()
    assert (led["put_total"], led["evicted"], led["overwritten_in_write"], led["taken"]) == (45, 30, 0, 15)


@pytest.mark.filterwarnings("ignore:Got conflicting batch_sizes:UserWarning")
def test_iterating_the_buffer_ends_when_nothing_is_left_and_a_batch_size_below_one_is_refused():
    rb, sampler = buffer(size=16, max_age=3, batch_size=4)
    rb.extend(rows(10, 0))
    with pytest.raises(ValueError, match="batch_size=0 must be an int >= 1"):
        rb.sample(0)
    with pytest.raises(ValueError, match="batch_size=-1"):
        rb.sample(-1)
    seen = [r for batch in rb for r in batch["obs"].reshape(-1).tolist()]  # as TorchRL's own samplers end it
    assert sorted(seen) == list(range(10)) and sampler.ran_out
    rb.extend(rows(2, 0, start=10))
    assert sorted(r for batch in rb for r in batch["obs"].reshape(-1).tolist()) == [10, 11]  # a new pass starts


def test_prefetch_never_hands_out_a_batch_judged_at_an_older_version():
    # Issue 59, item 4: with prefetch=2 TorchRL sampled ahead in a thread pool, before consumer_version moved; at
    # version 5 with max_age 1 it returned rows of version 0 and info["staleness"] said 0.
    sampler = StalenessSampler(max_age=1, shuffle=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(64), sampler=sampler, batch_size=4, prefetch=2)
    rb.extend(rows(16, 0))
    rb.sample()
    rb.extend(rows(8, 5, start=16))
    sampler.consumer_version = 5
    batch = rb.sample()
    assert set(batch["policy_version"].tolist()) == {5}
    assert balanced(sampler)["dropped_stale"] == 12


def test_another_processs_rewrite_at_the_same_version_is_found():
    # Issue 59, item 5: a spawned writer rewrote all 8 slots at version 0, the version they held; comparing only
    # the version column, the parent never saw it ("no entry can be sampled", put_total 8 instead of 16).
    import torch.multiprocessing as mp
    from _torchrl_child import write_rows

    sampler = StalenessSampler(max_age=2, shuffle=False)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(8), sampler=sampler, batch_size=8, shared=True)
    rb.extend(rows(8, 0))
    assert sorted(rb.sample()["obs"].reshape(-1).tolist()) == list(range(8))
    child = mp.get_context("spawn").Process(target=write_rows, args=(rb, 0, 100))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert sorted(rb.sample()["obs"].reshape(-1).tolist()) == list(range(100, 108))
    led = balanced(sampler)
    assert led["put_total"] == 16 and led["foreign_writes"] == 8
