"""Ratios, targets, the printed table, bench-results.json and the chart."""

from __future__ import annotations

import json
import platform
import time
from typing import Dict, List, Optional, Tuple

KEYS = ("case", "op", "capacity", "batch", "stale", "order")


def _key(r: Dict) -> Tuple:
    return tuple(r.get(k) for k in KEYS)


def add_ratios(rows: List[Dict]) -> None:
    """Adds ``x_reference`` (baseline time / this time) and, for evict_stale, ``x_memcpy`` and ``x_memcpy_ids``
    (this time / a copy of the whole rows, of the ids and steps alone)."""
    by_key: Dict[Tuple, Dict[str, Dict]] = {}
    for r in rows:
        by_key.setdefault(_key(r), {})[r["contender"]] = r
    for r in rows:
        group = by_key[_key(r)]
        if "reference" in group and r["case"] not in ("memory",):
            r["x_reference"] = group["reference"]["median_s"] / r["median_s"]
        if r["case"] == "evict_stale":
            copies = by_key.get(_key({**r, "order": "shuffled"}), {})
            if "memcpy" in copies:
                r["x_memcpy"] = r["median_s"] / copies["memcpy"]["median_s"]
            if "memcpy ids+steps" in copies:
                r["x_memcpy_ids"] = r["median_s"] / copies["memcpy ids+steps"]["median_s"]
        # The physical floor: a copy of 64 bytes per entry, B entries, measured in the same run.
        floor = group.get("copy (floor)")
        if r["case"] == "bulk":
            floor = next((f for f in rows if f["case"] == "bulk" and f["contender"] == "copy (floor)"), None)
        if r["case"] == "pace_cycle":  # the same cycle under drop, and the floor, measured in the same run
            same = {f["order"]: f for f in rows if f["case"] == "pace_cycle" and f.get("batch") == r.get("batch")}
            floor = same.get("floor")
            if "drop" in same and r.get("order") == "pace":
                r["x_drop"] = r["median_s"] / same["drop"]["median_s"]
        if r["case"] == "take_sources":  # tagged vs untagged vs numpy, and the floor, measured in the same run
            same = {f["order"]: f for f in rows if f["case"] == "take_sources" and f.get("batch") == r.get("batch")}
            floor = same.get("floor")
            if r.get("order") == "tagged" and "untagged" in same:
                r["x_untagged"] = r["median_s"] / same["untagged"]["median_s"]
            if r.get("order") in ("tagged", "untagged") and "numpy" in same:
                r["x_numpy"] = same["numpy"]["median_s"] / r["median_s"]
        if (
            floor
            and r["case"] in ("put", "take", "bulk", "pace_cycle", "take_sources")
            and "lap" not in str(r.get("order"))
            and r.get("order") != "construct"
            and floor is not r
        ):
            r["x_floor"] = r["median_s"] / floor["median_s"]


def _find(rows: List[Dict], **match) -> List[Dict]:
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def _speedup(rows: List[Dict], peer: str, **match) -> Optional[float]:
    ours = _find(rows, contender="pyfast_buffer", **match)
    theirs = _find(rows, contender=peer, **match)
    if not ours or not theirs:
        return None
    return min(t["median_s"] / o["median_s"] for o in ours for t in theirs if _key(o) == _key(t))


def targets(rows: List[Dict]) -> List[Dict]:
    """Evaluates issue 3's targets on the rows measured; a target with no rows says why."""
    out = []

    def add(name: str, value: Optional[float], goal: str, ok, unit: str = "", note: str = "") -> None:
        out.append(
            {
                "target": name,
                "goal": goal,
                "measured": value,
                "unit": unit,
                "met": None if value is None else bool(ok(value)),
                "note": note,
            }
        )

    for stale in (0.0, 0.5, 0.99):
        m = dict(case="take", batch=512, capacity=100_000, stale=stale)
        add(
            f"take(512) drop, {stale:.0%} stale vs reference",
            _speedup(rows, "reference", **m),
            ">= 15x",
            lambda v: v >= 15,
            "x",
        )
        add(
            f"take(512) drop, {stale:.0%} stale vs cpprb sample+mask",
            _speedup(rows, "cpprb", **m),
            ">= 3x",
            lambda v: v >= 3,
            "x",
            "one sample call; it returns only the fresh part of 512 random draws",
        )
        add(
            f"take(512) drop, {stale:.0%} stale vs cpprb sampling until 512 fresh",
            _speedup(rows, "cpprb to full", **m),
            ">= 3x",
            lambda v: v >= 3,
            "x",
            "the same work as take",
        )
    m = dict(case="take", batch=512, capacity=100_000, stale=0.0)
    add(
        "take(512) drop, 0% stale vs cpprb 2 fields (idx, step) sample+mask",
        _speedup(rows, "cpprb 2 fields", **m),
        ">= 3x",
        lambda v: v >= 3,
        "x",
        "cpprb as a user would set it up for this job",
    )
    for bound in ("no bound", "max_age 64"):
        add(
            f"TorchRL sample(512) of 65,536, {bound}, vs StalenessAwareSampler",
            _speedup(rows, "StalenessAwareSampler", case="torchrl", op="sample", order=bound),
            ">= 3x",
            lambda v: v >= 3,
            "x",
            "the sampler's own call; TorchRL's gather of the rows is the same for both",
        )
    slower = _speedup(rows, "RandomSampler", case="torchrl", op="extend")
    add(
        "TorchRL rb.extend(512) vs RandomSampler (TorchRL's default)",
        None if slower is None else 1 / slower,
        "<= 1.2x",
        lambda v: v <= 1.2,
        "x",
        "our time / theirs; the write is applied to our core at the next sample (the cycle rows count both)",
    )
    m = dict(case="put", batch=512, capacity=100_000)
    torch_in = _find(rows, contender="pyfast_buffer torch in", **m)
    for peer, label, goal, note in (
        (
            "cpprb 2 fields",
            "cpprb 2 fields (idx, step) add",
            3.5,
            "ids a training loop holds as a CPU torch tensor; cpprb given numpy",
        ),
        ("reference", "reference", 30, "the reference twin (a deque of records) given numpy"),
    ):
        theirs = _find(rows, contender=peer, **m)
        add(
            f"put(512) from torch ids vs {label}",
            theirs[0]["median_s"] / torch_in[0]["median_s"] if torch_in and theirs else None,
            f">= {goal:g}x",
            lambda v, goal=goal: v >= goal,
            "x",
            note,
        )
    add("put(512) vs reference", _speedup(rows, "reference", **m), ">= 30x", lambda v: v >= 30, "x")
    add("put(512) vs cpprb add (eight fields)", _speedup(rows, "cpprb", **m), ">= 3x", lambda v: v >= 3, "x")
    add(
        "put(512) vs cpprb 2 fields (idx, step) add",
        _speedup(rows, "cpprb 2 fields", **m),
        ">= 3x",
        lambda v: v >= 3,
        "x",
        "cpprb as a user would set it up for this job",
    )
    for r in _find(rows, case="bulk", contender="pyfast_buffer"):
        if r.get("order", "").startswith(("put u", "put g", "take")):
            add(
                f"{r['order']} B={r['batch']} vs a copy of 64 B/entry",
                r.get("x_floor"),
                "<= 4x",
                lambda v: v <= 4,
                "x",
                "the physical floor, same run",
            )
    laps = {r["order"]: r for r in _find(rows, case="bulk", contender="pyfast_buffer")}
    if "put first lap" in laps and "put later laps" in laps:
        ratio = laps["put first lap"]["median_s"] / laps["put later laps"]["median_s"]
        add(
            "new ring: first lap of put vs later laps",
            ratio,
            "<= 1.1x",
            lambda v: v <= 1.1,
            "x",
            f"no slower, within 10% noise; construction {laps['construct']['ns_per_entry']:.2f} ns/entry (pre-touch)"
            if "construct" in laps
            else "no slower, within 10% noise",
        )
    for r in _find(rows, case="overhead", contender="pyfast_buffer"):
        add(
            f"Python overhead of a one-entry {r['order']}",
            r["python_overhead_s"] * 1e6,
            "<= 2 us",
            lambda v: v <= 2,
            "us",
            "total - core; split in the table",
        )
    evicts = _find(rows, case="evict_stale", contender="pyfast_buffer", order="shuffled")
    if evicts:
        top = max(evicts, key=lambda r: r["capacity"])
        at_target = top["capacity"] >= 10_000_000
        # Against a copy of whole rows, and (issue 50) of the ids and steps alone, 16 of a row's 64 bytes.
        for copy, key, limit, note in (
            ("memcpy", "x_memcpy", 1.5, ""),
            ("memcpy of ids and steps", "x_memcpy_ids", 2.5, "16 of a row's 64 bytes"),
        ):
            add(
                f"evict_stale shuffled at {top['capacity']:.0e} vs {copy}",
                top.get(key),
                f"<= {limit}x",
                lambda v, limit=limit: v <= limit,
                "x",
                note if at_target else "target is at 1e7; quick run stops lower",
            )
    sorted_rows = _find(rows, case="evict_stale", contender="pyfast_buffer", order="non-decreasing")
    if sorted_rows:
        top = max(sorted_rows, key=lambda r: r["capacity"])
        add(
            f"evict_stale non-decreasing at {top['capacity']:.0e}",
            top["median_s"] * 1e6,
            "< 50 us",
            lambda v: v < 50,
            "us",
        )
    wake = _find(rows, case="wake_latency", contender="pyfast_buffer")
    event = _find(rows, case="wake_latency", contender="threading.Event floor")
    if wake and event:
        add(
            "wait wake-up p50 vs threading.Event floor",
            wake[0]["p50_s"] / event[0]["p50_s"],
            "<= 1.5x",
            lambda v: v <= 1.5,
            "x",
            f"p50 {wake[0]['p50_s'] * 1e6:.0f} us vs {event[0]['p50_s'] * 1e6:.0f} us, same run",
        )
    if wake:
        add("wait wake-up p99", wake[0]["p99_s"] * 1e3, "< 2 ms", lambda v: v < 2, "ms")
    tp = _find(rows, case="throughput_2p1c", contender="pyfast_buffer")
    if tp:
        best = max(tp, key=lambda r: r["entries_per_s"])
        add(
            f"2 producers + 1 consumer (best batch {best['batch']})",
            best["entries_per_s"] / 1e6,
            ">= 10 M/s",
            lambda v: v >= 10,
            "M entries/s",
        )
    mem = _find(rows, case="memory", contender="pyfast_buffer")
    if mem:
        add(
            f"memory per entry at {mem[0]['capacity']:.0e}",
            mem[0]["bytes_per_entry"],
            "<= 64 B",
            lambda v: v <= 64,
            "B",
        )
        add(
            "resident growth over 2,000 takes",
            mem[0]["growth_over_takes_bytes"] / 1e6,
            "no growth with capacity",
            lambda v: v < 16,
            "MB",
            "peak RSS after vs before the takes",
        )
    return out


def _fmt_time(s: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def _cells(r: Dict) -> Tuple[str, str, str, str]:
    """Returns the printable parameters, median, ratio and detail of one row."""
    params = " ".join(f"{k}={r[k]:.0e}" if k == "capacity" else f"{k}={r[k]}" for k in KEYS[1:] if r.get(k) is not None)
    extra = ""
    if "split_s" in r:
        extra = "; ".join(f"{k} {_fmt_time(v)}" for k, v in r["split_s"].items())
        extra += f"; python overhead {_fmt_time(r['python_overhead_s'])}"
    elif "x_floor" in r:
        extra = f"{r['x_floor']:.2f}x the copy floor" + (
            f", returns {r['returned_mean']:.0f}" if "returned_mean" in r else ""
        )
        if "x_drop" in r:
            extra += f", {r['x_drop']:.2f}x the same cycle under drop"
        if "x_untagged" in r:
            extra += f", {r['x_untagged']:.2f}x the untagged walk"
        if "x_numpy" in r:
            extra += f", {r['x_numpy']:.1f}x faster than the numpy mask"
    elif "ns_per_entry" in r:
        extra = f"{r['ns_per_entry']:.2f} ns/entry"
    elif "x_memcpy" in r:
        extra = f"{r['x_memcpy']:.2f}x memcpy"
        if "x_memcpy_ids" in r:
            extra += f", {r['x_memcpy_ids']:.2f}x memcpy of ids+steps"
    elif "p50_s" in r:
        extra = f"p50 {_fmt_time(r['p50_s'])}  p99 {_fmt_time(r['p99_s'])}"
    elif "returned_mean" in r:
        extra = f"returns {r['returned_mean']:.0f}"
    elif "entries_per_s" in r:
        extra = f"{r['entries_per_s'] / 1e6:.2f} M entries/s"
    elif "bytes_per_entry" in r:
        extra = f"{r['bytes_per_entry']:.1f} B/entry, +{r['growth_over_takes_bytes'] / 1e6:.1f} MB over takes"
    median = "" if r["case"] in ("memory", "throughput_2p1c") else _fmt_time(r["median_s"])
    ratio = f"{r['x_reference']:.1f}x" if "x_reference" in r else ""
    return params, median, ratio, extra


def _verdict(g: Dict) -> Tuple[str, str]:
    value = "-" if g["measured"] is None else f"{g['measured']:.3g} {g['unit']}"
    return {True: "MET", False: "MISSED", None: "NOT RUN"}[g["met"]], value


def table(rows: List[Dict], goals: List[Dict], skipped: Dict[str, str]) -> str:
    lines = [f"{'case':<16}{'params':<36}{'contender':<22}{'median':>10}{'x reference':>13}  detail"]
    for r in rows:
        params, median, ratio, extra = _cells(r)
        lines.append(f"{r['case']:<16}{params:<36}{r['contender']:<22}{median:>10}{ratio:>13}  {extra}")
    lines += ["", "targets:"]
    for g in goals:
        verdict, value = _verdict(g)
        note = "  " + g["note"] if g["note"] else ""
        lines.append(f"  [{verdict:>7}] {g['target']}: {value} (goal {g['goal']}){note}")
    lines += [f"  skipped {name}: {reason}" for name, reason in skipped.items()]
    return "\n".join(lines)


def environment() -> Dict:
    import numpy
    import torch

    from .. import __version__

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.uname().machine,
        "python": platform.python_version(),
        "pyfast_buffer": __version__,
        "numpy": numpy.__version__,
        "torch": torch.__version__,
        "cpu_count": __import__("os").cpu_count(),
    }


def write_json(path: str, rows: List[Dict], goals: List[Dict], skipped: Dict[str, str], mode: str) -> None:
    with open(path, "w") as f:
        json.dump(
            {"environment": environment(), "mode": mode, "rows": rows, "targets": goals, "skipped": skipped},
            f,
            indent=1,
        )


def write_chart(path: str, rows: List[Dict]) -> Optional[str]:
    """Writes a PNG of speedups over the reference twin; returns why not if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"chart skipped: matplotlib not importable ({exc}); pip install 'pyfast_buffer[bench]'"
    panels = [
        ("put", lambda r: f"B={r['batch']} C={r['capacity']:.0e}"),
        ("take", lambda r: f"B={r['batch']} stale={r['stale']:.0%} C={r['capacity']:.0e}"),
        ("evict_stale", lambda r: f"{r['order']} C={r['capacity']:.0e}"),
    ]
    panels = [(case, label) for case, label in panels if any(r["case"] == case and "x_reference" in r for r in rows)]
    if not panels:
        return "chart skipped: no case with a reference baseline was run"
    contenders = sorted({r["contender"] for r in rows if r["contender"] != "pyfast_buffer"})
    colors = {name: plt.cm.tab10(i + 1) for i, name in enumerate(contenders)}
    colors["pyfast_buffer"] = plt.cm.tab10(0)  # ours: the same colour in every panel
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 6), squeeze=False)
    for ax, (case, label) in zip(axes[0], panels):
        rs = [r for r in rows if r["case"] == case and "x_reference" in r and r["contender"] != "reference"]
        names = sorted({r["contender"] for r in rs})
        labels = sorted({label(r) for r in rs})
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            values = [
                next((r["x_reference"] for r in rs if r["contender"] == name and label(r) == lab), 0) for lab in labels
            ]
            ax.barh([j + i * width for j in range(len(labels))], values, height=width, label=name, color=colors[name])
        ax.set_yticks([j + 0.4 - width / 2 for j in range(len(labels))])
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_xscale("log")
        ax.axvline(1, color="black", lw=0.8)
        ax.set_title(f"{case}: speedup over the pure-Python twin")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


README_START, README_END = "<!-- latest-run:start -->", "<!-- latest-run:end -->"


def markdown(rows: List[Dict], goals: List[Dict], skipped: Dict[str, str], command: str) -> str:
    """Returns the results of a run as Markdown: environment, targets, then every row."""
    env = environment()
    out = [
        f"Measured {env['date']} on {env['machine']} ({env['cpu_count']} cores), Python {env['python']}, "
        f"torch {env['torch']}, numpy {env['numpy']}, pyfast_buffer {env['pyfast_buffer']}, with "
        f"`{command}`.",
        "",
        "| target | goal | measured | verdict | note |",
        "| --- | --- | --- | --- | --- |",
    ]
    for g in goals:
        verdict, value = _verdict(g)
        out.append(f"| {g['target']} | {g['goal']} | {value} | {verdict} | {g['note']} |")
    out += [
        "",
        "| case | parameters | contender | median | x reference | detail |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    out += [
        "| {} | {} | {} | {} | {} | {} |".format(r["case"], *_cells(r)[:1], r["contender"], *_cells(r)[1:])
        for r in rows
    ]
    out += [""] + [f"Skipped {name}: {reason}" for name, reason in skipped.items()]
    return "\n".join(out)


DOCS_START, DOCS_END = "<!-- performance-table:start -->", "<!-- performance-table:end -->"


def targets_markdown(goals: List[Dict], command: str, when: str) -> str:
    """Returns the targets of a run as a Markdown table, headed by when and how it was measured."""
    out = [
        f"Measured {when} with `{command}`.",
        "",
        "| target | goal | measured | verdict | note |",
        "| --- | --- | --- | --- | --- |",
    ]
    for g in goals:
        verdict, value = _verdict(g)
        out.append(f"| {g['target']} | {g['goal']} | {value} | {verdict} | {g['note']} |")
    return "\n".join(out)


def update_readme(path: str, text: str, start: str = README_START, end: str = README_END) -> None:
    """Replaces the part of ``path`` between the ``start`` and ``end`` markers with ``text``."""
    with open(path) as f:
        doc = f.read()
    if start not in doc or end not in doc:
        raise ValueError(f"{path} lacks the markers {start} and {end}; add them where the results go")
    head, rest = doc.split(start, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(f"{head}{start}\n{text}\n{end}{tail}")
