"""perturb: a tiny and a huge max_age on the built-in simulation and on user workloads."""

import json

import pytest

from _workflow_helpers import fixture, run_cli
from pyfast_buffer import ReferenceBuffer, verify

LOOPS = fixture("workloads", "user_loops.py")


def test_simulated_workload_moves_drops():
    result = verify.perturb(verify.simulated_workload(16, 16, 128, parameter_sync_step=2, steps=60))
    assert result.exit_code == 0 and result.moved
    assert result.small["dropped_stale"] == result.small["sampled_total"] > 0  # every age is >= 1
    assert result.large["dropped_stale"] == 0
    assert "drop path runs" in result.verdict


def test_reference_buffer_gives_the_same_ledgers():
    work = verify.simulated_workload(8, 8, 64, steps=40, seed=3)
    native, ref = verify.perturb(work), verify.perturb(work, buffer_class=ReferenceBuffer)
    assert (native.small, native.large) == (ref.small, ref.large)


def test_cli_prints_both_ledgers_side_by_side(capsys):
    code, out, _ = run_cli(capsys, "perturb", "--produced", 8, "--consumed", 8, "--capacity", 64, "--steps", 40)
    assert code == 0
    assert "max_age=0" in out and "max_age=1000000000" in out and "verdict: drop path runs" in out
    assert out.count("True") == 2  # both ledgers balance


def test_rates_from_rhythm_json(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "rhythm", fixture("rhythm", "trl_grpo.yaml"), "--json")
    path = tmp_path / "rhythm.json"
    path.write_text(out)
    assert verify.rates_from_rhythm(str(path)) == {"produced_per_step": 16, "consumed_per_step": 16, "capacity": 64,
                                                   "parameter_sync_step": 1}
    code, out, _ = run_cli(capsys, "perturb", "--rhythm", path, "--steps", 30)
    assert code == 0 and "capacity 64" in out


def test_rhythm_without_rates_is_a_usage_error(capsys, tmp_path):
    path = tmp_path / "rhythm.json"
    path.write_text(json.dumps({"rhythm": {"capacity": 4096}}))
    code, _, err = run_cli(capsys, "perturb", "--rhythm", path)
    assert code == 2 and "missing produced_per_step" in err


@pytest.mark.parametrize("name, code, words", [
    ("takes_from_buffer", 0, "drop path runs"),
    ("bypasses_buffer", 1, "drop code is never called"),
    ("waits", 1, "strategy 'wait' never drops"),
])
def test_user_workloads(capsys, name, code, words):
    got, out, _ = run_cli(capsys, "perturb", "--workload", f"{LOOPS}:{name}")
    assert got == code and words in out


def test_bad_workloads_are_usage_errors(capsys):
    for spec, words in ((f"{LOOPS}:never_builds", "never called the buffer factory"),
                        (f"{LOOPS}:no_such", "has no function"),
                        ("no_such_module_xyz:run", "cannot import"),
                        ("no_colon", "not module:function")):
        code, _, err = run_cli(capsys, "perturb", "--workload", spec)
        assert code == 2 and words in err, spec


def test_perturb_checks_its_ages():
    with pytest.raises(ValueError, match="small < large"):
        verify.perturb(verify.simulated_workload(1, 1, 4), small_max_age=5, large_max_age=5)
