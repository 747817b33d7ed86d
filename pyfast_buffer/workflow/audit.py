"""``pyfast-buffer audit``: reconcile the buffer's log records with the ledger identity.

Step four of the staleness procedure (docs/workflow.md): from the logs alone, check
``sampled_total == retired + dropped_stale + evicted + buffer_left``. The buffer's own
record (``batch.LOG_FORMAT``) carries per-record counts (``dropped_stale``, ``taken``,
``retired``, ``evicted``) and running values (``buffer_left``, ``sampled_total``); other
code may write only some of them, possibly on separate lines. A running counter that goes
back starts a new segment (another run, or a restart without the checkpointed ledger).
``audit(sources)`` is the Python face.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field
from typing import IO, Dict, Iterable, List, Optional, Tuple

from ..batch import AGE_BUCKETS, PROTECTED_ADMISSION_FIELDS
from .log_input import UnreadableLog, open_log
from .output import DATA_FIELDS, bias_lines, data_and_bias, print_output, prompt_lines

COUNT_FIELDS: Tuple[str, ...] = ("dropped_stale", "taken", "retired", "evicted")  # since the previous record: summed
RUNNING_FIELDS = ("buffer_left", "sampled_total")  # running values: the last one counts
FIELDS = COUNT_FIELDS + RUNNING_FIELDS
#: The terms of the ledger identity ``sampled_total == retired + dropped_stale + evicted + buffer_left``.
LEDGER_TERMS = ("retired", "dropped_stale", "evicted", "buffer_left")
# key=N, key: N or "key": N, optionally namespaced ("buffer/taken", "train.buffer.taken"), but not part of a
# longer word ("my_taken=3" is not "taken"). Numbers may be written as floats (8.0, 1.0e1).
_FIELD = re.compile(
    r'(?<![\w/.\-])"?(?:[\w.\-/]*[/.])?('
    + "|".join(FIELDS)
    + r')"?\s*[=:]\s*(-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.])'
)
_AGE = re.compile(r'"?age_hist/([0-9+\-]+)"?\s*[=:]\s*(\d+)')
# The same keys with any whole token as value ("retired= evicted=0": retired is empty); one that _FIELD does not read
# (retired=abc, taken=, buffer_left=64x) is a damaged field. A quoted number ("taken": "8") is neither.
_ANY_VALUE = re.compile(
    r'(?<![\w/.\-])"?(?:[\w.\-/]*[/.])?('
    + "|".join(FIELDS)
    + r')"?\s*[=:](?:\s*("[^"]*"|[^\s,;}\]=:]+)(?=[\s,;}\]]|$)|)'
)
_NUMBER = re.compile(r'"?-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"?')
#: A ``strategy=drop|wait|pace`` token on a record's line (a writer that logs it): it decides the reported strategy.
_STRATEGY = re.compile(r'(?<![\w/.\-])"?strategy"?\s*[=:]\s*"?(drop|wait|pace)\b')
#: The counters strategy="pace" adds to the line (docs/design.md, "pace"), read when present and never needed
#: for the balance: trained_over_age and retired_early count per record (summed, subsets of taken and of retired),
#: the admission counters run.
PACE_COUNT_FIELDS = ("trained_over_age", "retired_early")
PACE_RUNNING_FIELDS = ("admitted", "admission_refused", "admission_waits", *PROTECTED_ADMISSION_FIELDS)
_PACE_FIELD = re.compile(
    r'(?<![\w/.\-])"?(?:[\w.\-/]*[/.])?('
    + "|".join(PACE_COUNT_FIELDS + PACE_RUNNING_FIELDS)
    + r')"?\s*[=:]\s*(\d+)(?![\w.])'
)
#: A gap of about -100% (accounted twice what was sampled) is the sign of records counted twice.
_DOUBLED = (-110.0, -90.0)


def ledger_gap(sampled_total: int, retired: int, dropped_stale: int, evicted: int, buffer_left: int) -> int:
    """Returns ``sampled_total - (retired + dropped_stale + evicted + buffer_left)``: 0 when the ledger balances.

    The one place the identity is written; ``audit`` applies it to log records, ``perturb`` to ledgers.
    """
    return sampled_total - (retired + dropped_stale + evicted + buffer_left)


@dataclass
class Segment:
    """One run of the counters between two restarts (a running counter going back), of one --group."""

    index: int
    first: str  # source:line of its first record
    group: str = ""  # the --group key of its records ("" without --group)
    last: str = ""
    records: int = 0
    sums: Dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNT_FIELDS, 0))
    running: Dict[str, Optional[int]] = field(default_factory=lambda: dict.fromkeys(RUNNING_FIELDS))
    age_hist: Dict[str, int] = field(default_factory=dict)
    pace: Dict[str, int] = field(default_factory=dict)  # trained_over_age summed, the admission counters' last
    pace_went_back: str = ""  # source:line where a running admission counter went back within the segment
    log: List[Tuple[str, Dict[str, int]]] = field(default_factory=list, repr=False)  # (source:line, fields)
    # (source:line, what) of the damaged line it starts at: a record with a field that is not a number (its own
    # first record), or NUL bytes before its first record. The counts across it cannot be checked.
    after_damage: Tuple[str, str] = ("", "")
    logged_strategy: str = ""  # the last strategy=... token on its records ("" when the writer logs none)
    take_dropped: str = ""  # source:line of the first record that took and dropped stale in one call
    # Filled by reconcile():
    first_unbalanced: str = ""  # source:line of the first full record that does not balance from the baseline
    baseline: str = ""  # "run start" (every count from zero) or "first record SOURCE:LINE" (the log starts mid-run)
    gap_from_zero: Optional[int] = None  # the gap counted from zero, shown when the first record is the baseline
    sampled_total: Optional[int] = None  # sampled since the baseline
    accounted: Optional[int] = None
    gap: Optional[int] = None
    gap_percent: Optional[float] = None
    balanced: Optional[bool] = None
    drop_rate: Optional[float] = None
    unreconciled: str = ""  # why gap is None
    unchecked: bool = False  # it starts at a damaged line and holds nothing after its baseline: nothing to compare
    strategy: str = ""  # "drop", "wait", "pace", "drop or wait", or "" (no buffer record: not known)
    strategy_why: str = ""  # what in the log decided it


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
    data: Dict[str, int] = field(default_factory=dict)  # the last value of each DATA_FIELDS field seen
    bias: Dict[str, float] = field(default_factory=dict)  # the last bias record's BIAS_FIELDS
    damaged: List[str] = field(default_factory=list)  # source:line of every damaged line a segment starts at


def parse_record(
    line: str, problems: Optional[List[str]] = None, damaged: Optional[List[str]] = None
) -> Tuple[Dict[str, int], Dict[str, int]]:
    """Returns ({field: value}, {age bucket: count}) of one log line; both empty when it is no record.

    Integer-valued floats (``taken=8.0``, ``sampled_total=1.0e1``) are read as ints. A value that is
    not a whole number (``retired=64.5``, ``retired=abc``, ``retired=``) is left out and added to
    ``damaged`` as ``key=value``; a negative count is kept. Each is described in ``problems``.
    """
    fields: Dict[str, int] = {}
    read_at = set()  # where the keys _FIELD read start: _ANY_VALUE finds them too
    for m in _FIELD.finditer(line):
        key, text = m.group(1), m.group(2)
        read_at.add(m.start(1))
        value = _whole(text)
        if value is None:
            if problems is not None:
                problems.append(f"{key}={text} is not a whole number; left out, the record is damaged")
            if damaged is not None:
                damaged.append(f"{key}={text}")
            continue
        if value < 0 and problems is not None:
            problems.append(f"{key}={value} is negative; counts and totals are >= 0 (kept as written)")
        fields[key] = value
    for m in _ANY_VALUE.finditer(line):
        key, text = m.group(1), m.group(2) or ""
        if m.start(1) in read_at or _NUMBER.fullmatch(text):
            continue  # read above, or a quoted number (never read)
        if problems is not None:
            problems.append(f"{key}={text} is not a number; left out, the record is damaged")
        if damaged is not None:
            damaged.append(f"{key}={text}")
    ages = {b: int(v) for b, v in _AGE.findall(line)} if fields else {}
    return fields, ages


def _whole(text: str) -> Optional[int]:
    try:
        return int(text)
    except ValueError:
        pass
    value = float(text)
    return int(value) if math.isfinite(value) and value.is_integer() else None


def audit(sources: Iterable[str], stdin: Optional[IO[bytes]] = None, group: Optional[str] = None) -> AuditResult:
    """Reads every source in order as one stream and reconciles each segment of it.

    Sources are paths, gzip paths or ``-`` for stdin (``stdin`` replaces sys.stdin in tests).
    ``group`` is a regular expression: records whose lines match it differently (its first group,
    or the whole match) are reconciled apart, e.g. ``^\\[rank\\d+\\]`` for several writers in one log.
    A damaged line (a field that is not a number, NUL bytes) is noted and starts a new segment,
    reconciled from its first intact record: only the counts across the damage are not checked.
    Never raises on bad input: an unreadable source gives exit_code 2 with a note. Raises
    ValueError only for a ``group`` that is not a regular expression.
    """
    try:
        group_re = re.compile(group) if group else None
    except re.error as exc:
        raise ValueError(f"--group {group!r} is not a regular expression ({exc})") from None
    sources = list(sources)
    notes: List[str] = []
    lines: List[Tuple[str, str, int, bool]] = []  # (source:line, text without NUL bytes, NUL bytes, cut off)
    unreadable = False
    for src in sources:
        try:
            text, cut_off = open_log(src, stdin)
        except UnreadableLog as exc:
            notes.append(str(exc))
            unreadable = True
            continue
        before = len(lines)
        for i, t in enumerate(text, 1):
            nul = t.count("\0")
            lines.append((f"{src}:{i}", t.replace("\0", "") if nul else t, nul, cut_off and i == len(text)))
        if not any(parse_record(t)[0] for _, t, _, _ in lines[before:]):
            notes.append(f"{src}: no records (no dropped_stale=, taken=, buffer_left= or sampled_total= fields)")
    problems: List[str] = []
    segments, seen = _segments(lines, group_re, problems)
    # A NUL run before the first record starts no segment: the baseline logic already reads a log that starts mid-run.
    damaged = list(dict.fromkeys(seg.after_damage[0] for seg in segments if seg.after_damage[0]))
    notes += problems[:_MAX_PROBLEM_NOTES]
    if len(problems) > _MAX_PROBLEM_NOTES:
        notes.append(f"... and {len(problems) - _MAX_PROBLEM_NOTES} more values like these")
    absent = [f for f in FIELDS if f not in seen]
    assumptions = _assumptions(absent)
    for seg in segments:
        _reconcile(seg, absent)
    if unreadable or not segments:
        code = 2
        if not segments and not unreadable:
            notes.append(
                "nothing to reconcile: no input holds a record; log the buffer (logger 'pyfast_buffer', INFO) "
                "or write dropped_stale=%d taken=%d buffer_left=%d sampled_total=%d"
            )
    else:
        code = 0 if all(s.balanced or s.unchecked for s in segments) else 1
    data, bias_record = data_and_bias(t for _, t, _, _ in lines)
    return AuditResult(sources, segments, absent, assumptions, notes, code == 0, code, data, bias_record, damaged)


_MAX_PROBLEM_NOTES = 5


def _segments(
    lines: List[Tuple[str, str, int, bool]], group_re: Optional[re.Pattern[str]], problems: List[str]
) -> Tuple[List[Segment], set]:
    segments: List[Segment] = []
    seen: set = set()
    current: Dict[str, Segment] = {}  # group key -> its open segment
    pending: Dict[str, Tuple[str, str]] = {}  # group key -> a NUL-byte line seen since its last record
    for where, text, nul, cut_off in lines:
        if nul:
            # What the NUL bytes replaced is unknown (copytruncate's hole, a zero-filled block after a crash): any
            # writer's records may be gone, so the next record of every open segment starts a new one.
            what = f"{nul} NUL byte(s)" + (" (the whole line)" if not text.strip() else " in the line")
            problems.append(f"{where}: {what} skipped, as copytruncate rotation or a crash leaves them")
            for key in current:
                pending.setdefault(key, (where, what))
        found: List[str] = []
        bad: List[str] = []
        fields, ages = parse_record(text, found, bad)
        # A bad value on a line with no good one is a record only if it names two fields: a lone "evicted: none" in
        # some other message is not the buffer's line.
        bad_keys = list(dict.fromkeys(b.split("=", 1)[0] for b in bad))
        if not fields and len(bad_keys) < 2:
            continue
        problems += [f"{where}: {p}" for p in found]
        key = ""
        if group_re is not None:
            m = group_re.search(text)
            key = "" if m is None else (m.group(1) if m.re.groups else m.group(0)) or ""
        seen.update(fields)
        seen.update(bad_keys)  # the writer logs the field, even where this copy of it is damaged
        seg = current.get(key)
        back = (  # a cut-off line's sampled_total may have lost digits: damage, not a restart
            seg is not None
            and not cut_off
            and "sampled_total" in fields
            and seg.running["sampled_total"] is not None
            and fields["sampled_total"] < seg.running["sampled_total"]
        )
        damage = pending.pop(key, ("", ""))
        if bad:  # this record's own counts are unknown: the chain breaks at it, not at the intact line after it
            damage = (where, ", ".join(bad) + (" is not a whole number" if len(bad) == 1 else " are not whole numbers"))
        elif cut_off:  # the writer had not finished it: a field or a number's last digits may be missing
            damage = (where, "the last line has no line end (cut off mid-write)")
            problems.append(f"{where}: the last line has no line end; its counts may be cut off and are not checked")
        if seg is None or back or damage[0]:
            seg = current[key] = Segment(len(segments) + 1, where, key, after_damage=damage if not back else ("", ""))
            segments.append(seg)
        seg.records += 1
        seg.last = where
        seg.log.append((where, fields))
        for k in COUNT_FIELDS:
            seg.sums[k] += fields.get(k, 0)
        for k in RUNNING_FIELDS:
            if k in fields:
                seg.running[k] = fields[k]
        for b, n in ages.items():
            seg.age_hist[b] = seg.age_hist.get(b, 0) + n
        for k, v in _PACE_FIELD.findall(text):
            if k in PACE_COUNT_FIELDS:
                seg.pace[k] = seg.pace.get(k, 0) + int(v)
            else:
                if int(v) < seg.pace.get(k, 0) and not seg.pace_went_back:
                    seg.pace_went_back = where
                seg.pace[k] = int(v)
        logged = _STRATEGY.search(text)
        if logged:
            seg.logged_strategy = logged.group(1)
        # Only a take under drop drops and trains in one call: evict_stale (any strategy) logs taken=0, and takes
        # under wait and pace never drop.
        if fields.get("taken", 0) > 0 and fields.get("dropped_stale", 0) > 0 and not seg.take_dropped:
            seg.take_dropped = where
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


def _strategy(seg: Segment) -> Tuple[str, str]:
    """The strategy the segment was logged under, and why: the buffer's line names none, so it is read from what
    one strategy alone writes. Pace's admission counters move (a put's groups are admitted too); a take that dropped
    is drop's; a use trained over max_age without admission is wait's (drop never trains one)."""
    if seg.logged_strategy:
        return seg.logged_strategy, "logged on its records (strategy=...)"
    if not any(k in seg.pace for k in PACE_RUNNING_FIELDS):
        return "", ""  # not the buffer's own line: nothing to go by
    if any(seg.pace.get(k, 0) > 0 for k in PACE_RUNNING_FIELDS):
        return "pace", "its admission counters move"
    if seg.take_dropped:
        return "drop", f"a take dropped stale trajectories ({seg.take_dropped}); the admission counters stay 0"
    if seg.pace.get("trained_over_age", 0) > 0:
        return "wait", "uses were trained over max_age and the admission counters stay 0"
    return "drop or wait", (
        "not pace: the admission counters stay 0; the line does not name the strategy, and no take dropped or "
        "trained over max_age, which would tell drop from wait"
    )


def _reconcile(seg: Segment, absent: List[str]) -> None:
    """Fills the segment's baseline, gap, verdict and strategy.

    The baseline is the run's start (every count from zero) unless the first record with a
    sampled_total already carries history: a full record (the buffer's own line) that does not
    balance from zero, or a partial one from which the rest balances while it does not from zero,
    or any record of a segment that starts at a damaged line. Then the log starts mid-run (a rotated
    log, an excerpt, a damaged line) and the identity is checked on the changes after that record:
    delta(sampled_total) == retired + dropped_stale + evicted (summed over the later records) +
    delta(buffer_left).
    """
    seg.strategy, seg.strategy_why = _strategy(seg)
    s = seg.sums
    trained = s["taken"] if "taken" not in absent else s["retired"]
    seg.drop_rate = s["dropped_stale"] / (s["dropped_stale"] + trained) if s["dropped_stale"] + trained else 0.0
    if "sampled_total" in absent or ("taken" in absent and "retired" in absent):
        seg.balanced = False
        seg.unreconciled = (
            "sampled_total is absent from every input"
            if "sampled_total" in absent
            else "taken and retired are absent from every input"
        )
        return
    damaged = bool(seg.after_damage[0])
    retired_key = "taken" if "retired" in absent else "retired"

    def gap(sampled: int, counts: Dict[str, int], left: int) -> int:
        return ledger_gap(sampled, counts[retired_key], counts["dropped_stale"], counts["evicted"], left)

    # The anchor: the first record with a sampled_total, and the counts up to and including it. After a damaged
    # line its buffer_left must be read after it too (the one before is out of date).
    pre = dict.fromkeys(COUNT_FIELDS, 0)
    left_at_anchor: Optional[int] = None
    anchor = -1
    for i, (_where, fields) in enumerate(seg.log):
        for k in COUNT_FIELDS:
            pre[k] += fields.get(k, 0)
        left_at_anchor = fields.get("buffer_left", left_at_anchor)
        if "sampled_total" in fields and (not damaged or left_at_anchor is not None or "buffer_left" in absent):
            anchor = i
            break
    if anchor < 0 or (damaged and anchor == len(seg.log) - 1):
        seg.balanced = False
        seg.unchecked = damaged  # nothing after the damage to compare: not a gap
        seg.unreconciled = (
            "nothing after the damaged line to compare with" if damaged else "this segment has no sampled_total"
        )
        return
    anchor_where, anchor_fields = seg.log[anchor]
    left0 = left_at_anchor or 0
    sampled_last, left_last = seg.running["sampled_total"] or 0, seg.running["buffer_left"] or 0
    after = {k: s[k] - pre[k] for k in COUNT_FIELDS}
    zero_gap = gap(sampled_last, s, left_last)
    anchor_gap = gap(sampled_last - anchor_fields["sampled_total"], after, left_last - left0)
    anchor_carries_history = gap(anchor_fields["sampled_total"], pre, left0) != 0
    full = all(k in anchor_fields for k in FIELDS if k not in absent)
    mid_run = damaged or (anchor_carries_history and (full or (zero_gap != 0 and anchor_gap == 0)))
    if mid_run and anchor == len(seg.log) - 1:
        seg.balanced = False
        seg.baseline = f"first record {anchor_where}"
        seg.unreconciled = (
            f"the log starts mid-run ({anchor_where} already carries history) and has no record "
            "after it; pass a longer log"
        )
        return
    if mid_run:
        seg.baseline, seg.gap_from_zero = f"first record {anchor_where}", None if damaged else zero_gap
        seg.sampled_total, seg.gap = sampled_last - anchor_fields["sampled_total"], anchor_gap
    else:
        seg.baseline = "run start"
        seg.sampled_total, seg.gap = sampled_last, zero_gap
    seg.accounted = seg.sampled_total - seg.gap
    seg.gap_percent = 100.0 * seg.gap / seg.sampled_total if seg.sampled_total else (0.0 if seg.gap == 0 else 100.0)
    seg.balanced = seg.gap == 0
    # The pace counters: uses trained over max_age are a subset of the uses taken; admissions only grow.
    if seg.pace.get("trained_over_age", 0) > trained or seg.pace_went_back:
        seg.balanced = False
    if seg.pace.get("retired_early", 0) > s["retired"]:  # retired below max_uses are a part of retired
        seg.balanced = False
    # A record with every field (the buffer's own line) must balance on its own line, from the baseline.
    counts = dict.fromkeys(COUNT_FIELDS, 0)
    base_sampled = anchor_fields["sampled_total"] if mid_run else 0
    base_left = left0 if mid_run else 0
    for where, fields in seg.log[anchor + 1 if mid_run else 0 :]:
        for k in COUNT_FIELDS:
            counts[k] += fields.get(k, 0)
        if (
            all(k in fields for k in FIELDS)
            and gap(fields["sampled_total"] - base_sampled, counts, fields["buffer_left"] - base_left) != 0
        ):
            seg.first_unbalanced = where
            break


def format_result(result: AuditResult) -> str:
    """Returns the human-readable audit: inputs, assumptions, one block per segment, the verdict."""
    runs = sum(1 for seg in result.segments if not seg.after_damage[0])
    out = [
        f"audit: {len(result.sources)} input(s), {len(result.segments)} segment(s)"
        + (" (a running counter went back: restarts or several runs)" if runs > 1 else "")
        + (f" ({len(result.damaged)} begin at a damaged line)" if result.damaged else "")
    ]
    present = [f for f in FIELDS if f not in result.absent]
    out.append(
        "fields present: " + (", ".join(present) or "none") + "; absent: " + (", ".join(result.absent) or "none")
    )
    if result.segments:
        out += [f"assumed: {a}" for a in result.assumptions]
    for seg in result.segments:
        s = seg.sums
        out.append("")
        group = f" [group {seg.group}]" if seg.group else ""
        out.append(f"segment {seg.index}{group}: {seg.records} records, {seg.first} .. {seg.last}")
        sums = " ".join(f"{k}={'-' if k in result.absent else s[k]}" for k in COUNT_FIELDS)
        out.append(
            f"  sums: {sums}; last: buffer_left={_opt(seg.running['buffer_left'])}"
            f" sampled_total={_opt(seg.running['sampled_total'])}"
        )
        where, what = seg.after_damage
        if where:
            out.append(f"  starts at damaged line {where}: {what}; the counts across it are not checked")
        if seg.baseline.startswith("first record") and where:
            out.append(f"  baseline: {seg.baseline}, the first with intact running values after the damaged line")
        elif seg.baseline.startswith("first record"):
            out.append(
                f"  baseline: {seg.baseline}: it already carries history (the log starts mid-run: rotated or "
                "an excerpt), so only the changes after it are reconciled"
                + (f"; counted from zero the gap would be {seg.gap_from_zero}" if seg.gap_from_zero is not None else "")
            )
        elif seg.baseline:
            out.append("  baseline: run start (every count from zero)")
        if seg.gap is not None:
            since = " since the baseline" if seg.baseline.startswith("first record") else ""
            out.append(
                f"  sampled_total{since} {seg.sampled_total} vs retired + dropped_stale + evicted + buffer_left"
                f"{since} {seg.accounted}: gap {seg.gap} ({seg.gap_percent:.2f}%) -> "
                f"{'balanced' if seg.balanced else 'NOT balanced'}"
            )
            if seg.gap_percent is not None and _DOUBLED[0] <= seg.gap_percent <= _DOUBLED[1]:
                out.append(
                    "  hint: about twice as much accounted as sampled: the same records are probably counted "
                    "twice (several ranks or writers in one log, or a duplicated log handler); audit one "
                    "writer's log, or split them with --group REGEX (e.g. --group '^\\[rank\\d+\\]')"
                )
        else:
            out.append(f"  cannot reconcile: {seg.unreconciled}")
        if seg.first_unbalanced:
            out.append(f"  first record that does not balance on its own line: {seg.first_unbalanced}")
        out.append(f"  drop rate: {seg.drop_rate:.2%} (dropped_stale / (dropped_stale + taken))")
        if "trained_over_age" in seg.pace:
            over, taken = seg.pace["trained_over_age"], s["taken"]
            verdict = "<= taken: ok" if over <= taken else "MORE than taken: the counts do not reconcile"
            out.append(f"  trained over max_age: {over} of {taken} uses ({verdict})")
        if seg.pace.get("retired_early"):
            early, retired = seg.pace["retired_early"], s["retired"]
            verdict = "<= retired: ok" if early <= retired else "MORE than retired: the counts do not reconcile"
            out.append(f"  retired below max_uses (pace, one use a group): {early} of {retired} ({verdict})")
        if seg.strategy:
            out.append(f"  strategy: {seg.strategy} ({seg.strategy_why})")
        # The admission counters are pace's: under drop and wait they stay 0 and say nothing.
        if seg.strategy == "pace" or any(seg.pace.get(k, 0) for k in PACE_RUNNING_FIELDS) or seg.pace_went_back:
            counts = " ".join(f"{k}={seg.pace.get(k, '-')}" for k in PACE_RUNNING_FIELDS)
            went_back = f"; a counter went back at {seg.pace_went_back}" if seg.pace_went_back else ""
            out.append(f"  admission, last: {counts}{went_back}")
        if seg.age_hist:
            total = sum(seg.age_hist.values()) or 1
            order = sorted(seg.age_hist, key=lambda b: AGE_BUCKETS.index(b) if b in AGE_BUCKETS else len(AGE_BUCKETS))
            out.append(
                "  age histogram: "
                + ", ".join(f"{b}: {seg.age_hist[b]} ({seg.age_hist[b] / total:.0%})" for b in order)
            )
    out += prompt_lines(result.data, DATA_FIELDS) + bias_lines(result.bias)
    if result.notes:
        out += [""] + [f"note: {n}" for n in result.notes]
    out.append("")
    if result.exit_code == 2:
        out.append("verdict: unreadable input or no records to reconcile, see the notes (exit 2)")
    elif result.balanced and result.damaged:
        out.append(
            f"verdict: balanced in every segment; the counts across {len(result.damaged)} damaged line(s) are not "
            "checked (see the notes) (exit 0)"
        )
    elif result.balanced:
        out.append("verdict: balanced in every segment (exit 0)")
    else:
        out.append(
            "verdict: NOT balanced; look for a consumption path that bypasses the buffer, or log the absent "
            "fields (exit 1)"
        )
    return "\n".join(out)


def _opt(value: Optional[int]) -> str:
    return "-" if value is None else str(value)


def run(args: argparse.Namespace) -> int:
    try:
        result = audit(args.logs, group=args.group)
    except ValueError as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return 2
    print_output(format_result(result))
    return result.exit_code


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="reconcile dropped_stale/taken/buffer_left/sampled_total records in logs")
    p.add_argument(
        "logs", nargs="+", metavar="LOG", help="log files, .gz logs, or - for stdin; read in order as one stream"
    )
    p.add_argument(
        "--group",
        metavar="REGEX",
        help="reconcile records apart by what this regular expression matches on their line (its first "
        "group, or the whole match), e.g. '^\\[rank\\d+\\]' for several writers in one log",
    )
    p.set_defaults(run=run)
