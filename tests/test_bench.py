"""The benchmark suite runs end to end on a tiny plan (no timing is asserted here: that is benchmarks/' job)."""

import dataclasses
import json

import pytest

from pyfast_buffer.bench import main as bench_main
from pyfast_buffer.bench import ray_read, report
from pyfast_buffer.bench.plan import Plan
from pyfast_buffer.bench.registry import CASES

TINY = Plan(
    capacities=(2_000,),
    batches=(64,),
    stale=(0.0, 0.99),
    repeat=2,
    wake_rounds=4,
    throughput_seconds=0.05,
    memory_capacity=20_000,
    reference_limit=2_000,
)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_case_measures_real_work(case):
    skipped = {}
    rows = CASES[case](TINY, skipped)
    if not rows and case in skipped:  # an optional extra (ray) is missing: the case says which
        pytest.skip(skipped[case])
    assert rows and {r["case"] for r in rows} == {case}
    ours = [r for r in rows if r["contender"] == "pyfast_buffer"]
    assert ours, rows
    for r in rows:
        assert r["runs"] >= 1
        if "median_s" in r:
            assert r["median_s"] > 0
    if case == "take":
        assert all(r["returned_mean"] == 64 for r in ours if r["stale"] == 0.0)
    if case == "memory":
        assert ours[0]["bytes_per_entry"] > 0
    if case == "throughput_2p1c":
        assert all(r["entries_per_s"] > 0 for r in rows)
    if case == "bulk":
        assert any(r["contender"] == "copy (floor)" for r in rows)  # the physical floor is in the table
        report.add_ratios(rows)
        assert all(r["x_floor"] > 0 for r in ours if r["order"].startswith(("put u", "put g", "take")))
    if case == "ray":  # every payload row of ours has Ray's floor measured and its index calls counted
        payload = [r for r in ours if "nodes" in r]
        assert all(r["index_calls_per_payload"] > 0 and r["ray_floor_ms_per_payload"] > 0 for r in payload)
        read = [r for r in rows if r["op"].startswith("ingest read/") and r["contender"] != ray_read.FLOOR]
        assert read and all(r["producers"] == ray_read.PRODUCERS and r["payloads_per_s"] > 0 for r in read)
    if case == "overhead":
        assert {r["order"] for r in ours} == {"put", "take"}
        assert all(set(r["split_s"]) >= {"argument checks", "binding call", "core"} for r in ours)


def test_rays_floor_per_payload_is_its_idle_rate_and_its_calls_spread_over_the_payloads():
    from pyfast_buffer.bench.ray_payloads import markdown, ray_floor

    # 12 ms/s for 4 s and 40 calls of 0.6 ms, over 800 payloads: (0.048 + 0.024) / 800 s
    assert ray_floor(0.012, 0.0006, 40, 4.0, 800) == pytest.approx(9e-5)
    with pytest.raises(ValueError, match="payloads=0"):
        ray_floor(0.012, 0.0006, 40, 4.0, 0)
    row = {
        "payload_bytes": 65536, "producers": 8, "nodes": 1, "contender": "pyfast_buffer", "entries_per_s": 200.0,
        "mb_per_s": 13.1, "actor_cpu_ms_per_payload": 0.2, "actor_cpu_ms_per_payload_less_idle": 0.14,
        "actor_idle_cpu_ms_per_s": 12.0, "ray_floor_ms_per_payload": 0.09, "index_calls_per_payload": 0.05,
        "ray_empty_call_cpu_ms": 0.6, "actor_cpu_ms_per_payload_above_floor": 0.11, "puts_per_index_call": 2.5,
        "writes_per_byte_producer_nodes": 1.0, "writes_per_byte_all_nodes": 1.0, "ray_empty_call_gap_ms": 20.0,
    }  # fmt: skip
    line = markdown([row]).splitlines()[-1]
    assert "| 0.090 ms (0.050 x 0.60 ms, 20 ms apart) | 0.110 ms |" in line
    queue = dict(row, contender="ray Queue (producer refs)", ray_floor_ms_per_payload=None)
    assert "| - | 0.110 ms |" in markdown([queue]).splitlines()[-1]


def test_the_read_table_names_each_size_and_gives_ratios_to_the_queue_but_none_for_the_floor():
    from pyfast_buffer.bench.ray_read import FLOOR, OURS, QUEUE, _row, markdown

    rows = [_row(65536, OURS, 700.0, 1.08, 5), _row(65536, QUEUE, 650.0, 1.0, 5), _row(1 << 20, FLOOR, 4e4, None, 1)]
    lines = markdown(rows).splitlines()
    assert lines[2] == "| 64 KiB | pyfast_buffer | 700 | 5 | 1.08x |"
    assert lines[3].endswith("| 1.00x |") and lines[4] == f"| 1 MiB | {FLOOR} | 40,000 | 1 |  |"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"producers": 0}, "producers=0"),
        ({"sizes": (1000,)}, "sizes="),
        ({"sizes": ()}, "sizes="),
        ({"repeats": 0}, "repeats=0"),
    ],
)
def test_the_read_bench_refuses_no_producers_and_sizes_that_are_not_whole_kib_before_it_needs_ray(
    kwargs, named, monkeypatch
):
    monkeypatch.setattr(ray_read, "_producer_class", lambda: pytest.fail("reached Ray"))  # no Ray in this process
    with pytest.raises(ValueError, match=named):
        ray_read.read_rows(**kwargs)


def test_the_read_table_labels_sizes_from_their_number():
    rows = [ray_read._row(k * 1024, ray_read.OURS, 1.0, None, 1) for k in (64, 1024, 11024, 2048)]
    labels = [line.split(" | ")[0] for line in ray_read.markdown(rows).splitlines()[2:]]
    assert labels == ["| 64 KiB", "| 1 MiB", "| 11024 KiB", "| 2 MiB"]


class _FakeClock:
    """``time`` for the bench module: ``sleep`` moves the clock on, nothing else does."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_empty_calls_are_spaced_and_the_idle_rate_over_their_gaps_is_taken_off(monkeypatch):
    from pyfast_buffer.bench import ray_payloads

    clock = _FakeClock()
    monkeypatch.setattr(ray_payloads, "time", clock)
    spent = [0.0]  # the actor's CPU seconds: 1 ms per call (a CPU reading is a call too), 10 ms/s idle

    def cpu() -> float:
        spent[0] += 1e-3
        return spent[0] + 0.010 * clock.now

    def call() -> None:
        spent[0] += 1e-3

    per_call = ray_payloads.empty_call_cpu(cpu, call, idle=0.010, calls=5, gap_s=0.02)
    assert clock.slept == [0.02] * 4  # between the calls, not before the first
    assert per_call == pytest.approx(1e-3)
    # Without the gaps' idle CPU taken off, the same calls would read 0.8 ms / 6 more each.
    assert ray_payloads.empty_call_cpu(cpu, call, idle=0.0, calls=5, gap_s=0.02) == pytest.approx(1e-3 + 0.0008 / 6)


def test_ratios_and_targets_are_computed_from_the_rows():
    rows = [
        {"case": "put", "capacity": 100_000, "batch": 512, "contender": "pyfast_buffer", "median_s": 1e-5},
        {"case": "put", "capacity": 100_000, "batch": 512, "contender": "reference", "median_s": 1e-3},
        {"case": "put", "capacity": 100_000, "batch": 512, "contender": "cpprb", "median_s": 2e-5},
    ]
    report.add_ratios(rows)
    assert rows[0]["x_reference"] == pytest.approx(100)
    goals = {g["target"]: g for g in report.targets(rows)}
    assert goals["put(512) vs reference"]["met"] is True
    key = "put(512) vs cpprb add (eight fields)"
    assert goals[key]["met"] is False and goals[key]["measured"] == 2
    assert goals["take(512) drop, 0% stale vs reference"]["met"] is None  # not run: says so


def test_cli_writes_table_json_and_says_what_it_skipped(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("pyfast_buffer.bench.plan.Plan.quick", classmethod(lambda cls: dataclasses.replace(TINY)))
    assert bench_main(["--quick", "--cases", "put,evict_stale", "--out", str(tmp_path), "--no-chart"]) == 0
    out = capsys.readouterr().out
    assert "targets:" in out and "pyfast_buffer" in out
    data = json.loads((tmp_path / "bench-results.json").read_text())
    assert data["mode"] == "quick" and data["rows"] and data["environment"]["pyfast_buffer"]
    assert bench_main(["--cases", "nope"]) == 2


def test_perf_guard_names_the_operation_over_budget_and_by_how_much():
    import perf_guard  # benchmarks/perf_guard.py (benchmarks/ is on pytest's pythonpath)

    measured = {"put": {"per_entry": 21.0}, "take": {"per_entry": 10.0}, "new_op": {"per_entry": 1.0}}
    failures = perf_guard.check(measured, {"put": 20.0, "take": 12.0})
    assert len(failures) == 2
    assert failures[0].startswith("put: 21.00 instructions/entry exceeds its budget 20.00 by 1.00 (+5.0%)")
    assert failures[1].startswith("new_op: no budget")
    budgets = __import__("json").loads(perf_guard.BUDGETS.read_text())["instructions_per_entry"]
    assert {"put", "put_grouped8", "take", "take_grouped8", "evict_stale_shuffled", "dispatch_complete"} <= set(budgets)


def test_cli_writes_the_targets_table_into_the_docs_page(tmp_path, monkeypatch):
    monkeypatch.setattr("pyfast_buffer.bench.plan.Plan.quick", classmethod(lambda cls: dataclasses.replace(TINY)))
    page = tmp_path / "performance.md"
    page.write_text(f"# Performance\n\n{report.DOCS_START}\nstale-table-marker\n{report.DOCS_END}\n\nafter\n")
    assert (
        bench_main(["--quick", "--cases", "bulk", "--out", str(tmp_path), "--no-chart", "--update-docs", str(page)])
        == 0
    )
    text = page.read_text()
    assert "stale-table-marker" not in text and text.endswith("after\n")
    assert "| put ungrouped B=65536 vs a copy of 64 B/entry | <= 4x |" in text
    assert "`pyfast-buffer bench --quick --cases bulk`" in text


def test_the_pace_cycle_row_compares_pace_with_drop_and_the_floor():
    rows = CASES["pace_cycle"](TINY, {})
    report.add_ratios(rows)
    orders = {r["order"] for r in rows}
    assert orders == {"pace", "drop", "floor"}
    paced = [r for r in rows if r["order"] == "pace"]
    assert paced and all(r["x_drop"] > 0 and r["x_floor"] > 0 for r in paced)
    assert "the same cycle under drop" in report._cells(paced[0])[3]


def test_the_sources_row_compares_tagged_with_untagged_numpy_and_the_floor():
    rows = CASES["take_sources"](TINY, {})
    report.add_ratios(rows)
    assert {r["order"] for r in rows} == {"tagged", "untagged", "numpy", "floor"}
    tagged = [r for r in rows if r["order"] == "tagged"]
    assert tagged and all(r["x_untagged"] > 0 and r["x_floor"] > 0 and r["x_numpy"] > 0 for r in tagged)
    # The same ring under the four bounds returns a full batch, as the numpy mask does.
    by_order = {r["order"]: r for r in rows}
    assert by_order["tagged"]["returned_mean"] == by_order["numpy"]["returned_mean"] == TINY.batches[0]
    assert "the untagged walk" in report._cells(tagged[0])[3]
