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

