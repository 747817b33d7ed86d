"""audit: reconciling committed logs of real buffer runs, partial fields, restarts and bad input."""

import io
import pathlib

from _workflow_helpers import fixture, run_cli
from pyfast_buffer import audit


def test_two_runs_in_one_log_are_two_balanced_segments(capsys):
    result = audit.audit([fixture("logs", "two_runs.log")])
    assert result.exit_code == 0 and result.absent == []
    assert [s.balanced for s in result.segments] == [True, True]
    first = result.segments[0]
    assert first.sampled_total == first.sums["retired"] + first.sums["dropped_stale"] + first.sums["evicted"] \
        + first.running["buffer_left"]
    assert first.sums["evicted"] > 0 and first.sums["dropped_stale"] > 0 and first.first_unbalanced == ""
    code, out, _ = run_cli(capsys, "audit", fixture("logs", "two_runs.log"))
    assert code == 0 and "2 segment(s)" in out and "gap 0 (0.00%)" in out and "drop rate" in out


def test_gzip_log_with_restarts(capsys):
    code, out, _ = run_cli(capsys, "audit", fixture("logs", "restarts.log.gz"))
    assert code == 0 and "3 segment(s)" in out


def test_stdin_is_read_for_dash():
    data = pathlib.Path(fixture("logs", "two_runs.log")).read_bytes()
    result = audit.audit(["-"], stdin=io.BytesIO(data))
    assert result.exit_code == 0 and len(result.segments) == 2


def test_age_histogram_is_summed_when_logged(capsys):
    result = audit.audit([fixture("logs", "metrics_age_hist.log")])
    seg = result.segments[0]
    assert result.exit_code == 0 and sum(seg.age_hist.values()) == seg.sums["taken"]
    code, out, _ = run_cli(capsys, "audit", fixture("logs", "metrics_age_hist.log"))
    assert "age histogram: 0:" in out


def test_seed_style_partial_fields_balance_under_stated_assumptions():
    result = audit.audit([fixture("logs", "seed_style.log")])
    assert result.exit_code == 0
    assert result.absent == ["retired", "evicted"]
    assert any("retired := taken" in a for a in result.assumptions)
    assert any("evicted := 0" in a for a in result.assumptions)


def test_a_bypassed_consumer_never_balances(capsys):
    result = audit.audit([fixture("logs", "bypass_never_balances.log")])
    seg = result.segments[0]
    assert result.exit_code == 1 and seg.gap > 0
    assert seg.gap_percent == 100.0 * seg.gap / seg.sampled_total
    code, out, _ = run_cli(capsys, "audit", fixture("logs", "bypass_never_balances.log"))
    assert code == 1 and "NOT balanced" in out and f"gap {seg.gap}" in out


def test_a_tampered_full_record_points_at_its_line(tmp_path):
    lines = pathlib.Path(fixture("logs", "two_runs.log")).read_text().splitlines()
    lines[4] = lines[4].replace("dropped_stale=", "dropped_stale=1")  # 0 -> 10, say
    path = tmp_path / "tampered.log"
    path.write_text("\n".join(lines) + "\n")
    result = audit.audit([str(path)])
    assert result.exit_code == 1 and result.segments[0].first_unbalanced == f"{path}:5"


def test_missing_sampled_total_cannot_be_shown_balanced(tmp_path):
    path = tmp_path / "trainer_only.log"
    path.write_text("dropped_stale=1 taken=8 buffer_left=3\ndropped_stale=0 taken=8 buffer_left=1\n")
    result = audit.audit([str(path)])
    assert result.exit_code == 1 and "sampled_total" in result.absent
    assert result.segments[0].drop_rate == 1 / 17


def test_empty_binary_and_missing_inputs_exit_2(capsys):
    for source in (fixture("logs", "empty.log"), fixture("binary.bin"), fixture("logs", "no_such.log")):
        code, out, _ = run_cli(capsys, "audit", source)
        assert code == 2, source
    assert "binary data" in audit.audit([fixture("binary.bin")]).notes[0]


def test_an_unreadable_input_among_good_ones_still_exits_2():
    assert audit.audit([fixture("logs", "two_runs.log"), fixture("binary.bin")]).exit_code == 2


def test_parse_record_ignores_lookalike_fields():
    fields, _ = audit.parse_record("my_taken=5 taken=3 sampled_total: 9 \"dropped_stale\": 2")
    assert fields == {"taken": 3, "sampled_total": 9, "dropped_stale": 2}
