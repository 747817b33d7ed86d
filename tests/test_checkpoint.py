"""Durable checkpoints: save/load round trips, refusal of damaged files, in-flight policy, real crashes."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from _helpers import assert_balanced, rows

import pyfast_buffer as pfb
from pyfast_buffer import checkpoint, durable

IMPLS = [pfb.StalenessBuffer, pfb.ReferenceBuffer]


def _busy(impl, **config):
    """A buffer with groups, reuse, an eviction, a drop and prompts in flight (one with a lease)."""
    buf = impl(6, max_age=3, max_uses=2, **config)
    buf.put([1, 2], 0, group_ids=[5, 5])
    buf.put([3, 4, 5], [1, 2, 2])
    buf.put([6, 7], 2)  # evicts group 5
    buf.take(2, 2)  # 3 and 4 stay with uses=1
    buf.dispatch([70], 2)
    buf.dispatch([71, 72], 2, lease=30)
    buf.complete([8], [72])
    return buf


def _plain(node):
    """A state tree with tensors/arrays as (type, dtype, shape, values), so trees compare with ==."""
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(_plain(v) for v in node)
    if isinstance(node, torch.Tensor):
        return ("tensor", str(node.dtype), tuple(node.shape), node.tolist())
    if isinstance(node, np.ndarray):
        return ("ndarray", node.dtype.str, node.shape, node.tolist())
    return (type(node).__name__, node)


#: In-flight columns measured from "now" when state_dict() runs: they move with the clock, so comparisons skip them.
_CLOCK_RELATIVE = ("lease_left_ns", "held_ns")


def _fingerprint(buf):
    sd = buf.state_dict()
    sd["in_flight"] = {k: v for k, v in sd["in_flight"].items() if k not in _CLOCK_RELATIVE}
    return _plain(sd), buf.ledger(), len(buf), buf.in_flight


def _frame(header: bytes, payload: bytes, version: int = checkpoint.FORMAT_VERSION) -> bytes:
    """A file in the documented layout with a correct checksum: damage that only the later checks can catch."""
    prefix = struct.pack("<8sIQQ", checkpoint.MAGIC, version, len(header), len(payload))
    return prefix + hashlib.sha256(prefix + header + payload).digest() + header + payload


def _temp_files(directory):
    return sorted(p for p in os.listdir(directory) if p.endswith(checkpoint.TEMP_SUFFIX))


# -- round trips ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", IMPLS, ids=["into_native", "into_reference"])
def test_round_trip_within_and_across_implementations(impl, target, tmp_path):
    src = _busy(impl)
    path = tmp_path / "buffer.ckpt"
    src.save(path)
    dst = target(6, max_age=3, max_uses=2)
    assert dst.load(path, in_flight="keep").tolist() == []
    assert _fingerprint(dst) == _fingerprint(src)
    assert_balanced(dst)
    leases = dict(zip(*(dst.state_dict()["in_flight"][k].tolist() for k in ("prompt_id", "lease_left_ns"))))
    assert leases[70] == -1 and 0 < leases[71] <= 30 * 10**9  # the lease came along, still running
    a, b = src.take(6, 3), dst.take(6, 3)
    assert rows(a) == rows(b) and a.metrics == b.metrics
    src.complete([9], [70])
    dst.complete([9], [70])
    assert rows(src.take(6, 3)) == rows(dst.take(6, 3))


def test_save_overwrites_and_load_accepts_str_paths(impl, tmp_path):
    path = str(tmp_path / "b.ckpt")
    buf = impl(8)
    buf.put([1], 0)
    buf.save(path)
    buf.put([2, 3], 1)
    buf.save(path)
    other = impl(8)
    other.load(path)
    assert _fingerprint(other) == _fingerprint(buf) and len(other) == 3
    assert _temp_files(tmp_path) == []


def test_a_target_name_near_the_filesystem_limit_saves_and_loads(impl, tmp_path):
    path = tmp_path / ("b" * 240 + ".ckpt")  # 245 bytes: its temporary file needs a shortened name
    buf = _busy(impl)
    buf.save(path)
    buf.save(path)
    other = impl(6, max_age=3, max_uses=2)
    other.load(path, in_flight="keep")
    assert _fingerprint(other) == _fingerprint(buf) and os.listdir(tmp_path) == [path.name]


def test_every_supported_leaf_round_trips_with_its_type(tmp_path):
    state = {
        "ints": [0, -1, 2**63 - 1, 2**70],
        "floats": (1.5, float("inf"), -0.0),
        "misc": {"s": "ümlaut ✓", "t": True, "f": False, "none": None, "nested": {"deeper": [{"x": [1]}]}},
        "tensors": {
            str(d): torch.arange(6).to(d).reshape(2, 3)
            for d in (
                torch.bool,
                torch.int8,
                torch.uint8,
                torch.int32,
                torch.int64,
                torch.float16,
                torch.float32,
                torch.float64,
                torch.complex64,
            )
        },
        "scalar_tensor": torch.tensor(7),
        "empty": torch.empty(0, 4, dtype=torch.int64),
        "strided": torch.arange(20).reshape(4, 5)[:, ::2],
        "ndarray": np.arange(5, dtype=np.uint16),
        "numpy_scalars": [np.int64(3), np.float32(0.5), np.bool_(True)],
    }
    path = tmp_path / "tree.ckpt"
    checkpoint.save_state(state, path)
    back = checkpoint.load_state(path)
    expected = _plain(state)
    expected["numpy_scalars"] = _plain([3, 0.5, True])  # numpy scalars come back as Python scalars
    assert _plain(back) == expected
    assert all(t.data_ptr() % 64 == 0 for t in back["tensors"].values())  # aligned, zero-copy views of the file
    back["ndarray"][0] = 9  # writable, owned by the load
    assert isinstance(back["floats"], tuple) and isinstance(back["ints"], list)


@pytest.mark.parametrize(
    "leaf, named",
    [
        ({"a": {"b": object()}}, r"state\['a'\]\['b'\] is a object"),
        ({"a": [torch.zeros(2, dtype=torch.bfloat16)]}, r"state\['a'\]\[0\] is a torch.bfloat16 tensor"),
        ({"a": {1: 2}}, "has key 1"),
        ({"a": np.array(["x"], dtype=object)}, "dtype object"),
    ],
)
def test_unstorable_state_is_refused_before_any_file_is_touched(leaf, named, tmp_path):
    path = tmp_path / "b.ckpt"
    checkpoint.save_state({"ok": 1}, path)
    before = path.read_bytes()
    with pytest.raises(TypeError, match=named):
        checkpoint.save_state(leaf, path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["b.ckpt"]


# -- refusing damaged files ------------------------------------------------------------------------------------


def _damaged_files(good: bytes):
    rng = random.Random(1234)
    n = len(good)
    for cut in sorted({0, 7, 8, 27, 59, 60, 61, n // 2, n - 64, n - 1}):
        yield f"truncated to {cut}", good[:cut], "truncated|shorter than"
    yield "one extra byte", good + b"\0", "extra bytes"
    yield "a second copy appended", good + good, "extra bytes"
    yield "wrong magic", b"PK\x03\x04" + good[4:], "magic"
    yield "text-mode CRLF damage", good[:4] + b"\n" + good[6:], "magic"
    future = bytearray(good)
    struct.pack_into("<I", future, 8, checkpoint.FORMAT_VERSION + 1)
    yield "newer version", bytes(future), "format version 2.*newer"
    header_end = 60 + struct.unpack_from("<Q", good, 12)[0]
    older = _frame(good[60:header_end], good[header_end:], version=0)
    yield "older version, checksum intact", older, "version 0.*older"
    positions = rng.sample(range(n), 150) + list(range(60))  # every byte of the fixed header, and a spread
    for pos in positions:
        flipped = bytearray(good)
        flipped[pos] ^= 1 << rng.randrange(8)
        field = "magic" if pos < 8 else "format version" if pos < 12 else "announces" if pos < 28 else "checksum"
        yield f"bit flip at byte {pos}", bytes(flipped), field
    zeroed = bytearray(good)
    zeroed[n // 2 : n // 2 + 4096] = bytes(len(zeroed[n // 2 : n // 2 + 4096]))
    yield "a zeroed page in the payload", bytes(zeroed), "checksum"


def test_damaged_files_are_refused_and_change_nothing(impl, tmp_path):
    good_path = tmp_path / "good.ckpt"
    big = impl(4096, max_age=3, max_uses=2)
    big.put(list(range(3000)), 1)
    big.dispatch([10_001, 10_002], 1)
    big.save(good_path)
    good = good_path.read_bytes()
    buf = _busy(impl)
    before = _fingerprint(buf)
    bad = tmp_path / "bad.ckpt"
    for what, data, message in _damaged_files(good):
        bad.write_bytes(data)
        with pytest.raises(pfb.CheckpointError, match=message) as info:
            buf.load(bad, in_flight="fail")
        assert str(bad) in str(info.value) and info.value.path == str(bad), what
        assert _fingerprint(buf) == before, what
    target = impl(4096, max_age=3, max_uses=2)
    assert target.load(good_path).tolist() == [10_001, 10_002]  # the undamaged original still loads


@pytest.mark.parametrize(
    "header, message",
    [
        (b"{not json", "not valid JSON"),
        (b'{"tree": 1}', "without 'tree' and 'arrays'"),
        (b'{"tree": {"tensor": 0}, "arrays": []}', "refers to array 0 but its header lists 0 arrays"),
        (b'{"tree": {"pickle": "x"}, "arrays": []}', "unknown node 'pickle'"),
        (b'{"tree": {"tensor": 0}, "arrays": [{"dtype": "|O", "shape": [1], "offset": 0, "nbytes": 8}]}', "malformed"),
        (
            b'{"tree": {"tensor": 0}, "arrays": [{"dtype": "<i8", "shape": [2], "offset": 0, "nbytes": 16}]}',
            "malformed",
        ),
        (b'{"tree": {"tensor": 0}, "arrays": [{"dtype": "<i8", "shape": [1], "offset": 0, "nbytes": 4}]}', "malformed"),
        (b'{"tree": {"tensor": 0}, "arrays": [{"dtype": "zz", "shape": [1], "offset": 0, "nbytes": 8}]}', "malformed"),
        (b'{"tree": [1, 2], "arrays": []}', "malformed state tree"),
        (b'{"tree": 5, "arrays": []}', "holds no state_dict"),
    ],
)
def test_a_well_framed_file_with_a_bad_header_is_refused(impl, header, message, tmp_path):
    path = tmp_path / "crafted.ckpt"
    path.write_bytes(_frame(header, b"\0" * 8))
    buf = _busy(impl)
    before = _fingerprint(buf)
    with pytest.raises(pfb.CheckpointError, match=message):
        buf.load(path)
    assert _fingerprint(buf) == before


def test_a_sound_file_the_buffer_refuses_changes_nothing(impl, tmp_path):
    path = tmp_path / "edited.ckpt"
    sd = _busy(impl).state_dict()
    sd["ledger"]["retired"] += 1
    checkpoint.save_state(sd, path)  # framed and checksummed correctly, but its ledger does not balance
    buf = _busy(impl)
    before = _fingerprint(buf)
    with pytest.raises(ValueError, match="does not balance"):
        buf.load(path)
    small = impl(2, max_uses=2)
    _busy(impl).save(path)
    with pytest.raises(ValueError, match="more than capacity=2"):
        small.load(path)
    assert _fingerprint(buf) == before and len(small) == 0


def test_missing_file_and_bad_in_flight_argument(impl, tmp_path):
    buf = _busy(impl)
    before = _fingerprint(buf)
    with pytest.raises(FileNotFoundError):
        buf.load(tmp_path / "absent.ckpt")
    with pytest.raises(ValueError, match=r"in_flight='drop' is unknown; use 'fail'.*or 'keep'"):
        buf.load(tmp_path / "absent.ckpt", in_flight="drop")  # checked before the file is even opened
    assert _fingerprint(buf) == before


# -- failed saves keep the previous file ---------------------------------------------------------------------


def test_save_that_cannot_finish_leaves_the_previous_file(impl, tmp_path):
    path = tmp_path / "b.ckpt"
    buf = _busy(impl)
    buf.save(path)
    before = path.read_bytes()
    (tmp_path / "dir.ckpt").mkdir()
    with pytest.raises(IsADirectoryError, match=r"is a folder.*dir\.ckpt"):
        buf.save(tmp_path / "dir.ckpt")  # refused before anything is written
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"a_file"):
        buf.save(tmp_path / "a_file" / "b.ckpt")  # a part of the path is a file
    assert path.read_bytes() == before and (tmp_path / "a_file").read_text() == "x"
    assert sorted(os.listdir(tmp_path)) == ["a_file", "b.ckpt", "dir.ckpt"] and os.listdir(tmp_path / "dir.ckpt") == []


def test_every_save_creates_missing_folders_and_refuses_paths_that_name_no_file(tmp_path, monkeypatch):
    buf = _busy(pfb.StalenessBuffer)
    buf.save(tmp_path / "a" / "deep" / "b.ckpt")  # one behaviour for every save: the folders are created
    checkpoint.save_state({"x": 1}, tmp_path / "b" / "s.pfb")
    durable.write_file(tmp_path / "c" / "f", b"data")
    _write_folder(tmp_path / "d" / "e" / "state", "new")
    assert checkpoint.load_state(tmp_path / "a" / "deep" / "b.ckpt")["ledger"] == buf.state_dict()["ledger"]
    assert checkpoint.load_state(tmp_path / "b" / "s.pfb") == {"x": 1}
    assert (tmp_path / "c" / "f").read_bytes() == b"data"
    assert _folder_content(tmp_path / "d" / "e" / "state") == {"one": "new", "two": "new"}
    fsynced = []
    monkeypatch.setattr(durable, "fsync_directory", lambda d: fsynced.append(d))
    buf.save(tmp_path / "g" / "h" / "b.ckpt")
    # each new folder made durable in its parent, then the rename in its folder
    assert fsynced == [str(tmp_path), str(tmp_path / "g"), str(tmp_path / "g" / "h")]
    monkeypatch.undo()

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"cannot save to '': the path is empty; pass a file path"):
        buf.save("")
    with pytest.raises(
        ValueError, match=r"cannot save to 'out/': a path ending in '/' names a folder.*'out/buffer\.pfb'"
    ):
        checkpoint.save_state({"x": 1}, "out/")
    with pytest.raises(ValueError, match="the path is empty"):
        durable.write_folder("", lambda temporary: None)
    assert not (tmp_path / "out").exists() and _temp_files(tmp_path) == []


def test_a_folder_save_refuses_to_replace_a_file(tmp_path):
    (tmp_path / "state").write_text("keep")
    with pytest.raises(ValueError, match=r"cannot save a folder to '.*state': a file \(not a folder\) is there"):
        _write_folder(tmp_path / "state", "new")
    assert (tmp_path / "state").read_text() == "keep"
    assert sorted(os.listdir(tmp_path)) == ["state"]  # no temporary folder or aside left


_FSIZE_CHILD = textwrap.dedent("""
    import errno, os, resource, signal, sys
    import pyfast_buffer as pfb
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write() fails with EFBIG instead of killing us
    buf = pfb.{impl}(4096)
    buf.put(list(range(4096)), 3)  # 256 KiB of columns
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 15, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        buf.save(sys.argv[1])
    except OSError as exc:
        sys.exit(0 if exc.errno == errno.EFBIG else 3)
    sys.exit(4)
""")


def test_save_failing_mid_write_leaves_the_previous_file_and_no_temporary(impl, tmp_path):
    """A real write failure (the file-size limit, EFBIG) after 32 KiB of the temporary file were written."""
    path = tmp_path / "b.ckpt"
    _busy(impl).save(path)
    before = path.read_bytes()
    child = subprocess.run(
        [sys.executable, "-c", _FSIZE_CHILD.format(impl=impl.__name__), str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert child.returncode == 0, child.stderr
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["b.ckpt"]  # the failed save removed its own temporary file


# -- in-flight prompts ---------------------------------------------------------------------------------------


def _waiting(impl):
    buf = impl(8, max_age=2, strategy="wait")
    buf.put([1, 2], 1)
    buf.dispatch([40, 41], 1)
    return buf


def test_keep_restores_in_flight_prompts_that_block_wait(impl, tmp_path):
    path = tmp_path / "w.ckpt"
    _waiting(impl).save(path)
    buf = impl(8, max_age=2, strategy="wait")
    assert buf.load(path, in_flight="keep").tolist() == []
    assert buf.in_flight == 2 and assert_balanced(buf)["failed"] == 0
    assert len(buf.take(2, 3)) == 0  # prompts 40 and 41 are at max_age: wait blocks the take
    with pytest.raises(TimeoutError, match="40"):
        buf.take(2, 3, timeout=0.05)
    buf.complete([3], [40])
    buf.fail([41])
    assert sorted(buf.take(3, 3).traj_ids.tolist()) == [1, 2, 3]


def test_fail_fails_restored_prompts_counts_them_and_returns_their_ids(impl, tmp_path):
    path = tmp_path / "w.ckpt"
    src = _waiting(impl)
    src.save(path)
    buf = impl(8, max_age=2, strategy="wait")
    assert buf.load(path, in_flight="fail").tolist() == [40, 41]
    led = assert_balanced(buf)
    assert led["in_flight"] == 0 and led["failed"] == src.ledger()["failed"] + 2
    assert led["dispatched"] == src.ledger()["dispatched"]
    assert sorted(buf.take(2, 3).traj_ids.tolist()) == [1, 2]  # nothing blocks the trainer
    with pytest.raises(ValueError):
        buf.complete([9], [40])  # a late completion of a failed prompt is refused, as after fail()


def test_fail_reports_the_restored_prompts_as_released(impl, tmp_path):
    path = tmp_path / "w.ckpt"
    _waiting(impl).save(path)
    buf = impl(8, max_age=2, strategy="wait", track_released=True)
    buf.load(path)
    released = buf.released()
    assert released.of("failed").tolist() == [40, 41] and len(released.ids) == 2


def test_default_is_fail_everywhere(impl):
    assert checkpoint.DEFAULT_IN_FLIGHT == "fail"
    for fn in (impl.load, checkpoint.load):
        assert inspect.signature(fn).parameters["in_flight"].default == checkpoint.DEFAULT_IN_FLIGHT


# -- temporary files -----------------------------------------------------------------------------------------


def test_orphaned_temporary_files_of_dead_writers_are_removed_by_the_next_save(impl, tmp_path):
    path = tmp_path / "b.ckpt"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    names = {
        "dead": f".b.ckpt.{host}.{dead.pid}.abcd{checkpoint.TEMP_SUFFIX}",
        "alive": f".b.ckpt.{host}.{os.getppid()}.abcd{checkpoint.TEMP_SUFFIX}",
        "other_host": f".b.ckpt.elsewhere.{dead.pid}.abcd{checkpoint.TEMP_SUFFIX}",
        "other_target": f".c.ckpt.{host}.{dead.pid}.abcd{checkpoint.TEMP_SUFFIX}",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"torn")
    assert checkpoint.orphaned_temp_files(path) == [str(tmp_path / names["dead"])]
    impl(4).save(path)
    left = set(os.listdir(tmp_path))
    assert left == {"b.ckpt", names["alive"], names["other_host"], names["other_target"]}


# -- a real crash during saves --------------------------------------------------------------------------------

_FORK_SERVER = textwrap.dedent("""
    # Builds two buffers once, then forks one writer per round that saves them alternately forever;
    # the test SIGKILLs the writer. Forking avoids paying the torch import once per round.
    import os, sys, time
    import pyfast_buffer as pfb
    path, ref_a, ref_b = sys.argv[1:4]
    a = pfb.StalenessBuffer(60_000)
    a.put(list(range(50_000)), 0, group_ids=[i // 64 for i in range(50_000)])  # groups keep load_state_dict quick
    b = pfb.StalenessBuffer(60_000, max_uses=2)
    b.put(list(range(50_000, 100_000)), 1, group_ids=[i // 64 for i in range(50_000)])
    b.dispatch(list(range(7)), 2)
    for buf in (a, b):
        buf._set_lease_clock(0)  # freezes held_ns, so every save of one buffer writes the same bytes
    a.save(ref_a); b.save(ref_b); a.save(path)
    start = time.perf_counter()
    for _ in range(4):
        a.save(path)
    print(f"ready {(time.perf_counter() - start) / 4}", flush=True)
    for line in sys.stdin:
        if line.strip() == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    while True:
                        b.save(path)
                        a.save(path)
                finally:
                    os._exit(3)
            print(pid, flush=True)
        elif line.strip() == "reap":
            print(os.waitpid(pid, 0)[1], flush=True)
""")


def _kill_writers(server, path, ref_a, ref_b, rng, rounds=60):
    """SIGKILLs one forked writer per round at a random moment; checks the file after each kill."""
    word, save_s = server.stdout.readline().split()
    assert word == "ready"
    states = {ref_a.read_bytes(): "a", ref_b.read_bytes(): "b"}
    seen = {"a": 0, "b": 0}
    killed_mid_write = 0
    for _ in range(rounds):
        server.stdin.write("fork\n")
        writer = int(server.stdout.readline())
        time.sleep(rng.uniform(0, 3 * float(save_s)))  # anywhere in three saves: write, fsync, rename, dir fsync
        os.kill(writer, signal.SIGKILL)
        server.stdin.write("reap\n")
        status = int(server.stdout.readline())
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        data = path.read_bytes()
        assert data in states, "a SIGKILLed save left a file that is neither the old nor the new state"
        seen[states[data]] += 1
        killed_mid_write += bool(_temp_files(path.parent))
        loaded = pfb.StalenessBuffer(60_000, max_uses=2)
        loaded.load(path, in_flight="keep")
        assert len(loaded) == 50_000 and loaded.in_flight == (7 if states[data] == "b" else 0)
    return seen, killed_mid_write


def test_sigkill_during_repeated_saves_leaves_the_old_or_the_new_state(tmp_path):
    path, ref_a, ref_b = tmp_path / "live.ckpt", tmp_path / "ref" / "a.ckpt", tmp_path / "ref" / "b.ckpt"
    ref_a.parent.mkdir()
    rng = random.Random(20261130)
    # cwd: a subprocess must import the installed package, not the source tree (CI tests the wheel).
    with subprocess.Popen(
        [sys.executable, "-c", _FORK_SERVER, str(path), str(ref_a), str(ref_b)],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    ) as server:
        try:
            seen, killed_mid_write = _kill_writers(server, path, ref_a, ref_b, rng)
        finally:
            server.kill()
    assert seen["a"] and seen["b"], seen  # kills landed on both sides of a rename
    assert killed_mid_write, "no kill interrupted a write; the test did not exercise torn temporaries"
    leftovers = checkpoint.orphaned_temp_files(path)
    assert len(leftovers) == len(_temp_files(tmp_path))  # every leftover belongs to a dead writer
    pfb.StalenessBuffer(4).save(path)  # the next save removes them
    assert _temp_files(tmp_path) == []


# -- the folder writer (durable.write_folder), killed at each step of its swap ------------------------------------

_DIE_IN_SWAP = textwrap.dedent("""
    # Saves "new" into a folder holding "old" (and a stale aside holding "older"), and dies like a SIGKILL
    # (os._exit: no cleanup, no finally) just before the n-th step of the swap.
    import os, sys
    from pyfast_buffer import durable
    folder, die_at = sys.argv[1], int(sys.argv[2])
    steps = []
    def dying(real):
        def step(*args):
            steps.append(args)
            if len(steps) == die_at:
                os._exit(9)
            return real(*args)
        return step
    os.rename, durable._remove = dying(os.rename), dying(durable._remove)
    def fill(temporary):
        for name in ("one", "two"):
            with open(os.path.join(temporary, name), "w") as f:
                f.write("new")
    durable.write_folder(folder, fill)
    os._exit(0)
""")


def _folder_content(folder):
    return {name: (folder / name).read_text() for name in sorted(os.listdir(folder))}


def _write_folder(folder, text):
    def fill(temporary):
        for name in ("one", "two"):
            with open(os.path.join(temporary, name), "w") as f:
                f.write(text)

    durable.write_folder(folder, fill)


@pytest.mark.parametrize(
    "die_at, expected",
    [
        (1, "old"),  # before the stale aside is removed
        (2, "old"),  # before the folder is renamed aside
        (3, "old"),  # between the two renames: no folder, the previous save is read from the aside
        (4, "new"),  # before the aside is removed
        (5, "new"),  # not killed
    ],
)
def test_a_folder_save_killed_at_any_step_of_its_swap_reads_whole(die_at, expected, tmp_path):
    folder = tmp_path / "state"
    _write_folder(folder, "old")
    (tmp_path / ".state.pfb-old").mkdir()  # a stale aside, as a save killed after its swap leaves one
    (tmp_path / ".state.pfb-old" / "one").write_text("older")
    child = subprocess.run([sys.executable, "-c", _DIE_IN_SWAP, str(folder), str(die_at)], cwd=tmp_path)
    assert child.returncode == (0 if die_at == 5 else 9)
    readable = durable.readable_folder(folder)
    assert (readable == str(folder)) == (die_at != 3)
    assert _folder_content(type(folder)(readable)) == {"one": expected, "two": expected}
    _write_folder(folder, "newest")  # the next save recovers: in place, the aside and the dead writer's folder gone
    assert _folder_content(folder) == {"one": "newest", "two": "newest"}
    assert sorted(os.listdir(tmp_path)) == ["state"]


def test_a_folder_save_that_fails_changes_nothing(tmp_path):
    folder = tmp_path / "state"
    _write_folder(folder, "old")

    def failing(temporary):
        (tmp_path / "seen").write_text(temporary)
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        durable.write_folder(folder, failing)
    assert _folder_content(folder) == {"one": "old", "two": "old"}
    assert sorted(os.listdir(tmp_path)) == ["seen", "state"]  # the temporary folder is gone
    assert durable.readable_folder(tmp_path / "missing") == str(tmp_path / "missing")


_SAVE_IN_A_LOOP = textwrap.dedent("""
    # Saves the folder again and again, each save's two files holding its number, until killed.
    import os, sys
    from pyfast_buffer import durable
    folder, i = sys.argv[1], 0
    while True:
        i += 1
        def fill(temporary, i=i):
            for name in ("one", "two"):
                with open(os.path.join(temporary, name), "w") as f:
                    f.write(str(i))
        durable.write_folder(folder, fill, fsync=False)
""")


def test_read_folder_never_pairs_files_of_two_saves_while_saves_run(tmp_path):
    folder = tmp_path / "state"
    _write_folder(folder, "0")
    # cwd: the writer must import the installed package, not the source tree (CI tests the wheel).
    writer = subprocess.Popen([sys.executable, "-c", _SAVE_IN_A_LOOP, str(folder)], cwd=tmp_path)
    loads, mixed, seen = 0, [], set()
    try:
        # Until the writer has saved 20 times during the reads (its interpreter can take seconds to start on a
        # loaded machine), within a minute.
        end = time.monotonic() + 60
        while time.monotonic() < end and (len(seen) < 20 or loads < 200) and writer.poll() is None:
            with durable.read_folder(folder) as where:
                with open(os.path.join(where, "one")) as f:
                    one = f.read()
                time.sleep(0.0005)  # a loader's work between its two reads (parsing, checks)
                with open(os.path.join(where, "two")) as f:
                    two = f.read()
            loads += 1
            seen.add(one)
            if one != two:
                mixed.append((one, two))
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == -signal.SIGKILL, f"the writer ended on its own (exit {writer.returncode})"
    assert not mixed, f"{len(mixed)} of {loads} loads read files of two saves, e.g. {mixed[0]}"
    assert len(seen) > 2, "the writer saved too rarely during the reads: the race was not exercised"


def test_read_folder_finds_the_aside_and_the_missing_folder(tmp_path):
    with durable.read_folder(tmp_path / "missing") as where:
        assert where == str(tmp_path / "missing")
    with durable.read_folder(tmp_path / "no_parent" / "missing") as where:
        assert where == str(tmp_path / "no_parent" / "missing")
    (tmp_path / ".state.pfb-old").mkdir()  # a save killed between its two renames
    with durable.read_folder(tmp_path / "state") as where:
        assert where == str(tmp_path / ".state.pfb-old")


def test_file_layout_is_as_documented(tmp_path):
    path = tmp_path / "b.ckpt"
    pfb.ReferenceBuffer(4).save(path)
    data = path.read_bytes()
    magic, version, header_bytes, payload_bytes = struct.unpack_from("<8sIQQ", data)
    assert magic == b"\x89PFB\r\n\x1a\n" and version == 1
    assert len(data) == 60 + header_bytes + payload_bytes and (60 + header_bytes) % 64 == 0
    assert hashlib.sha256(data[:28] + data[60:]).digest() == data[28:60]
    header = json.loads(data[60 : 60 + header_bytes])
    assert header["tree"]["dict"]["format"] == "pyfast_buffer.state/1"


def test_checkpoint_error_pickles_with_its_path_and_message():
    import pickle

    from pyfast_buffer.checkpoint import CheckpointError

    err = CheckpointError("/tmp/x.ckpt", "is truncated")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is CheckpointError and back.path == err.path and str(back) == str(err)
