"""Writing the records: one JSONL of every record, and one CSV per kind (step, tick, eval)."""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Dict, List, Sequence

KINDS = ("step", "tick", "eval")


def write_jsonl(path: str, records: Sequence[Dict[str, Any]]) -> None:
    """One JSON object per line, in the order the run produced them; no wall-clock fields, so reproducible."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, allow_nan=False) + "\n")


def write_csvs(out_dir: str, records: Sequence[Dict[str, Any]]) -> List[str]:
    """Writes ``steps.csv``, ``ticks.csv``, ``evals.csv``; columns are the union of keys (blank when absent)."""
    paths = []
    for kind in KINDS:
        rows = [r for r in records if r["kind"] == kind]
        columns: List[str] = []
        for r in rows:
            columns.extend(k for k in r if k not in columns)
        path = os.path.join(out_dir, f"{kind}s.csv")
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, restval="")
            writer.writeheader()
            writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
        paths.append(path)
    return paths


def _flat(row: Dict[str, Any]) -> Dict[str, Any]:
    """A summary row with nested values spread into columns: ``ledger/<k>``, ``uses/<k>``, ``<metric>_low`` ..."""
    out: Dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict):
            prefix = "uses" if key == "uses_hist" else key
            out.update({f"{prefix}/{k}": v for k, v in value.items()})
        elif isinstance(value, tuple) and len(value) == 3:  # an aggregate's (mean, low, high)
            out.update({f"{key}_mean": value[0], f"{key}_low": value[1], f"{key}_high": value[2]})
        elif isinstance(value, list):
            out[key] = " ".join(map(str, value))
        else:
            out[key] = value
    return out


def write_summaries(out_dir: str, runs: Sequence[Dict[str, Any]], aggregate: Sequence[Dict[str, Any]]) -> List[str]:
    """Writes ``summary.jsonl`` and ``summary.csv``: one ``kind="run"`` row per (seed, arm), then one
    ``kind="aggregate"`` row per arm (each metric as ``_mean``/``_low``/``_high``, the 95% bootstrap interval)."""
    rows = [{"kind": "run", **_flat(r)} for r in runs] + [{"kind": "aggregate", **_flat(a)} for a in aggregate]
    jsonl, csv_path = os.path.join(out_dir, "summary.jsonl"), os.path.join(out_dir, "summary.csv")
    write_jsonl(jsonl, rows)
    columns: List[str] = []
    for r in rows:
        columns.extend(k for k in r if k not in columns)
    with open(csv_path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    return [jsonl, csv_path]
