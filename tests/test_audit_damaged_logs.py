"""audit on imperfect logs (issue 55, item 8): a real log of examples/train_with_producers.py, damaged the way a
rotated or corrupted log is (a field that is not a number, NUL bytes), and logs written under each strategy."""

from __future__ import annotations

import itertools
import logging
import pathlib
import re
import subprocess
import sys

import pytest
from _workflow_helpers import fixture, run_cli

import pyfast_buffer as pfb
from pyfast_buffer.workflow import audit

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def producers_log(tmp_path_factory) -> list:
    """The lines of a real 40-step log of the producers example under drop (40 take records, 2 bias records)."""
    folder = tmp_path_factory.mktemp("producers")
    log = folder / "train.log"
    script = str(ROOT / "examples" / "train_with_producers.py")
    run = subprocess.run(
        [sys.executable, script, "--strategy", "drop", "--steps", "40", "--log", str(log)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = log.read_text().splitlines()
    # The damage below lands on take records: line 12 is one (the bias records follow the 16th and 32nd take).
    assert len(lines) == 42 and " sampled_total=" in lines[11] and " sampled_total=" in lines[12]
    return lines


def _write(tmp_path, lines, name="damaged.log") -> str:
    path = tmp_path / name
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + b"\n")
    return str(path)


def _field(line: str, key: str) -> int:
    return int(re.search(rf"\b{key}=(\d+)", line).group(1))


@pytest.mark.parametrize("bad", ["abc", "64.5", ""])
def test_a_malformed_count_is_damage_on_its_own_line_not_the_next(tmp_path, capsys, producers_log, bad):
    lines = list(producers_log)
    lines[11] = re.sub(r"\bretired=\d+", f"retired={bad}", lines[11])
    path = _write(tmp_path, lines)
    result = audit.audit([path])
    # Line 13 is intact and balances: no record is blamed; line 12 is named, with its field.
    assert [s.first_unbalanced for s in result.segments] == ["", ""]
    before, after = result.segments
    assert before.last == f"{path}:11" and before.balanced and before.baseline == "run start"
    assert after.after_damage == (f"{path}:12", f"retired={bad} is not a whole number")
    # Reconciled again from line 12 itself: its sampled_total and buffer_left are intact.
    assert after.balanced and after.baseline == f"first record {path}:12"
    assert any(n.startswith(f"{path}:12: retired={bad} is not a") for n in result.notes)
    assert result.exit_code == 0 and result.damaged == [f"{path}:12"]
    code, out, _ = run_cli(capsys, "audit", path)
    assert code == 0 and f"starts at damaged line {path}:12: retired={bad}" in out
    assert "does not balance on its own line" not in out and "(1 begin at a damaged line)" in out
    assert "the counts across 1 damaged line(s) are not checked" in out.splitlines()[-1]


def test_a_damaged_running_value_reconciles_again_from_the_next_record(tmp_path, producers_log):
    lines = list(producers_log)
    lines[11] = re.sub(r"\bsampled_total=\d+", "sampled_total=12x", lines[11])
    path = _write(tmp_path, lines)
    result = audit.audit([path])
    after = result.segments[1]
    assert result.exit_code == 0 and after.after_damage[0] == f"{path}:12" and after.first_unbalanced == ""
    assert after.baseline == f"first record {path}:13"


def test_damage_on_the_last_line_leaves_nothing_to_compare_and_fails_nothing(tmp_path, producers_log):
    lines = [line for line in producers_log if " bias " not in line]
    lines[-1] = lines[-1].replace("taken=", "taken=x", 1)
    path = _write(tmp_path, lines)
    result = audit.audit([path])
    assert result.exit_code == 0 and result.segments[-1].unchecked and result.damaged == [f"{path}:40"]


def test_damage_does_not_hide_a_bypass_after_it(tmp_path, producers_log):
    # Five trajectories sampled from line 30 on that no count accounts for: a consumer that bypasses the buffer.
    lines = list(producers_log)
    lines[11] = lines[11].replace("retired=", "retired=abc", 1)
    for i in range(29, 42):
        if "sampled_total=" in lines[i]:
            lines[i] = re.sub(r"sampled_total=(\d+)", lambda m: f"sampled_total={int(m.group(1)) + 5}", lines[i])
    path = _write(tmp_path, lines)
    result = audit.audit([path])
    after = result.segments[1]
    assert result.exit_code == 1 and after.gap == 5 and after.first_unbalanced == f"{path}:30"


def test_a_line_of_nul_bytes_is_skipped_with_a_note(tmp_path, capsys, producers_log):
    lines = [x.encode() for x in producers_log]
    lines[20] = b"\0" * len(lines[20])  # a block zeroed by a crash: the record on line 21 is gone
    path = _write(tmp_path, lines)
    result = audit.audit([path])
    assert result.exit_code == 0 and [s.records for s in result.segments] == [19, 20]
    assert result.segments[1].after_damage == (f"{path}:21", f"{len(lines[20])} NUL byte(s) (the whole line)")
    assert any(n.startswith(f"{path}:21: ") and "NUL byte(s)" in n for n in result.notes)
    code, out, _ = run_cli(capsys, "audit", path)
    assert code == 0 and "binary" not in out and f"starts at damaged line {path}:21" in out


def test_a_copytruncate_hole_before_the_log_is_skipped(tmp_path, producers_log):
    # copytruncate copies the log away and truncates it; the writer goes on at its old offset, so the file starts
    # with that many NUL bytes, then the next record on the same line.
    tail = [x.encode() for x in producers_log[19:]]
    path = _write(tmp_path, [b"\0" * 8192 + tail[0], *tail[1:]])
    result = audit.audit([path])
    (seg,) = result.segments
    assert result.exit_code == 0 and seg.records == 22  # lines 20..42: 22 takes and the bias record on line 34
    assert seg.baseline == f"first record {path}:1"  # the log starts mid-run, as a rotated one does
    assert any(n.startswith(f"{path}:1: 8192 NUL byte(s) in the line skipped") for n in result.notes)
    assert result.damaged == []  # nothing before the first record to lose


def test_truly_binary_inputs_are_still_refused(tmp_path, producers_log):
    utf16 = tmp_path / "utf16.log"
    utf16.write_bytes("\n".join(producers_log).encode("utf-16-le"))
    for source in (fixture("binary.bin"), str(utf16)):
        result = audit.audit([source])
        assert result.exit_code == 2 and "binary data" in result.notes[0], source


def test_the_bias_section_says_when_no_lengths_were_logged(capsys, tmp_path, producers_log):
    path = _write(tmp_path, producers_log, "train.log")
    assert audit.audit([path]).bias  # the example logs bias records, without lengths
    _, out, _ = run_cli(capsys, "audit", path)
    bias = out.split("bias (last record", 1)[1].split("\n\n", 1)[0]
    assert "length: no lengths logged (pass lengths= to complete()" in bias and "nan" not in bias
    assert "nan" not in out


def _taking_log(tmp_path, caplog, strategy: str) -> str:
    """A log of takes under ``strategy`` in which the strategy shows: trajectories one step stale at max_age 0."""
    caplog.set_level(logging.INFO, logger="pyfast_buffer")
    options = {"prompts_per_step": 2, "max_age": 1} if strategy == "pace" else {"max_age": 0}
    buf = pfb.StalenessBuffer(64, strategy=strategy, **options)
    for step in range(1, 6):
        if strategy == "pace":
            buf.dispatch([step], step)
            buf.complete([10 * step, 10 * step + 1], [step, step])
        else:
            buf.put([10 * step, 10 * step + 1], step - 1)  # one step stale: dropped under drop, trained under wait
            buf.put([10 * step + 2], step)
        buf.take(2 if strategy == "pace" else 1, current_step=step)  # pace's group is whole
    log = tmp_path / f"{strategy}.log"
    log.write_text("\n".join(r.getMessage() for r in caplog.records if r.name == "pyfast_buffer") + "\n")
    return str(log)


@pytest.mark.parametrize("strategy", ["drop", "wait", "pace"])
def test_the_strategy_reported_is_the_one_the_log_was_written_under(tmp_path, caplog, capsys, strategy):
    path = _taking_log(tmp_path, caplog, strategy)
    result = audit.audit([path])
    assert result.exit_code == 0 and result.segments[0].strategy == strategy
    _, out, _ = run_cli(capsys, "audit", path)
    assert f"  strategy: {strategy} (" in out
    assert ("admission, last:" in out) == (strategy == "pace") and "strategy=pace" not in out


def test_a_log_that_cannot_tell_drop_from_wait_says_so(capsys, tmp_path, producers_log):
    # Written under drop; the records before its first drop (a loaded machine may drop early, as CI's once did
    # at some step of the 40) are a log in which nothing was dropped, which wait could have written as well.
    nothing_dropped = lambda line: " sampled_total=" not in line or _field(line, "dropped_stale") == 0  # noqa: E731
    quiet = list(itertools.takewhile(nothing_dropped, producers_log))
    assert sum(" sampled_total=" in line for line in quiet) >= 2, "the producers example dropped at its first takes"
    path = _write(tmp_path, quiet, "train.log")
    seg = audit.audit([path]).segments[0]
    assert seg.strategy == "drop or wait" and "not pace" in seg.strategy_why
    _, out, _ = run_cli(capsys, "audit", path)
    assert "pace" not in out.split("strategy: ", 1)[1].split("(", 1)[0] and "admission, last:" not in out


def test_a_logged_strategy_token_decides(tmp_path, producers_log):
    path = _write(tmp_path, [line + " strategy=wait" for line in producers_log])
    assert audit.audit([path]).segments[0].strategy == "wait"


def test_a_lone_malformed_value_in_another_message_is_no_record(tmp_path):
    path = tmp_path / "mixed.log"
    path.write_text(
        "dropped_stale=0 taken=4 buffer_left=0 sampled_total=4 retired=4 evicted=0\n"
        "trainer: evicted: none this step\n"
        "dropped_stale=0 taken=4 buffer_left=0 sampled_total=8 retired=4 evicted=0\n"
    )
    result = audit.audit([str(path)])
    assert result.exit_code == 0 and result.damaged == [] and result.segments[0].records == 2


@pytest.mark.parametrize("cut", [r"\btaken=\d", r"\bsampled_total=\d"])
def test_a_last_line_cut_off_mid_write_is_damage_not_a_gap(tmp_path, producers_log, cut):
    """A log still being written, or whose writer died mid-line, ends without a line end; its last record may lack
    fields or a number's last digits. It is named and left unchecked, not read as counts that do not balance."""
    lines = list(producers_log)
    last = max(i for i, line in enumerate(lines) if " sampled_total=" in line)
    kept = [*lines[:last], lines[last][: re.search(cut, lines[last]).end()]]
    path = tmp_path / "cut.log"
    path.write_bytes("\n".join(kept).encode())  # no line end after the last line
    result = audit.audit([str(path)])
    assert result.exit_code == 0 and result.damaged == [f"{path}:{last + 1}"], result.notes
    assert result.segments[0].balanced and result.segments[-1].after_damage[1].startswith("the last line has no")
    intact = tmp_path / "intact.log"
    intact.write_bytes(("\n".join(lines[: last + 1]) + "\n").encode())
    assert audit.audit([str(intact)]).damaged == []  # a complete last line is a record like any other
