"""What the demo shows a reader: progress bars only on a terminal, the signs named, the figure's ledger and
max_age line."""

from __future__ import annotations

import os
import pty

import pytest
from _experiment_helpers import tiny_run

from pyfast_buffer.experiment import plots, progress, report


def test_no_progress_bar_when_output_is_not_a_terminal():
    # pytest captures stdout and stderr, so neither is a terminal here: tqdm must not draw into a log
    assert not progress.on_terminal()
    assert isinstance(progress.bar(10, "arm", enabled=True), progress._NoBar)


def test_a_progress_bar_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm", reason="the demo extra (tqdm) is not installed")
    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr("sys.stdout", terminal)
        monkeypatch.setattr("sys.stderr", terminal)
        assert progress.on_terminal()
        bar = progress.bar(10, "arm", enabled=True)
        assert not isinstance(bar, progress._NoBar)
        bar.close()
        assert isinstance(progress.bar(10, "arm", enabled=False), progress._NoBar)
    os.close(leader)


def test_the_report_names_the_signs_it_checks():
    text = tiny_run().report
    header = next(line for line in text.splitlines() if line.startswith("Signs from the procedure"))
    for i, name in enumerate(report.SIGN_NAMES, 1):
        assert f"({i}) {name}" in header
    for line in text.splitlines():
        if "none of the three signs appears" in line:
            assert "(1) first-use loss falls" in line and "(3) clip fraction stays high" in line


def test_the_ledger_segments_differ_in_colour_and_hatch():
    looks = [(colour, hatch) for _, _, colour, hatch in plots._LEDGER]
    assert len(set(looks)) == len(looks) and len({h for _, h in looks}) == len(looks)


def test_the_age_panel_draws_each_arms_max_age():
    matplotlib = pytest.importorskip("matplotlib", reason="the demo extra (matplotlib) is not installed")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = tiny_run()
    fig, ax = plt.subplots()
    try:
        for summary in result.summaries:
            steps = [r for r in result.records if r["arm"] == summary["arm"] and r["kind"] == "step"]
            plots._max_age_line(ax, steps, "C0")
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert len(dashed) == len(result.summaries)
        for line, summary in zip(dashed, result.summaries):
            assert set(line.get_ydata()) == {summary["max_age"]}
    finally:
        plt.close(fig)
