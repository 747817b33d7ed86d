"""verl sampling at 4k, 17k and 70k TransferQueue tags: verl's real ReplayBufferAsync against ours.

``pytest benchmarks/test_bench_verl.py --verl-src /path/to/verl`` (or ``VERL_SRC=...``); without a verl
checkout the verl rows are skipped with the reason. Per size, one benchmark group with:
- ``tq round trip``: ``kv_list`` of the partition alone, on a real TransferQueue (the floor);
- ``verl cpu`` / ``pyfast_buffer cpu``: one ``sample`` on an answer already listed (an in-process
  dict stands in for TransferQueue), so only the sampler's work is timed;
- ``verl end to end`` / ``pyfast_buffer end to end``: one ``sample`` on the real TransferQueue.
Between two rounds (untimed) the trainer's step is replayed: the batch's trajectories are cleared and
as many fresh groups written, so the partition stays at size. See pyfast_buffer/bench/verl_case.py.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("transfer_queue", reason="the verl extra is not installed: pip install '.[verl]'")
pytest.importorskip("transfer_queue", reason="the verl extra is not installed: pip install '.[verl]'")
ours = pytest.importorskip("pyfast_buffer.integrations.verl", reason="the verl extra is not installed")
from pyfast_buffer.bench import verl_case  # noqa: E402 - after the skip: it needs the verl extra

ROUNDS = 5


@pytest.fixture(scope="module")
def tq_running():
    with verl_case.running_transfer_queue() as tq:
        yield tq


@pytest.fixture(scope="module")
def verl(request):
    src = request.config.getoption("--verl-src", default=None) or os.environ.get("VERL_SRC", "")
    if not src:
        pytest.skip("verl's rows need a verl checkout: pass --verl-src PATH (or set VERL_SRC)")
    return verl_case.load_verl(src)


@pytest.fixture
def partition(tq_running, request):
    pid = f"bench-{request.node.name.replace('[', '-').rstrip(']')}"
    yield pid
    verl_case.clear_partition(tq_running, pid)


def cpu_round(benchmark, cls, modules, tags):
    stand_in = verl_case.ListedAnswer("bench", verl_case.groups(tags))
    rb = verl_case.make_sampler(cls)
    last = {"keys": []}

    def setup():
        stand_in.replay_trainer_step(last["keys"])
        return (), {}

    def one():
        batch, _ = rb.sample(global_steps=verl_case.STEP, partition_id="bench", batch_size=verl_case.BATCH)
        last["keys"] = batch.keys
        return batch

    with verl_case.transfer_queue_module(modules, stand_in):
        batch = benchmark.pedantic(one, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    assert len(batch.keys) == verl_case.BATCH * verl_case.SESSIONS


def end_to_end_round(benchmark, tq, cls, pid, tags):
    rb = verl_case.make_sampler(cls)
    last = {"keys": []}

    def setup():
        if last["keys"]:
            tq.kv_clear(keys=last["keys"], partition_id=pid)
        verl_case.put_groups(tq, pid, verl_case.BATCH)
        return (), {}

    def one():
        batch, _ = rb.sample(global_steps=verl_case.STEP, partition_id=pid, batch_size=verl_case.BATCH)
        last["keys"] = batch.keys
        return batch

    verl_case.put_groups(tq, pid, verl_case.groups(tags) - verl_case.BATCH)
    batch = benchmark.pedantic(one, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    assert len(batch.keys) == verl_case.BATCH * verl_case.SESSIONS


@pytest.mark.parametrize("tags", verl_case.SIZES)
def test_tq_round_trip(benchmark, tq_running, partition, tags):
    benchmark.group = f"verl sample B={verl_case.BATCH} tags={tags}"
    verl_case.put_groups(tq_running, partition, verl_case.groups(tags))
    listed = benchmark.pedantic(lambda: tq_running.kv_list(partition_id=partition), rounds=ROUNDS, warmup_rounds=1)
    assert len(listed[partition]) == verl_case.groups(tags) * (verl_case.SESSIONS + 1)


@pytest.mark.parametrize("tags", verl_case.SIZES)
def test_verl_cpu(benchmark, verl, tags):
    benchmark.group = f"verl sample B={verl_case.BATCH} tags={tags}"
    cpu_round(benchmark, verl.ReplayBufferAsync, [verl], tags)


@pytest.mark.parametrize("tags", verl_case.SIZES)
def test_pyfast_buffer_cpu(benchmark, tags):
    benchmark.group = f"verl sample B={verl_case.BATCH} tags={tags}"
    cpu_round(benchmark, ours.FastReplayBuffer, verl_case.sampler_modules(), tags)


@pytest.mark.parametrize("tags", verl_case.SIZES)
def test_verl_end_to_end(benchmark, tq_running, verl, partition, tags):
    benchmark.group = f"verl sample B={verl_case.BATCH} tags={tags}"
    end_to_end_round(benchmark, tq_running, verl.ReplayBufferAsync, partition, tags)


@pytest.mark.parametrize("tags", verl_case.SIZES)
def test_pyfast_buffer_end_to_end(benchmark, tq_running, partition, tags):
    benchmark.group = f"verl sample B={verl_case.BATCH} tags={tags}"
    end_to_end_round(benchmark, tq_running, ours.FastReplayBuffer, partition, tags)
