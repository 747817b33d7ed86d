"""A real SIGKILL during each integration's save leaves the previous state or the new one, whole (docs/checkpoints.md).

For NeMo RL's sampler (core and group map: one file), Miles's data buffer (our checked format, payloads pickled
inside it), slime's data source (one pickle) and TRL's worker (a folder of two files, swapped into place), a writer
process saves two different states alternately to one target and is killed with SIGKILL at a random moment; after
every kill the target is loaded as the integration's resume loads it, and what it yields must be exactly one of the
two states. A mix (say a new core beside an old group map) loads without an error, so each load is compared with
the two states loaded from reference copies. The writer is forked from a server that imports torch and builds both
states once (as tests/test_checkpoint.py's SIGKILL loop does), so each round costs milliseconds.

Runs without the frameworks: NeMo's buffer is ``_nemo_fake``, Miles's and slime's types are our contract copies, and
TRL's worker is built and saved without TRL (its state then holds groups in flight only: restoring ready samples
needs TRL's ``RolloutSample``, and what is tested here is the folder swap, not the samples' encoding).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from argparse import Namespace
from types import SimpleNamespace
from typing import Any, Callable, Dict, Tuple

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROUNDS = 30
NEMO_TARGET = "pyfast_buffer.integrations.nemo_rl:StalenessSampler"

# ---- NeMo RL: StalenessSampler.save_state(path) ---------------------------------------------------------------


def nemo_build(which: str) -> Any:
    from _nemo_fake import FakeTQReplayBuffer, create_sampler

    buffer = FakeTQReplayBuffer()
    sampler = create_sampler(buffer, NEMO_TARGET, strategy="drop", max_age=1)
    sampler.set_dispatch_index(0)
    # Big enough that the old two-file save spends a good share of its time between its two writes.
    ready, flying = (800, 0) if which == "a" else (1200, 5)

    async def fill() -> None:
        for _ in range(ready):
            gid = buffer.reserve(weight_version=0)
            await buffer.commit(gid, [3, 4], 0, 1)
        for _ in range(flying):
            buffer.reserve(weight_version=1)

    asyncio.run(fill())
    return sampler


def nemo_load(target: str) -> Any:
    from _nemo_fake import FakeTQReplayBuffer, create_sampler

    sampler = create_sampler(FakeTQReplayBuffer(), NEMO_TARGET, strategy="drop", max_age=1, state_path=target)
    sampler.set_dispatch_index(1)  # a resume, as NeMo calls it: only a resume reads state_path
    return sampler.ledger(), sorted(sampler.book.groups), sampler.book.next_pid


# ---- Miles: StalenessDataBuffer.save(path) ---------------------------------------------------------------------


def miles_buffer() -> Any:
    from _miles_contract import DataBufferConstructorInput

    from pyfast_buffer.integrations.miles import StalenessDataBuffer

    args = Namespace(
        rollout_batch_size=3,
        n_samples_per_prompt=2,
        max_weight_staleness=1,
        async_max_concurrent_samples=None,
        async_data_buffer_capacity_factor=2000.0,
        async_unused_samples_handler="retry",
        dynamic_sampling_filter_path=None,
    )
    return StalenessDataBuffer(
        DataBufferConstructorInput(args=args, unused_handler_fn=lambda group: None), strategy="wait", clock="rollout"
    )


def miles_build(which: str) -> Any:
    from _miles_contract import DataBufferInput, Sample

    buf = miles_buffer()
    ready, flying = (400, 3) if which == "a" else (600, 7)
    buf.begin_step(0 if which == "a" else 1)

    async def fill() -> None:
        for i in range(ready + flying):
            group = [
                Sample(
                    group_index=i,
                    index=2 * i + k,
                    prompt=f"p{i}",
                    status=Sample.Status.COMPLETED,
                    weight_versions=["0"],
                )
                for k in range(2)
            ]
            buf.dispatch(group)
            if i < ready:
                await buf.put(DataBufferInput(prompt_group=group, group=group))

    asyncio.run(fill())
    return buf


def miles_load(target: str) -> Any:
    buf = miles_buffer()
    lost = buf.load(target)
    ready = sorted(e.group[0].group_index for e in buf._store.ready_payloads())
    return sorted(g[0].group_index for g in lost), ready, buf._store.buffer.ledger(), buf._step


# ---- slime: StalenessSourceCore.save(rollout_id) under args.save -------------------------------------------------


def slime_source(**paths: Any) -> Any:
    import _slime_contract as contract

    from pyfast_buffer.integrations.slime import StalenessSourceCore

    settings: Dict[str, Any] = dict(
        pyfast_buffer_strategy="wait",
        pyfast_buffer_max_age=1,
        pyfast_buffer_capacity=10_000,
        rollout_batch_size=2,
        n_samples_per_prompt=2,
        rollout_global_dataset=True,
        save=None,
        load=None,
    )
    args = SimpleNamespace(**{**settings, **paths})
    return StalenessSourceCore(args, contract.RolloutDataSourceWithBuffer(args))


def slime_build(which: str) -> Any:
    source = slime_source()
    ready, requeued, flying = (400, 5, 3) if which == "a" else (600, 9, 6)
    source.begin_step(1 if which == "a" else 2)
    pairs = source.dispatch(ready + requeued + flying)
    for gid, group in pairs[:ready]:
        source.complete(gid, group)
    for gid, group in pairs[ready : ready + requeued]:
        source.requeue(gid, group)
    return source


def slime_save(source: Any, target: str) -> None:
    source.args.save = target
    source.save(1)


def slime_load(target: str) -> Any:
    source = slime_source(load=target)
    source.load(1)
    ready = sorted(group[0].group_index for _, group in source.store.ready_payloads())
    again = [g[0].group_index for g in source._resubmit], [g[0].group_index for g in source.prompts.buffer]
    return source.store.buffer.ledger(), ready, again, source.step, dict(source.counts)


# ---- TRL: StalenessRolloutWorker.save_state(folder) --------------------------------------------------------------


def trl_worker() -> Any:
    from pyfast_buffer.buffer import StalenessBuffer
    from pyfast_buffer.integrations.trl import StalenessRolloutWorker

    async def never(prompt_ids: Any, max_tokens: int) -> Any:
        raise AssertionError("nothing is generated here")

    worker = StalenessRolloutWorker(
        dataset=[{"prompt": "1+1"}] * 8,
        processing_class=object(),
        reward_funcs=[lambda **_: [0.0]],
        num_generations=2,
        max_completion_length=4,
        complete=never,
    )
    # What worker.configure builds from TRL's trainer arguments, without the trainer.
    worker._buffer = StalenessBuffer(
        1 << 14, max_age=1, strategy="drop", on_full="error", pin_memory=False, track_released=True
    )
    return worker


def trl_build(which: str) -> Any:
    from pyfast_buffer.integrations.trl._states import IN_FLIGHT

    worker = trl_worker()
    groups = 1500 if which == "a" else 2500
    worker.buffer.dispatch(list(range(groups)), 0)
    worker._groups = {g: {"index": g % 8, "step": 0, "state": IN_FLIGHT} for g in range(groups)}
    worker._cursor, worker._epoch, worker._next_group = groups % 8, groups // 8, groups
    worker.counts["generated"] = groups
    return worker


def trl_load(target: str) -> Any:
    worker = trl_worker()
    worker.load_state(target)
    position = worker._cursor, worker._epoch, worker._next_group, list(worker._redo)
    return position, worker.buffer.ledger(), dict(worker.counts)


#: name -> (build(which) in the writer, save(obj, target), load(target) -> what the resume sees)
CASES: Dict[str, Tuple[Callable[[str], Any], Callable[[Any, str], None], Callable[[str], Any]]] = {
    "nemo_rl": (nemo_build, lambda sampler, target: sampler.save_state(target), nemo_load),
    "miles": (miles_build, lambda buf, target: buf.save(target), miles_load),
    "slime": (slime_build, slime_save, slime_load),
    "trl": (trl_build, lambda worker, target: worker.save_state(target), trl_load),
}

_FORK_SERVER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    import test_integration_saves_killed as cases
    for line in sys.stdin:
        command, *words = line.split()
        if command == "case":  # builds both states of one integration, saves the references, times a save
            kind, live, ref_a, ref_b = words
            build, save, _ = cases.CASES[kind]
            a, b = build("a"), build("b")
            save(a, ref_a); save(b, ref_b); save(a, live)
            start = time.perf_counter()
            for _ in range(3):
                save(a, live)
            print(f"ready {(time.perf_counter() - start) / 3}", flush=True)
        elif command == "fork":  # a writer that saves the two states alternately until it is killed
            pid = os.fork()
            if pid == 0:
                try:
                    while True:
                        save(b, live)
                        save(a, live)
                finally:
                    os._exit(3)
            print(pid, flush=True)
        elif command == "reap":
            print(os.waitpid(pid, 0)[1], flush=True)
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One process for every case: it imports torch once, then forks each writer (a round costs milliseconds)."""
    # cwd: the writer must import the installed package, not the source tree (CI tests the wheel).
    with subprocess.Popen(
        [sys.executable, "-c", _FORK_SERVER, TESTS],
        cwd=tmp_path_factory.mktemp("server"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    ) as process:
        try:
            yield process
        finally:
            process.kill()


def _ask(server: Any, line: str) -> str:
    server.stdin.write(f"{line}\n")
    answer = server.stdout.readline()
    assert answer, f"the writer server died on {line!r} (its stderr is above)"
    return answer


@pytest.mark.parametrize("kind", sorted(CASES))
def test_sigkill_during_an_integration_save_leaves_the_old_or_the_new_state(kind, server, tmp_path):
    load = CASES[kind][2]
    live, ref_a, ref_b = (str(tmp_path / where / "state") for where in ("live", "ref_a", "ref_b"))
    for target in (live, ref_a, ref_b):
        os.makedirs(os.path.dirname(target))
    word, save_s = _ask(server, f"case {kind} {live} {ref_a} {ref_b}").split()
    assert word == "ready"
    states = {"a": load(ref_a), "b": load(ref_b)}
    assert states["a"] != states["b"]
    rng = random.Random(f"{kind}-20261201")
    seen = {"a": 0, "b": 0}
    rounds = 0
    # ROUNDS kills, and more (up to 4x, waiting longer each time) until kills have landed on both sides of a save:
    # save_s was measured on a quiet machine, and a loaded one can make every early kill land in the same save.
    while rounds < ROUNDS or (min(seen.values()) == 0 and rounds < 4 * ROUNDS):
        writer = int(_ask(server, "fork"))
        time.sleep(rng.uniform(0, 3 * float(save_s) * (1 + rounds // ROUNDS * 4)))  # anywhere in three saves
        rounds += 1
        os.kill(writer, signal.SIGKILL)
        status = int(_ask(server, "reap"))
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        got = load(live)
        which = [name for name, state in states.items() if state == got]
        assert which, f"a SIGKILLed {kind} save left a state that is neither the old nor the new one"
        seen[which[0]] += 1
    assert seen["a"] and seen["b"], seen  # kills landed on both sides of a save


# ---- the files earlier builds wrote still load; foreign or damaged files are refused by name ----------------------


def test_nemo_reads_the_two_files_an_earlier_build_wrote_and_the_next_save_makes_them_one(tmp_path):
    import json

    from pyfast_buffer import checkpoint

    sampler = nemo_build("b")
    new, old = str(tmp_path / "new.pfb"), str(tmp_path / "old.pfb")
    sampler.save_state(new)
    book = sampler.book
    sampler.core.save(old)  # what earlier builds wrote: the core, then the map beside it
    with open(f"{old}.groups.json", "w") as f:
        groups = {gid: [g.pid, g.status, g.stamp] for gid, g in book.groups.items()}
        json.dump({"groups": groups, "next_pid": book.next_pid, "counts": dict(book.counts), "ghosts": 0}, f)
    assert nemo_load(old) == nemo_load(new)
    sampler.save_state(old)
    assert not os.path.exists(f"{old}.groups.json") and nemo_load(old) == nemo_load(new)

    sampler.core.save(old)  # a core whose map is gone
    with pytest.raises(checkpoint.CheckpointError, match=r"group map .*old\.pfb\.groups\.json\) is missing"):
        nemo_load(old)
    checkpoint.save_state({"format": "something else"}, old)
    with pytest.raises(checkpoint.CheckpointError, match="not a NeMo RL sampler state"):
        nemo_load(old)


def test_miles_reads_an_earlier_pickle_and_refuses_a_damaged_file_before_unpickling_it(tmp_path):
    import pickle

    from pyfast_buffer import checkpoint
    from pyfast_buffer.integrations.miles import state_path

    buf = miles_build("a")
    root = str(tmp_path)
    os.makedirs(os.path.dirname(state_path(root, 3)))
    legacy = state_path(root, 3)[: -len(".pfb")] + ".pkl"
    with open(legacy, "wb") as f:  # what earlier builds wrote: the whole state_dict, pickled
        pickle.dump(buf.state_dict(), f)
    assert state_path(root, 3) == legacy  # a resume from such a checkpoint finds it
    buf.save(state_path(root, 4))
    assert state_path(root, 4).endswith("miles_buffer_4.pfb")
    assert miles_load(legacy) == miles_load(state_path(root, 4))

    path = state_path(root, 4)
    with open(path, "r+b") as f:
        f.seek(-10, os.SEEK_END)  # inside the pickled payloads, the file's last array
        byte = f.read(1)
        f.seek(-10, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(checkpoint.CheckpointError, match="sha256"):
        miles_load(path)
    checkpoint.save_state({"format": "something else"}, path)
    with pytest.raises(checkpoint.CheckpointError, match="not a Miles buffer state"):
        miles_load(path)


# ---- a load running while saves of the same target run reads one save; damage is refused before any change ---------


def test_trl_loads_during_a_stream_of_saves_read_one_save_each(server, tmp_path):
    """TRL's folder holds two files; a load reads them inside durable.read_folder (a shared lock against the swap),
    so a save running meanwhile can never pair one save's worker.json with the next one's buffer.pfb."""
    live, ref_a, ref_b = (str(tmp_path / where / "state") for where in ("live", "ref_a", "ref_b"))
    word, _ = _ask(server, f"case trl {live} {ref_a} {ref_b}").split()
    assert word == "ready"
    states = {"a": trl_load(ref_a), "b": trl_load(ref_b)}
    writer = int(_ask(server, "fork"))
    seen, mixed, loads = {"a": 0, "b": 0}, 0, 0
    try:
        end = time.monotonic() + 60  # until both saves were seen enough: a loaded machine is slow
        while time.monotonic() < end and (min(seen.values()) < 5 or loads < 40):
            got = trl_load(live)
            loads += 1
            which = [name for name, state in states.items() if state == got]
            if which:
                seen[which[0]] += 1
            else:
                mixed += 1
    finally:
        os.kill(writer, signal.SIGKILL)
        _ask(server, "reap")
    assert mixed == 0, f"{mixed} of {loads} loads mixed two saves"
    assert seen["a"] and seen["b"], seen  # the loads ran while the saves did


def _trl_folder(tmp_path: Any, name: str = "state") -> Tuple[Any, str]:
    worker = trl_build("a")
    folder = str(tmp_path / name)
    worker.save_state(folder, global_step=4)
    return worker, folder


def _trl_position(worker: Any) -> Any:
    return (
        worker._cursor,
        worker._epoch,
        worker._next_group,
        list(worker._redo),
        dict(worker.counts),
        len(worker.buffer),
        worker.buffer.ledger(),
    )


def test_trl_refuses_a_damaged_or_mixed_folder_before_it_changes_the_worker(tmp_path):
    import json

    from pyfast_buffer import checkpoint
    from pyfast_buffer.integrations.trl import _checkpoint

    _, folder = _trl_folder(tmp_path)
    state_file = os.path.join(folder, "worker.json")
    with open(state_file, encoding="utf-8") as f:
        text = f.read()
    assert '"cursor": 4' in text
    with open(state_file, "w", encoding="utf-8") as f:
        f.write(text.replace('"cursor": 4', '"cursor": 5'))  # one digit
    fresh = trl_worker()
    before = _trl_position(fresh)
    with pytest.raises(checkpoint.CheckpointError, match=r"worker\.json' fails the sha256 its manifest\.json records"):
        fresh.load_state(folder)
    assert _trl_position(fresh) == before

    # Files of two saves (a buffer.pfb from another save): refused by the manifest, nothing changed.
    _, other = _trl_folder(tmp_path, "other")
    with open(state_file, "w", encoding="utf-8") as f:
        f.write(text)
    trl_build("b").buffer.save(os.path.join(folder, "buffer.pfb"))
    with pytest.raises(checkpoint.CheckpointError, match=r"buffer\.pfb' is not the buffer manifest\.json records"):
        fresh.load_state(folder)
    assert _trl_position(fresh) == before

    # A sound folder whose buffer and samples disagree: refused before the buffer or the position changes.
    worker = trl_build("a")
    worker.buffer.put([10, 11], 0, group_ids=[5, 5])  # two ready trajectories, no samples
    worker.save_state(folder, global_step=4)
    with pytest.raises(ValueError, match="holds 2 ready trajectories in the buffer but 0 samples; the folder is not"):
        fresh.load_state(folder)
    assert _trl_position(fresh) == before

    # A manifest removed from a folder that had one.
    reference = trl_worker()
    reference.load_state(other)
    os.unlink(os.path.join(other, "manifest.json"))
    with pytest.raises(checkpoint.CheckpointError, match=r"manifest\.json' is missing, but worker\.json \(format 2\)"):
        fresh.load_state(other)
    assert _trl_position(fresh) == before

    # What earlier commits wrote (worker.json format 1, no manifest) still loads.
    with open(os.path.join(other, "worker.json"), encoding="utf-8") as f:
        legacy = json.load(f)
    legacy["format"] = _checkpoint.LEGACY_FORMAT
    with open(os.path.join(other, "worker.json"), "w", encoding="utf-8") as f:
        json.dump(legacy, f)
    fresh.load_state(other)
    assert _trl_position(fresh) == _trl_position(reference)


def test_nemo_refuses_an_earlier_builds_group_map_missing_a_key_before_it_changes_the_core(tmp_path):
    import json

    from _nemo_fake import FakeTQReplayBuffer, create_sampler

    from pyfast_buffer import checkpoint

    sampler = nemo_build("a")
    old = str(tmp_path / "old.pfb")
    sampler.core.save(old)  # an earlier build's two files, the map without "ghosts"
    with open(f"{old}.groups.json", "w") as f:
        json.dump({"groups": {}, "next_pid": 3, "counts": {}}, f)
    fresh = create_sampler(FakeTQReplayBuffer(), NEMO_TARGET, strategy="drop", max_age=1)
    before = fresh.core.ledger(), len(fresh.core), fresh.book.next_pid
    with pytest.raises(checkpoint.CheckpointError, match=r"old\.pfb\.groups\.json' has a group map without 'ghosts'"):
        fresh._load_state(old)
    with open(f"{old}.groups.json", "w") as f:
        json.dump({"groups": {"g": [1, "ready"]}, "next_pid": 3, "counts": {}, "ghosts": 0}, f)
    with pytest.raises(checkpoint.CheckpointError, match=r"groups\.json' has a malformed group map"):
        fresh._load_state(old)
    with open(f"{old}.groups.json", "w") as f:
        f.write('{"groups": {')  # torn
    with pytest.raises(checkpoint.CheckpointError, match=r"groups\.json' is not a JSON group map"):
        fresh._load_state(old)
    assert (fresh.core.ledger(), len(fresh.core), fresh.book.next_pid) == before


def test_slime_refuses_a_flipped_bit_before_unpickling_and_reads_an_earlier_plain_pickle(tmp_path):
    from pyfast_buffer import checkpoint
    from pyfast_buffer.integrations.slime import state_path
    from pyfast_buffer.integrations.slime._state import read_state

    root = str(tmp_path / "fresh" / "run")  # a missing folder: created by the save
    slime_save(slime_build("a"), root)
    reference = slime_load(root)
    path = state_path(root, 1)
    pickled = read_state(path)  # the pickle inside the checked file: what earlier builds wrote as the whole file
    with open(path, "rb") as f:
        data = bytearray(f.read())
    assert data[:8] == checkpoint.MAGIC
    data[len(data) // 2] ^= 0x01  # one bit, inside the pickled state
    with open(path, "wb") as f:
        f.write(data)
    fresh = slime_source(load=root)
    with pytest.raises(checkpoint.CheckpointError, match=r"pyfast_buffer_state_1\.pkl' fails its sha256 checksum"):
        fresh.load(1)
    assert fresh.store.buffer.ledger() == slime_source().store.buffer.ledger() and fresh.step == 0

    with open(path, "wb") as f:  # what earlier builds wrote: the state, pickled, unchecked
        f.write(pickled)
    assert slime_load(root) == reference
    checkpoint.save_state({"format": "something else"}, path)
    with pytest.raises(checkpoint.CheckpointError, match="not a slime data-source state"):
        slime_load(root)
