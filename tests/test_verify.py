"""perturb: a tiny and a huge max_age on the built-in simulation and on user workloads."""

import json

import pytest
from _workflow_helpers import fixture, run_cli

from pyfast_buffer import ReferenceBuffer
from pyfast_buffer.workflow import perturb

LOOPS = fixture("workloads", "user_loops.py")


def test_simulated_workload_moves_drops():
    result = perturb.perturb(perturb.simulated_workload(16, 16, 128, parameter_sync_step=2, steps=60))
    assert result.exit_code == 0 and result.moved
    assert result.small["dropped_stale"] == result.small["sampled_total"] > 0  # every age is >= 1
    assert result.large["dropped_stale"] == 0
    assert "drop path runs" in result.verdict


def test_reference_buffer_gives_the_same_ledgers():
    work = perturb.simulated_workload(8, 8, 64, steps=40, seed=3)
    native, ref = perturb.perturb(work), perturb.perturb(work, buffer_class=ReferenceBuffer)
    assert (native.small, native.large) == (ref.small, ref.large)


def test_cli_prints_both_ledgers_side_by_side(capsys):
    code, out, _ = run_cli(capsys, "perturb", "--produced", 8, "--consumed", 8, "--capacity", 64, "--steps", 40)
    assert code == 0
    assert "max_age=0" in out and "max_age=1000000000" in out and "verdict: drop path runs" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line and not line.startswith("perturb")}
    assert rows["balanced"] == ["True", "True"]  # both ledgers balance
    # The seeded simulation's ledgers, as fixed numbers: every trajectory dropped, then none.
    assert rows["sampled_total"] == ["302", "302"] and rows["dropped_stale"] == ["302", "0"]
    assert rows["retired"] == ["0", "297"] and rows["buffer_left"] == ["0", "5"] and rows["evicted"] == ["0", "0"]


def test_rates_from_rhythm_json(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "rhythm", fixture("rhythm", "trl_grpo.yaml"), "--json")
    path = tmp_path / "rhythm.json"
    path.write_text(out)
    assert perturb.rates_from_rhythm(str(path)) == {
        "produced_per_step": 16,
        "consumed_per_step": 16,
        "capacity": 64,
        "parameter_sync_step": 1,
    }
    code, out, _ = run_cli(capsys, "perturb", "--rhythm", path, "--steps", 30)
    assert code == 0 and "capacity 64" in out


def test_rhythm_without_rates_is_a_usage_error(capsys, tmp_path):
    path = tmp_path / "rhythm.json"
    path.write_text(json.dumps({"rhythm": {"capacity": 4096}}))
    code, _, err = run_cli(capsys, "perturb", "--rhythm", path)
    assert code == 2 and "missing produced_per_step" in err


@pytest.mark.parametrize(
    "name, code, words",
    [
        ("takes_from_buffer", 0, "drop path runs"),
        ("bypasses_buffer", 1, "drop code is never called"),
        ("waits", 1, "strategy 'wait' never drops"),
    ],
)
def test_user_workloads(capsys, name, code, words):
    got, out, _ = run_cli(capsys, "perturb", "--workload", f"{LOOPS}:{name}")
    assert got == code and words in out


def test_bad_workloads_are_usage_errors(capsys):
    for spec, words in (
        (f"{LOOPS}:never_builds", "never called the buffer factory"),
        (f"{LOOPS}:no_such", "has no function"),
        ("no_such_module_xyz:run", "cannot import"),
        ("no_colon", "not module:function"),
    ):
        code, _, err = run_cli(capsys, "perturb", "--workload", spec)
        assert code == 2 and words in err, spec


def test_perturb_checks_its_ages():
    with pytest.raises(ValueError, match="small < large"):
        perturb.perturb(perturb.simulated_workload(1, 1, 4), small_max_age=5, large_max_age=5)


def test_fresh_trajectories_make_the_check_inconclusive(capsys):
    code, out, _ = run_cli(capsys, "perturb", "--workload", f"{LOOPS}:fresh")
    assert code == perturb.EXIT_INCONCLUSIVE == 4
    assert "inconclusive: taken=320 with max_age=0" in out and "age 0" in out
    code, out, _ = run_cli(capsys, "perturb", "--workload", f"{LOOPS}:fresh", "--small", 3)
    assert code == 4 and "--small 2 or lower" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (("--large", 99999999999999999999999), "need 0 <= small < large <= 9223372036854775807"),
        (("--small", 5, "--large", 5), "need 0 <= small < large"),
        (("--capacity", 10000000000000), "above the buffer's largest, 1099511627776"),
        (("--produced", 10**6, "--steps", 10**6), "too large to simulate"),
    ],
)
def test_out_of_range_numbers_are_usage_errors(capsys, argv, words):
    code, out, err = run_cli(capsys, "perturb", *argv)
    assert code == 2 and words in err and out == ""


def test_a_workload_with_a_syntax_error_is_a_usage_error(capsys, tmp_path):
    path = tmp_path / "syn.py"
    path.write_text("def f(factory) :: nope\n")
    code, _, err = run_cli(capsys, "perturb", "--workload", f"{path}:f")
    assert code == 2 and "SyntaxError" in err


@pytest.mark.parametrize(
    "content, words",
    [
        ({"rhythm": []}, 'no "rhythm" object'),
        ([1, 2], 'no "rhythm" object'),
        ({"rhythm": {"produced_per_step": "abc", "consumed_per_step": 8, "capacity": 64}}, "produced_per_step='abc'"),
        (
            {"rhythm": {"produced_per_step": 8, "consumed_per_step": 8, "capacity": 64, "parameter_sync_step": True}},
            "parameter_sync_step=True",
        ),
    ],
)
def test_bad_rhythm_files_are_usage_errors(capsys, tmp_path, content, words):
    path = tmp_path / "rhythm.json"
    path.write_text(json.dumps(content))
    code, _, err = run_cli(capsys, "perturb", "--rhythm", path)
    assert code == 2 and words in err


def test_rhythm_strategy_and_max_age_are_said_to_be_ignored(capsys, tmp_path):
    path = tmp_path / "rhythm.json"
    path.write_text(
        json.dumps(
            {
                "rhythm": {
                    "produced_per_step": 8,
                    "consumed_per_step": 8,
                    "capacity": 64,
                    "strategy": "wait",
                    "max_age": 3,
                }
            }
        )
    )
    code, out, _ = run_cli(capsys, "perturb", "--rhythm", path, "--steps", 20)
    assert code == 0 and "strategy 'wait' and max_age 3 are not used" in out
