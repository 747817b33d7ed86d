"""rhythm: config keys with file:line, the derived rhythm, the FIFO plan, warnings and malformed files."""

import json

import pytest

from _workflow_helpers import fixture, run_cli
from pyfast_buffer import rhythm


def _by_key(result):
    return {f.key: f for f in result.findings}


def test_verl_sampler_block_keys_lines_and_classes():
    result = rhythm.scan([fixture("rhythm", "verl_ppo_trainer.yaml")])
    found = _by_key(result)
    assert result.skipped == []
    assert (found["data.train_batch_size"].line, found["data.train_batch_size"].value) == (8, 256)
    assert found["data.train_batch_size"].cls == "production" and found["data.train_batch_size"].source == "verl"
    assert found["actor_rollout_ref.rollout.n"].value == 4
    assert found["trainer.v1.sampler.max_off_policy_threshold"].cls == "staleness"
    assert found["trainer.v1.sampler.sampler_kwargs.capacity"].cls == "capacity"
    assert found["trainer.v1.separate_async.parameter_sync_step"].line == 28
    assert "actor_rollout_ref.rollout.name" not in found  # a name, not a rate


def test_verl_rhythm_plan_and_all_warnings_but_starvation():
    report = rhythm.analyse([fixture("rhythm", "verl_ppo_trainer.yaml")])
    values = report["rhythm"]
    assert values == {"parameter_sync_step": 2, "strategy": "wait", "produced_per_step": 1024,
                      "consumed_per_step": 1024, "max_age": 3, "capacity": 8192}
    plan = report["plan"]
    assert plan["turnover_steps"] == 8 and plan["age_max"] == 8 and plan["suggested_max_age"] == 8
    assert plan["age_distribution"] == {7: 0.5, 8: 0.5}
    assert plan["drop_share_at_max_age"] == 1.0
    warnings = " ".join(plan["warnings"])
    assert "picked up again" in warnings and "will block" in warnings and "starve" not in warnings


def test_areal_yaml_resolves_interpolation_and_matches_its_threshold():
    report = rhythm.analyse([fixture("rhythm", "areal_gsm8k_grpo.yaml")])
    found = {f["key"]: f for f in report["findings"]}
    assert found["rollout.consumer_batch_size"]["value"] == 32  # ${train_dataset.batch_size}
    assert found["rollout.max_head_offpolicyness"]["source"] == "AReaL"
    assert report["rhythm"]["capacity"] == 384 and report["rhythm"]["max_age"] == 2
    assert report["plan"]["suggested_max_age"] == 2 and report["plan"]["warnings"] == []


def test_trl_config_reuse_gives_implied_max_age():
    values = rhythm.analyse([fixture("rhythm", "trl_grpo.yaml")])["rhythm"]
    assert values["produced_per_step"] == 16 and values["capacity"] == 64 and values["max_age"] == 3


def test_json_fully_async_and_toml_keyword_configs():
    report = rhythm.analyse([fixture("rhythm", "verl_fully_async.json")])
    assert report["rhythm"]["capacity"] == 1536 and report["rhythm"]["parameter_sync_step"] == 4
    assert {f["key"]: f["line"] for f in report["findings"]}["async_training.require_batches"] == 10
    toml = rhythm.analyse([fixture("rhythm", "homegrown.toml")])
    found = {f["key"]: f for f in toml["findings"]}
    assert found["replay.capacity"]["line"] == 5 and found["replay.capacity"]["cls"] == "capacity"
    assert found["sampler.rollout_batch_size"]["cls"] == "production"
    assert toml["plan"] is None and toml["missing"] == ["produced_per_step", "consumed_per_step"]


def test_set_supplies_missing_rates_and_flags_starvation(capsys):
    code, out, _ = run_cli(capsys, "rhythm", fixture("rhythm", "homegrown.toml"),
                           "--set", "produced_per_step=256", "--set", "consumed_per_step=512")
    assert code == 0
    assert "trainer will starve" in out and "homegrown.toml:5" in out and "--set produced_per_step=256" in out


def test_set_overrides_a_dotted_config_key():
    report = rhythm.analyse([fixture("rhythm", "verl_ppo_trainer.yaml")],
                            rhythm.parse_set(["trainer.v1.sampler.max_off_policy_threshold=8"]))
    assert report["rhythm"]["max_age"] == 15


def test_malformed_files_are_skipped_with_reasons(capsys):
    result = rhythm.scan([fixture("rhythm"), fixture("binary.bin"), fixture("no_such.yaml")])
    reasons = dict(result.skipped)
    assert "invalid YAML at line 4" in reasons[fixture("rhythm", "bad.yaml")]
    assert "binary" in reasons[fixture("binary.bin")]
    assert "no such file" in reasons[fixture("no_such.yaml")]
    assert len(result.files) == 5
    code, out, _ = run_cli(capsys, "rhythm", fixture("rhythm", "bad.yaml"), fixture("binary.bin"))
    assert code == 2 and "bad.yaml: invalid YAML" in out and "binary.bin: binary file" in out


def test_directory_scan_notes_conflicting_values(capsys):
    code, out, _ = run_cli(capsys, "rhythm", fixture("rhythm"))
    assert code == 0 and "5 file(s) read, 1 skipped" in out and "differs from" in out


def test_json_output_is_machine_readable(capsys):
    code, out, _ = run_cli(capsys, "rhythm", fixture("rhythm", "areal_gsm8k_grpo.yaml"), "--json")
    report = json.loads(out)
    assert code == 0 and report["rhythm"]["produced_per_step"] == 128 and report["plan"]["age_max"] == 2


def test_bad_set_item_is_a_usage_error(capsys):
    code, _, err = run_cli(capsys, "rhythm", fixture("rhythm", "trl_grpo.yaml"), "--set", "capacity")
    assert code == 2 and "key=value" in err


@pytest.mark.parametrize("p, c, cap, sync, ages", [
    (10, 20, 100, 1, {0: 1.0}),  # production below consumption: the queue never holds anything
    (10, 10, 10, 1, {0: 1.0}),  # capacity of one step: on-policy
    (10, 10, 30, 1, {2: 1.0}),
    (30, 10, 30, 1, {0: 1.0}),  # overflow evicts the oldest, so what is taken is fresh
    (10, 10, 10, 2, {0: 0.5, 1: 0.5}),  # weights pushed every other step
])
def test_plan_fifo_ages(p, c, cap, sync, ages):
    assert rhythm.plan(p, c, cap, sync).age_distribution == ages


def test_plan_rejects_bad_rates_and_counts_latency():
    with pytest.raises(ValueError, match="capacity=0"):
        rhythm.plan(10, 10, 0, 1)
    assert rhythm.plan(10, 10, 10, 1, latency_steps=2).suggested_max_age == 2


def test_toml_without_tomllib_is_skipped_with_a_fix(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "tomllib", None)
    monkeypatch.setitem(__import__("sys").modules, "tomli", None)
    result = rhythm.scan([fixture("rhythm", "homegrown.toml")])
    assert result.files == [] and "Python 3.11+" in result.skipped[0][1]
