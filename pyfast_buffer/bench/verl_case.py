"""verl case: one ``sample`` at 4k/17k/70k TransferQueue tags, verl's real ReplayBufferAsync against ours.

Rows per size (``capacity`` = tags in the partition, ``batch`` = prompts per sample):
- ``tq round trip``: one ``kv_list`` of the partition on a real TransferQueue (local Ray): the floor,
  what any sampler must pay to see the tags (measured in turn with the end-to-end rows).
- ``verl cpu`` / ``pyfast_buffer cpu``: one ``sample`` on an answer already listed (TransferQueue is
  replaced by an in-process dict holding the same tags), so only the sampler's own work is timed.
- ``verl end to end`` / ``pyfast_buffer end to end``: one ``sample`` on the real TransferQueue, the
  contenders taking turns on one partition so the load of a shared machine falls on both alike.
Between two timed samples (untimed) the trainer's step is replayed: the batch's trajectories are
cleared and as many fresh groups written, so the partition stays at size. verl's module is loaded from
a checkout given by ``--verl-src`` (its ``verl.utils.skip.SkipManager`` is replaced by a no-op when verl
itself is not installed); without it the verl rows are skipped with the reason.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import time
import types
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

from .timing import median, percentile, sample

SESSIONS = 3  # a group: one prompt tag and three trajectory tags
BATCH = 64
STEP = 10
SIZES = (4_000, 17_000, 70_000)
QUICK_SIZES = (4_000, 17_000)
VERL_MODULE = os.path.join("verl", "trainer", "ppo", "v1", "replay_buffer.py")


def load_verl(verl_src: str) -> Any:
    """verl's replay_buffer module from a checkout, loaded by path under a private name; raises ImportError."""
    path = os.path.join(verl_src, VERL_MODULE)
    if not os.path.isfile(path):
        raise ImportError(f"--verl-src {verl_src!r} has no {VERL_MODULE}; pass the root of a verl checkout")
    stubs: dict[str, types.ModuleType] = {}
    try:
        importlib.import_module("verl.utils.skip")  # a real verl install provides it
    except ImportError:
        for name in ("verl", "verl.utils", "verl.utils.skip"):
            if name not in sys.modules:
                stubs[name] = sys.modules[name] = types.ModuleType(name)

        class SkipManager:  # no-op stand-in: annotate_tq returns the method unchanged
            @staticmethod
            def annotate_tq(**_kwargs: Any) -> Callable[[Callable], Callable]:
                return lambda fn: fn

        sys.modules["verl.utils.skip"].SkipManager = SkipManager  # type: ignore[attr-defined]
    try:
        spec = importlib.util.spec_from_file_location("_pyfast_bench_verl_replay_buffer", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # pyright: ignore[reportAttributeAccessIssue]
        return module
    finally:
        for name in stubs:
            sys.modules.pop(name, None)


def groups(tags: int) -> int:
    return tags // (SESSIONS + 1)


def new_group(items: dict[str, dict], step: int = STEP) -> None:
    uid = uuid.uuid4().hex
    for s in range(SESSIONS):
        items[f"{uid}_{s}_0"] = {"is_prompt": False, "global_steps": step}
    items[uid] = {"is_prompt": True, "status": "finished", "global_steps": step}


class ListedAnswer:
    """Stands in for the ``transfer_queue`` module: ``kv_list`` answers a prepared copy of ``items``."""

    def __init__(self, partition_id: str, n_groups: int) -> None:
        self.partition_id = partition_id
        self.items: dict[str, dict] = {}
        for _ in range(n_groups):
            new_group(self.items)
        self.answer: dict[str, dict[str, dict]] = {}
        self.prepare()

    def prepare(self) -> None:
        """A fresh answer, as TransferQueue returns new dicts on every call (built untimed)."""
        self.answer = {self.partition_id: {k: dict(t) for k, t in self.items.items()}}

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, dict]]:
        return self.answer

    def kv_clear(self, keys: list[str], partition_id: str) -> None:
        for key in keys:
            self.items.pop(key, None)

    def replay_trainer_step(self, batch_keys: list[str]) -> None:
        self.kv_clear(batch_keys, self.partition_id)
        for _ in range(len({k.split("_", 1)[0] for k in batch_keys})):
            new_group(self.items)
        self.prepare()


def sampler_modules() -> list[Any]:
    """The modules of pyfast_buffer's verl sampler that call TransferQueue as ``tq``: what a stand-in replaces.

    Found among the loaded modules rather than listed, so that a module the sampler gains is not missed.
    """
    import transfer_queue

    from pyfast_buffer.integrations.verl import _sampler  # noqa: F401 - loads every module of the sampler

    prefix = "pyfast_buffer.integrations."
    return [
        m
        for name, m in sorted(sys.modules.items())
        if name.startswith(prefix) and getattr(m, "tq", None) is transfer_queue
    ]


@contextmanager
def transfer_queue_module(modules: list[Any], stand_in: Any) -> Iterator[None]:
    """Points each module's ``tq`` at ``stand_in`` for the duration."""
    saved = [m.tq for m in modules]
    for m in modules:
        m.tq = stand_in
    try:
        yield
    finally:
        for m, tq in zip(modules, saved):
            m.tq = tq


@contextmanager
def running_transfer_queue() -> Iterator[Any]:
    """A local Ray (8 logical CPUs: TransferQueue's placement groups ask for more than 2) and TransferQueue."""
    import ray
    import transfer_queue as tq

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    tq.init()
    try:
        yield tq
    finally:
        tq.close()
        if started:
            ray.shutdown()


def put_groups(tq: Any, partition_id: str, n: int) -> None:
    uids = [uuid.uuid4().hex for _ in range(n)]
    keys = [f"{u}_{s}_0" for u in uids for s in range(SESSIONS)]
    for start in range(0, len(keys), 20_000):
        chunk = keys[start : start + 20_000]
        tq.kv_batch_put(
            keys=chunk, partition_id=partition_id, tags=[{"is_prompt": False, "global_steps": STEP} for _ in chunk]
        )
    tq.kv_batch_put(
        keys=uids,
        partition_id=partition_id,
        tags=[{"is_prompt": True, "status": "finished", "global_steps": STEP} for _ in uids],
    )


def clear_partition(tq: Any, partition_id: str) -> None:
    keys = list((tq.kv_list(partition_id=partition_id) or {}).get(partition_id) or {})
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition_id)


def make_sampler(cls: Any) -> Any:
    return cls(
        trainer_mode="separate_async",
        trainer_config={},
        max_off_policy_threshold=8,
        max_off_policy_strategy="drop",
        sampler_kwargs={"capacity": 1 << 17},
        poll_interval=0.05,
    )


def _row(contender: str, times: list[float], tags: int) -> dict:
    return {
        "case": "verl_sample",
        "contender": contender,
        "capacity": tags,
        "batch": BATCH,
        "median_s": median(times),
        "p99_s": percentile(times, 99),
        "runs": len(times),
    }


def _cpu_times(cls: Any, modules: list[Any], tags: int, repeat: int) -> list[float]:
    stand_in = ListedAnswer("bench", groups(tags))
    rb = make_sampler(cls)
    last: dict[str, list[str]] = {"keys": []}

    def one() -> None:
        batch, _ = rb.sample(global_steps=STEP, partition_id="bench", batch_size=BATCH)
        assert len(batch.keys) == BATCH * SESSIONS, len(batch.keys)
        last["keys"] = batch.keys

    with transfer_queue_module(modules, stand_in):
        return sample(one, repeat, setup=lambda: stand_in.replay_trainer_step(last["keys"]))


def _end_to_end_times(tq: Any, classes: dict[str, Any], tags: int, repeat: int) -> dict[str, list[float]]:
    """``sample`` on the real TransferQueue, the contenders taking turns (the order alternating) on one
    partition kept at size, so the load of a shared machine falls on every contender alike.

    One partition, not one each: verl lists every partition on each poll, so a second large partition
    would be charged to it. A contender sees the groups the other took vanish (a little extra work for
    this sampler, which notices and books them).
    """
    pid = f"bench-{uuid.uuid4().hex}"
    samplers = {name: make_sampler(cls) for name, cls in classes.items() if cls is not None}
    last: list[str] = []
    times: dict[str, list[float]] = {name: [] for name in classes}

    def one(name: str) -> float:
        if name not in samplers:  # the floor: the listing alone, on the same partition, in the same turns
            started = time.perf_counter()
            listed = (tq.kv_list(partition_id=pid) or {}).get(pid) or {}
            took = time.perf_counter() - started
            # the partition holds groups(tags) groups less the last batch taken (its trajectories still listed)
            assert (groups(tags) - BATCH) * (SESSIONS + 1) <= len(listed) <= groups(tags) * (SESSIONS + 1)
            return took
        if last:  # the trainer's step, untimed: clear the batch, write as many fresh groups
            tq.kv_clear(keys=last, partition_id=pid)
        put_groups(tq, pid, BATCH)
        started = time.perf_counter()
        batch, _ = samplers[name].sample(global_steps=STEP, partition_id=pid, batch_size=BATCH)
        took = time.perf_counter() - started
        assert len(batch.keys) == BATCH * SESSIONS, len(batch.keys)
        last[:] = batch.keys
        return took

    quiet = logging.getLogger("pyfast_buffer.verl")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # each turn, this sampler warns that the other's groups vanished
    try:
        put_groups(tq, pid, groups(tags) - BATCH)
        for name in classes:
            one(name)  # warm-up: the first sample reads the whole partition
        order = list(classes)
        for i in range(repeat):
            for name in order if i % 2 == 0 else order[::-1]:
                times[name].append(one(name))
        return times
    finally:
        quiet.setLevel(level)
        clear_partition(tq, pid)


def verl_case(plan: Any, skipped: dict[str, str], verl_src: str = "", sizes: tuple | None = None) -> list[dict]:
    """The rows described in the module docstring, for each size of ``sizes`` (by the plan when None)."""
    try:
        from pyfast_buffer.integrations import verl as ours
    except ImportError as exc:
        skipped["verl"] = f"the verl extra is not installed ({exc}); pip install 'pyfast_buffer[verl]'"
        return []
    verl: Any = None
    if not verl_src:
        skipped["verl (upstream)"] = "no --verl-src PATH given: verl's rows need a verl checkout"
    else:
        try:
            verl = load_verl(verl_src)
        except Exception as exc:
            skipped["verl (upstream)"] = f"could not load verl from {verl_src!r}: {exc!r}"
    if sizes is None:
        sizes = QUICK_SIZES if getattr(plan, "repeat", 15) < 15 else SIZES
    repeat = max(5, min(getattr(plan, "repeat", 15), 9))
    rows: list[dict] = []
    with running_transfer_queue() as tq:
        for tags in sizes:
            if verl is not None:
                rows.append(_row("verl cpu", _cpu_times(verl.ReplayBufferAsync, [verl], tags, repeat), tags))
            rows.append(
                _row("pyfast_buffer cpu", _cpu_times(ours.FastReplayBuffer, sampler_modules(), tags, repeat), tags)
            )
            classes: dict[str, Any] = {"tq round trip": None}
            if verl is not None:
                classes["verl end to end"] = verl.ReplayBufferAsync
            classes["pyfast_buffer end to end"] = ours.FastReplayBuffer
            for name, times in _end_to_end_times(tq, classes, tags, 2 * repeat).items():
                rows.append(_row(name, times, tags))
    add_verl_ratios(rows)
    return rows


def add_verl_ratios(rows: list[dict]) -> None:
    """``x_verl`` on our rows: verl's median / ours, cpu against cpu and end to end against end to end."""
    by = {(r["capacity"], r["contender"]): r for r in rows if r["case"] == "verl_sample"}
    for (tags, contender), r in by.items():
        if contender.startswith("pyfast_buffer"):
            theirs = by.get((tags, contender.replace("pyfast_buffer", "verl")))
            if theirs:
                r["x_verl"] = theirs["median_s"] / r["median_s"]


def summary(rows: list[dict]) -> str:
    """A small table of the verl rows (the shared report prints medians; this adds the ratios to verl)."""
    lines = [f"{'tags':>7}  {'contender':<26}{'median':>10}{'p99':>10}{'x verl':>9}"]
    for r in rows:
        if r["case"] == "verl_sample":
            ratio = f"{r['x_verl']:.2f}x" if "x_verl" in r else ""
            lines.append(
                f"{r['capacity']:>7}  {r['contender']:<26}{r['median_s'] * 1e3:>8.1f}ms"
                f"{r['p99_s'] * 1e3:>8.1f}ms{ratio:>9}"
            )
    return "\n".join(lines)
