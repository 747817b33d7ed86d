"""audit: reconciling committed logs of real buffer runs, partial fields, restarts and bad input."""

import contextlib
import io
import pathlib

from _workflow_helpers import fixture, run_cli

from pyfast_buffer.workflow import audit


def test_two_runs_in_one_log_are_two_balanced_segments(capsys):
    result = audit.audit([fixture("logs", "two_runs.log")])
    assert result.exit_code == 0 and result.absent == []
    assert [s.balanced for s in result.segments] == [True, True]
    first, second = result.segments
    # Fixed numbers of the committed fixture, not the code's own formula.
    assert first.sampled_total == 546 and first.running["buffer_left"] == 0
    assert first.sums == {"dropped_stale": 312, "taken": 208, "retired": 208, "evicted": 26}
    assert 208 + 312 + 26 + 0 == 546 and first.gap == 0 and first.first_unbalanced == ""
    assert second.sampled_total == 362 and second.running["buffer_left"] == 38
    assert second.sums == {"dropped_stale": 120, "taken": 144, "retired": 144, "evicted": 60}
    assert first.baseline == second.baseline == "run start"
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
    _, out, _ = run_cli(capsys, "audit", fixture("logs", "metrics_age_hist.log"))
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
    assert result.exit_code == 1 and seg.baseline == "run start"
    assert seg.sampled_total == 258 and seg.sums["taken"] == 164 and seg.sums["dropped_stale"] == 46
    assert (seg.accounted, seg.gap) == (210, 48) and round(seg.gap_percent, 2) == 18.60
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
        code, _, _ = run_cli(capsys, "audit", source)
        assert code == 2, source
    assert "binary data" in audit.audit([fixture("binary.bin")]).notes[0]


def test_an_unreadable_input_among_good_ones_still_exits_2():
    assert audit.audit([fixture("logs", "two_runs.log"), fixture("binary.bin")]).exit_code == 2


def test_parse_record_ignores_lookalike_fields():
    fields, _ = audit.parse_record('my_taken=5 taken=3 sampled_total: 9 "dropped_stale": 2')
    assert fields == {"taken": 3, "sampled_total": 9, "dropped_stale": 2}


def test_a_log_starting_mid_run_reconciles_from_its_first_record(capsys):
    result = audit.audit([fixture("logs", "midrun.log")])
    first, second = result.segments
    assert result.exit_code == 0
    assert first.baseline == f"first record {fixture('logs', 'midrun.log')}:1"
    # sampled_total goes 204 -> 546; counted from zero the first record's history (186) would be a gap.
    assert (first.running["sampled_total"], first.sampled_total, first.gap, first.gap_from_zero) == (546, 342, 0, 186)
    assert first.first_unbalanced == ""
    assert second.baseline == "run start" and second.sampled_total == 46 and second.gap == 0
    code, out, _ = run_cli(capsys, "audit", fixture("logs", "midrun.log"))
    assert code == 0 and "it already carries history" in out and "baseline: run start" in out


def test_a_mid_run_excerpt_of_one_record_cannot_be_reconciled(tmp_path):
    path = tmp_path / "one.log"
    path.write_text("dropped_stale=0 taken=4 buffer_left=0 sampled_total=6 retired=4 evicted=0\n")
    seg = audit.audit([str(path)]).segments[0]
    assert seg.balanced is False and seg.gap is None and "no record after it" in seg.unreconciled


def test_records_counted_twice_get_a_hint_and_group_splits_them(capsys):
    log = fixture("logs", "two_writers.log")
    code, out, _ = run_cli(capsys, "audit", log)
    assert code == 1 and "gap -546 (-100.00%)" in out and "counted twice" in out and "--group" in out
    result = audit.audit([log], group=r"^\[(rank\d+)\]")
    assert result.exit_code == 0
    assert [(s.group, s.sampled_total, s.gap) for s in result.segments] == [
        ("rank0", 546, 0),
        ("rank1", 546, 0),
        ("rank0", 24, 0),
        ("rank1", 24, 0),
    ]
    code, _, err = run_cli(capsys, "audit", log, "--group", "([")
    assert code == 2 and "not a regular expression" in err


def test_integer_valued_floats_negative_counts_and_fractions():
    result = audit.audit([fixture("logs", "floats.log")])
    seg = result.segments[0]
    assert seg.sums["taken"] == 11 and seg.log[0][1]["sampled_total"] == 10  # taken=8.0, sampled_total=1.0e1
    assert any("dropped_stale=-3 is negative" in n for n in result.notes)
    problems = []
    fields, _ = audit.parse_record("taken=2.5 sampled_total=1e400 buffer_left=3", problems)
    assert fields == {"buffer_left": 3}
    assert len(problems) == 2 and all("not a whole number" in p for p in problems)


def test_namespaced_keys_are_fields_but_longer_names_are_not():
    fields, _ = audit.parse_record('{"buffer/taken": 8, "buffer/dropped_stale": 0, "train.buffer.sampled_total": 8}')
    assert fields == {"taken": 8, "dropped_stale": 0, "sampled_total": 8}
    assert audit.parse_record("buffer/taken=8 my_taken=5 buffer/my_taken=4 taken_total=3")[0] == {"taken": 8}


def test_ledger_gap_is_the_one_identity():
    assert audit.ledger_gap(546, 208, 312, 26, 0) == 0
    assert audit.ledger_gap(258, 164, 46, 0, 0) == 48


def test_a_paced_buffers_log_reconciles_its_pace_counters(tmp_path, caplog, capsys):
    import logging

    import pyfast_buffer as pfb

    caplog.set_level(logging.INFO, logger="pyfast_buffer")
    buf = pfb.StalenessBuffer(64, max_age=1, strategy="pace", prompts_per_step=2)
    for step in range(6):
        prompts = [10 * step + i for i in range(4 if step == 0 else 2)]  # the limit is (1 + 1) * 2 groups
        buf.dispatch(prompts, step)
        with contextlib.suppress(pfb.AdmissionError):
            buf.dispatch([10 * step + 9], step)  # beyond the limit: refused and counted
        buf.complete(prompts, prompts)
        buf.take(2, current_step=step)
    buf.max_age = 0  # the two groups still ready are over age at the next take: trained and counted, not dropped
    buf.take(2, current_step=7)
    log = tmp_path / "paced.log"
    log.write_text("\n".join(r.getMessage() for r in caplog.records if r.name == "pyfast_buffer") + "\n")
    led = buf.ledger()
    result = audit.audit([str(log)])
    seg = result.segments[0]
    assert result.exit_code == 0 and seg.balanced
    assert seg.pace["trained_over_age"] == led["trained_over_age"] > 0
    assert seg.pace["admitted"] == led["admitted"] and seg.pace["admission_refused"] == led["admission_refused"] > 0
    code, out, _ = run_cli(capsys, "audit", str(log))
    assert code == 0 and f"trained over max_age: {led['trained_over_age']} of {led['taken']} uses" in out
    assert f"admission_refused={led['admission_refused']}" in out
    # More uses over max_age than uses taken cannot come from a buffer: the audit says so.
    bad = tmp_path / "bad.log"
    bad.write_text("dropped_stale=0 taken=2 buffer_left=0 sampled_total=2 retired=2 evicted=0 trained_over_age=3\n")
    assert audit.audit([str(bad)]).exit_code == 1
