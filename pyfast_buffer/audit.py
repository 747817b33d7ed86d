"""``pyfast-buffer audit``: reconcile the buffer's log records with the ledger identity.

Step four of the staleness procedure (``seeds/000``): from the logs alone, check
``sampled_total == retired + dropped_stale + evicted + buffer_left``. The buffer's own
record (``batch.LOG_FORMAT``) carries per-record counts (``dropped_stale``, ``taken``,
``retired``, ``evicted``) and running values (``buffer_left``, ``sampled_total``); other
code may write only some of them, possibly on separate lines. A running counter that goes
back starts a new segment (another run, or a restart without the checkpointed ledger).
``audit(sources)`` is the Python face.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
from dataclasses import dataclass, field
from typing import IO, Dict, Iterable, List, Optional, Tuple

from .batch import AGE_BUCKETS

COUNT_FIELDS = ("dropped_stale", "taken", "retired", "evicted")  # since the previous record: summed
RUNNING_FIELDS = ("buffer_left", "sampled_total")  # running values: the last one counts
FIELDS = COUNT_FIELDS + RUNNING_FIELDS
# key=N, key: N or "key": N, not preceded by a word character (so "my_taken=3" is not "taken").
_FIELD = re.compile(r'(?<![\w/])"?(' + "|".join(FIELDS) + r')"?\s*[=:]\s*(-?\d+)')
_AGE = re.compile(r'"?age_hist/([0-9+\-]+)"?\s*[=:]\s*(\d+)')


class UnreadableLog(Exception):
    """An input that is not a readable text log; the message names it and says why."""


@dataclass
class Segment:
    """One run of the counters between two restarts (a running counter going back)."""

    index: int
    first: str  # source:line of its first record
    last: str = ""
    records: int = 0
    sums: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNT_FIELDS, 0))
    running: Dict[str, Optional[int]] = field(default_factory=lambda: dict.fromkeys(RUNNING_FIELDS))
    age_hist: Dict[str, int] = field(default_factory=dict)
    first_unbalanced: str = ""  # source:line of the first full record that does not balance
    # Filled by reconcile():
    sampled_total: Optional[int] = None
    accounted: Optional[int] = None
    gap: Optional[int] = None
    gap_percent: Optional[float] = None
    balanced: Optional[bool] = None
    drop_rate: Optional[float] = None


@dataclass
class AuditResult:
    """The reconciliation of a set of logs: segments, absent fields, assumptions, verdict, exit code."""

    sources: List[str]
    segments: List[Segment]
    absent: List[str]
    assumptions: List[str]
    notes: List[str]
    balanced: bool
    exit_code: int  # 0 balanced, 1 not (or cannot be shown), 2 unreadable input / no records


def open_log(source: str, stdin: Optional[IO[bytes]] = None) -> List[str]:
    """Returns the lines of a log file, a gzip file (by its magic bytes) or ``-`` (stdin).

    Raises UnreadableLog naming the source and the reason.
    """
    try:
        if source == "-":
            raw = (stdin or sys.stdin.buffer).read()
        else:
            with open(source, "rb") as f:
                raw = f.read()
    except OSError as exc:
        raise UnreadableLog(f"{source}: cannot open ({exc.strerror or exc}); pass a log file, a .gz log or -") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise UnreadableLog(f"{source}: broken gzip ({exc}); decompress it or pass the plain log") from None
    if b"\0" in raw[:65536]:
        raise UnreadableLog(f"{source}: binary data (NUL bytes), not a text log; pass the training log")
    return raw.decode("utf-8", errors="replace").splitlines()


def parse_record(line: str) -> Tuple[Dict[str, int], Dict[str, int]]:
    """Returns ({field: value}, {age bucket: count}) of one log line; both empty when it is no record."""
    fields = {k: int(v) for k, v in _FIELD.findall(line)}
    ages = {b: int(v) for b, v in _AGE.findall(line)} if fields else {}
    return fields, ages


def audit(sources: Iterable[str], stdin: Optional[IO[bytes]] = None) -> AuditResult:
    """Reads every source in order as one stream and reconciles each segment of it.

    Sources are paths, gzip paths or ``-`` for stdin (``stdin`` replaces sys.stdin in tests).
    Never raises on bad input: an unreadable source gives exit_code 2 with a note.
    """
    sources = list(sources)
    notes: List[str] = []
    lines: List[Tuple[str, str]] = []  # (source:line, text)
    unreadable = False
    for src in sources:
        try:
            text = open_log(src, stdin)
        except UnreadableLog as exc:
            notes.append(str(exc))
            unreadable = True
            continue
        before = len(lines)
        lines += [(f"{src}:{i}", t) for i, t in enumerate(text, 1)]
        if not any(parse_record(t)[0] for _, t in lines[before:]):
            notes.append(f"{src}: no records (no dropped_stale=, taken=, buffer_left= or sampled_total= fields)")
    segments, seen = _segments(lines)
    absent = [f for f in FIELDS if f not in seen]
    assumptions = _assumptions(absent)
    for seg in segments:
        _reconcile(seg, absent)
    if unreadable or not segments:
        code = 2
        if not segments and not unreadable:
            notes.append("nothing to reconcile: no input holds a record; log the buffer (logger 'pyfast_buffer', INFO) "
                         "or write dropped_stale=%d taken=%d buffer_left=%d sampled_total=%d")
    else:
        code = 0 if all(s.balanced for s in segments) else 1
    return AuditResult(sources, segments, absent, assumptions, notes, code == 0, code)


def _segments(lines: List[Tuple[str, str]]) -> Tuple[List[Segment], set]:
    segments: List[Segment] = []
    seen: set = set()
    seg: Optional[Segment] = None
    for where, text in lines:
        fields, ages = parse_record(text)
        if not fields:
            continue
        seen.update(fields)
        back = seg is not None and "sampled_total" in fields and seg.running["sampled_total"] is not None \
            and fields["sampled_total"] < seg.running["sampled_total"]
        if seg is None or back:
            seg = Segment(len(segments) + 1, where)
            segments.append(seg)
        seg.records += 1
        seg.last = where
        for k in COUNT_FIELDS:
            seg.sums[k] += fields.get(k, 0)
        for k in RUNNING_FIELDS:
            if k in fields:
                seg.running[k] = fields[k]
        for b, n in ages.items():
            seg.age_hist[b] = seg.age_hist.get(b, 0) + n
        # A record with every field (the buffer's own line) must balance on its own line.
        if not seg.first_unbalanced and all(k in fields for k in FIELDS) and _gap(seg.sums, seg.running, []) != 0:
            seg.first_unbalanced = where
    return segments, seen


def _assumptions(absent: List[str]) -> List[str]:
    out = []
    if "retired" in absent and "taken" not in absent:
        out.append("retired absent: retired := taken (each trajectory trained on once, max_uses=1)")
    if "dropped_stale" in absent:
        out.append("dropped_stale absent: dropped_stale := 0 (no staleness drops logged)")
    if "evicted" in absent:
        out.append("evicted absent: evicted := 0 (no overflow evictions logged)")
    if "buffer_left" in absent:
        out.append("buffer_left absent: buffer_left := 0 (buffer assumed empty at the last record)")
    if "sampled_total" in absent:
        out.append("sampled_total absent: cannot reconcile (log the producer's running total) and cannot see restarts")
    if "taken" in absent and "retired" in absent:
        out.append("taken and retired absent: cannot reconcile (log what the trainer consumed)")
    return out


def _gap(sums: Dict[str, int], running: Dict[str, Optional[int]], absent: List[str]) -> Optional[int]:
    if running["sampled_total"] is None:
        return None
    retired = sums["taken"] if "retired" in absent else sums["retired"]
    return running["sampled_total"] - (retired + sums["dropped_stale"] + sums["evicted"] + (running["buffer_left"] or 0))


def _reconcile(seg: Segment, absent: List[str]) -> None:
    s = seg.sums
    trained = s["taken"] if "taken" not in absent else s["retired"]
    seg.drop_rate = s["dropped_stale"] / (s["dropped_stale"] + trained) if s["dropped_stale"] + trained else 0.0
    if "sampled_total" in absent or ("taken" in absent and "retired" in absent):
        seg.balanced = False
        return
    seg.gap = _gap(s, seg.running, absent)
    seg.sampled_total = seg.running["sampled_total"]
    if seg.gap is None:  # this segment never logged sampled_total (only other segments did)
        seg.balanced = False
        return
    seg.accounted = seg.sampled_total - seg.gap
    seg.gap_percent = 100.0 * seg.gap / seg.sampled_total if seg.sampled_total else (0.0 if seg.gap == 0 else 100.0)
    seg.balanced = seg.gap == 0


def format_result(result: AuditResult) -> str:
    """Returns the human-readable audit: inputs, assumptions, one block per segment, the verdict."""
    out = [f"audit: {len(result.sources)} input(s), {len(result.segments)} segment(s)"
           + (" (a running counter went back: restarts or several runs)" if len(result.segments) > 1 else "")]
    present = [f for f in FIELDS if f not in result.absent]
    out.append("fields present: " + (", ".join(present) or "none") + "; absent: " + (", ".join(result.absent) or "none"))
    if result.segments:
        out += [f"assumed: {a}" for a in result.assumptions]
    for seg in result.segments:
        s = seg.sums
        out.append("")
        out.append(f"segment {seg.index}: {seg.records} records, {seg.first} .. {seg.last}")
        sums = " ".join(f"{k}={'-' if k in result.absent else s[k]}" for k in COUNT_FIELDS)
        out.append(f"  sums: {sums}; last: buffer_left={_opt(seg.running['buffer_left'])}"
                   f" sampled_total={_opt(seg.running['sampled_total'])}")
        if seg.gap is not None:
            out.append(f"  sampled_total {seg.sampled_total} vs retired + dropped_stale + evicted + buffer_left {seg.accounted}:"
                       f" gap {seg.gap} ({seg.gap_percent:.2f}%) -> {'balanced' if seg.balanced else 'NOT balanced'}")
        else:
            out.append("  cannot reconcile: " + ("this segment has no sampled_total" if "sampled_total" not in result.absent
                                                   else "sampled_total is absent from every input"))
        if seg.first_unbalanced:
            out.append(f"  first record that does not balance on its own line: {seg.first_unbalanced}")
        out.append(f"  drop rate: {seg.drop_rate:.2%} (dropped_stale / (dropped_stale + taken))")
        if seg.age_hist:
            total = sum(seg.age_hist.values()) or 1
            order = sorted(seg.age_hist, key=lambda b: AGE_BUCKETS.index(b) if b in AGE_BUCKETS else len(AGE_BUCKETS))
            out.append("  age histogram: " + ", ".join(f"{b}: {seg.age_hist[b]} ({seg.age_hist[b] / total:.0%})" for b in order))
    if result.notes:
        out += [""] + [f"note: {n}" for n in result.notes]
    out.append("")
    if result.exit_code == 2:
        out.append("verdict: unreadable input or no records to reconcile, see the notes (exit 2)")
    elif result.balanced:
        out.append("verdict: balanced in every segment (exit 0)")
    else:
        out.append("verdict: NOT balanced; look for a consumption path that bypasses the buffer, or log the absent "
                   "fields (exit 1)")
    return "\n".join(out)


def _opt(value: Optional[int]) -> str:
    return "-" if value is None else str(value)


def run(args: argparse.Namespace) -> int:
    result = audit(args.logs)
    print(format_result(result))
    return result.exit_code


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="reconcile dropped_stale/taken/buffer_left/sampled_total records in logs")
    p.add_argument("logs", nargs="+", metavar="LOG", help="log files, .gz logs, or - for stdin; read in order as one stream")
    p.set_defaults(run=run)
