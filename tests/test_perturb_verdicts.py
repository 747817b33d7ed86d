"""perturb's verdicts follow exactly the conditions they print, and a workload that raises is told apart from a
drop path that never runs (issue 55, item 8)."""

from __future__ import annotations

import textwrap

import pytest
from _workflow_helpers import run_cli

from pyfast_buffer.workflow import perturb

LOOPS = textwrap.dedent(
    """
    def eight_stale(factory):
        # 8 trajectories one step old at the take: max_age=0 drops all 8, max_age=10**9 none.
        buf = factory(capacity=16, strategy="drop")
        buf.put(list(range(8)), 0)
        buf.take(8, 1)


    def stale_in_both(factory):
        # 10 dropped with max_age=0, and 2 that are dropped with max_age=10**9 too (older than 10**9 steps).
        buf = factory(capacity=16, strategy="drop")
        buf.put(list(range(8)), 0)
        buf.take(8, 1)
        buf.put([100, 101], 1)
        buf.take(8, 2 * 10**9)


    def explodes(factory):
        buf = factory(capacity=8, strategy="drop")
        buf.put([1], 0)
        raise ZeroDivisionError("no batch this step\\nsecond line")


    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("str fails")


    class Stop(BaseException):
        pass


    def unprintable(factory):
        factory(capacity=8)
        raise Unprintable()


    def base_exception(factory):
        factory(capacity=8)
        raise Stop("stop here")


    def exits_0(factory):
        factory(capacity=8)
        raise SystemExit(0)


    def exits_msg(factory):
        factory(capacity=8)
        raise SystemExit("giving up")


    def bad_call(factory):
        buf = factory(capacity=8, strategy="drop")
        buf.put([1.5], 0)  # the buffer refuses it: the workload's bug, not a finding about the drop path
    """
)


@pytest.fixture
def loops(tmp_path):
    path = tmp_path / "loops.py"
    path.write_text(LOOPS)
    return str(path)


def test_eight_drops_against_none_meet_both_stated_conditions(capsys, loops):
    code, out, _ = run_cli(capsys, "perturb", "--workload", f"{loops}:eight_stale")
    # 8 >= 10 x 0 and 0 <= 1% of sampled: both conditions hold, so the drop path runs (no unstated minimum).
    assert code == perturb.EXIT_MOVED == 0
    verdict = out.splitlines()[-1]
    assert verdict.startswith("verdict: drop path runs: dropped_stale=8 (100.0% of sampled) with max_age=0, 0 with")
    assert "both hold" in verdict and "(8 vs 10 x 0 = 0)" in verdict and "(0 vs 0.08)" in verdict


def test_a_verdict_that_is_not_clean_names_what_failed(capsys, loops):
    code, out, _ = run_cli(capsys, "perturb", "--workload", f"{loops}:stale_in_both")
    assert code == perturb.EXIT_NOT_CLEAN == 3
    verdict = out.splitlines()[-1]
    assert "drops moved but not cleanly (not 10x and not <= 1% with the large one)" in verdict
    assert "dropped_stale=10 with max_age=0, 2 with max_age=1000000000" in verdict and "(10 vs 10 x 2 = 20)" in verdict


@pytest.mark.parametrize(
    "ds, dl, sampled, code, words",
    [
        (1, 0, 100, 0, "drop path runs"),  # one drop the large max_age does not repeat: the path runs
        (100, 1, 100, 0, "drop path runs"),  # 100 >= 10 x 1 and 1 <= 1% of 100
        (100, 2, 100, 3, "(not <= 1% with the large one)"),  # 10x holds, 2 > 1
        (15, 2, 1000, 3, "(not 10x)"),  # 2 <= 10, 15 < 20
        (3, 5, 1000, 3, "(not 10x)"),  # fewer with the small max_age
    ],
)
def test_the_verdict_is_exactly_the_two_conditions(ds, dl, sampled, code, words):
    small = {"dropped_stale": ds, "sampled_total": sampled, "taken": sampled - ds}
    large = {"dropped_stale": dl, "sampled_total": sampled, "taken": sampled - dl}
    verdict, moved, got = perturb._verdict(small, large, 0, 10**9, ["drop"])
    assert (got, moved) == (code, code == 0) and words in verdict


def test_a_workload_that_raises_is_one_line_and_exit_5(capsys, loops):
    code, out, err = run_cli(capsys, "perturb", "--workload", f"{loops}:explodes")
    assert code == perturb.EXIT_WORKLOAD_FAILED == 5 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("perturb: the workload raised ZeroDivisionError: no batch this step (in its max_age=0 run")
    assert f"at {loops}:" in err and "--traceback" in err


def test_traceback_shows_the_whole_trace_and_keeps_exit_5(capsys, loops):
    code, _, err = run_cli(capsys, "perturb", "--workload", f"{loops}:explodes", "--traceback")
    assert code == 5 and "Traceback (most recent call last)" in err and "ZeroDivisionError" in err


def test_a_bad_call_inside_the_workload_points_at_the_workloads_line(capsys, loops):
    code, _, err = run_cli(capsys, "perturb", "--workload", f"{loops}:bad_call")
    line = next(n for n, text in enumerate(LOOPS.splitlines(), 1) if "buf.put([1.5], 0)" in text)
    assert code == 5 and "TypeError: traj_ids has dtype float64" in err and f"at {loops}:{line})" in err


def test_the_python_face_raises_workload_error_with_the_cause():
    def broken(factory):
        factory(capacity=4)
        raise KeyError("x")

    with pytest.raises(perturb.WorkloadError, match=r"raised KeyError: 'x' \(in its max_age=0 run") as info:
        perturb.perturb(broken)
    assert isinstance(info.value.__cause__, KeyError) and info.value.max_age == 0


@pytest.mark.parametrize(
    "name, words",
    [
        # A broken __str__ must not crash perturb: the type name stands in for the message.
        ("unprintable", "raised Unprintable: <its message could not be printed: str() raised RuntimeError> (in its"),
        # A BaseException that is neither KeyboardInterrupt nor SystemExit is the workload's failure too.
        ("base_exception", "raised Stop: stop here (in its max_age=0 run"),
        # sys.exit(0) would read as exit 0, "drops moved cleanly", with nothing measured; sys.exit("msg") as 1.
        ("exits_0", "raised SystemExit: 0 (in its max_age=0 run"),
        ("exits_msg", "raised SystemExit: giving up (in its max_age=0 run"),
    ],
    ids=["unprintable", "base_exception", "exits_0", "exits_msg"],
)
def test_a_workload_raising_anything_but_ctrl_c_is_one_line_and_exit_5(capsys, loops, name, words):
    code, out, err = run_cli(capsys, "perturb", "--workload", f"{loops}:{name}")
    assert code == perturb.EXIT_WORKLOAD_FAILED == 5 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("perturb: the workload " + words) and f"at {loops}:" in err
    assert ("it exited instead of returning" in err) == name.startswith("exits")
    code, _, err = run_cli(capsys, "perturb", "--workload", f"{loops}:{name}", "--traceback")
    assert code == 5 and "Traceback (most recent call last)" in err


def test_ctrl_c_in_the_workload_still_propagates():
    def interrupted(factory):
        factory(capacity=4)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        perturb.perturb(interrupted)


def test_the_python_face_wraps_system_exit_as_a_workload_error():
    def exits(factory):
        factory(capacity=4)
        raise SystemExit(0)

    with pytest.raises(perturb.WorkloadError, match=r"raised SystemExit: 0 .*it exited instead of returning") as info:
        perturb.perturb(exits)
    assert isinstance(info.value.__cause__, SystemExit)
