"""rhythm: config keys with file:line, the derived rhythm, the FIFO plan, warnings and malformed files."""

import json
import re

import pytest
from _workflow_helpers import fixture, run_cli

from pyfast_buffer.workflow import rhythm


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
    assert values == {
        "parameter_sync_step": 2,
        "strategy": "wait",
        "produced_per_step": 1024,
        "consumed_per_step": 1024,
        "max_age": 1,  # threshold 2 - 1: today's verl leaves parameter_sync_step out of the span
        "capacity": 8192,
    }
    plan = report["plan"]
    # production equals consumption: the 8192-slot buffer never fills, the trainer takes what was generated
    assert plan["fills"] is False and plan["age_distribution"] == {0: 0.5, 1: 0.5}
    assert plan["age_max"] == 1 and plan["suggested_max_age"] == 1 and plan["drop_share_at_max_age"] == 0.0
    assert plan["age_max_if_full"] == 8  # what a trainer stall that fills it would lead to, printed second
    assert plan["headline"].startswith("the oldest trajectory trained on is 1 step(s) old")
    assert "max_age 1 drops nothing" in plan["headline"] and plan["warnings"] == []


def test_a_buffer_that_fills_warns_of_reuse_and_of_wait_blocking():
    plan = rhythm.plan(2048, 1024, 8192, 2, max_age=1, strategy="wait")
    assert plan.fills and plan.age_max == 4 and plan.drop_share_at_max_age == 1.0
    warnings = " ".join(plan.warnings)
    assert "picked up again" in warnings and "will block" in warnings and "starve" not in warnings
    assert "under 'wait' the trainer blocks instead of dropping" in plan.headline


def test_an_unbounded_buffer_fed_faster_than_drained_has_no_steady_state():
    plan = rhythm.plan(2048, 1024, None, 1, max_age=3)
    assert not plan.steady and plan.age_distribution == {} and plan.drop_share_at_max_age is None
    assert plan.headline.startswith("no steady state: production outruns consumption by 1024")


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
    code, out, _ = run_cli(
        capsys,
        "rhythm",
        fixture("rhythm", "homegrown.toml"),
        "--set",
        "produced_per_step=256",
        "--set",
        "consumed_per_step=512",
    )
    assert code == 0
    assert "trainer will starve" in out and "homegrown.toml:5" in out and "--set produced_per_step=256" in out


def test_set_overrides_a_dotted_config_key():
    report = rhythm.analyse(
        [fixture("rhythm", "verl_ppo_trainer.yaml")],
        rhythm.parse_set(["trainer.v1.sampler.max_off_policy_threshold=8"]),
    )
    assert report["rhythm"]["max_age"] == 7  # threshold - 1, as today's verl counts


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


@pytest.mark.parametrize(
    "p, c, cap, sync, ages",
    [
        (10, 20, 100, 1, {0: 1.0}),  # production below consumption: the queue never holds anything
        (10, 10, 10, 1, {0: 1.0}),  # capacity of one step: on-policy
        (10, 10, 30, 1, {0: 1.0}),  # production equals consumption: the buffer never fills
        (10, 10, None, 2, {0: 0.5, 1: 0.5}),  # no bound at all (verl's sampler): the weight lag only
        (30, 10, 30, 1, {0: 1.0}),  # overflow evicts the oldest, so what is taken is fresh
        (10, 10, 10, 2, {0: 0.5, 1: 0.5}),  # weights pushed every other step
    ],
)
def test_plan_fifo_ages(p, c, cap, sync, ages):
    assert rhythm.plan(p, c, cap, sync).age_distribution == ages


def test_producers_that_run_ahead_keep_the_buffer_full():
    plan = rhythm.plan(10, 10, 30, 1, runs_ahead=True)
    assert plan.fills and plan.age_distribution == {2: 1.0} and plan.age_max_if_not_full == 0


def test_plan_rejects_bad_rates_and_counts_latency():
    with pytest.raises(ValueError, match="capacity=0"):
        rhythm.plan(10, 10, 0, 1)
    assert rhythm.plan(10, 10, 10, 1, latency_steps=2).suggested_max_age == 2


def test_toml_without_tomllib_is_skipped_with_a_fix(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "tomllib", None)
    monkeypatch.setitem(__import__("sys").modules, "tomli", None)
    result = rhythm.scan([fixture("rhythm", "homegrown.toml")])
    assert result.files == [] and "Python 3.11+" in result.skipped[0][1]


def test_deeply_nested_configs_are_skipped_not_crashing(tmp_path):
    (tmp_path / "deep.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp_path / "ok.yaml").write_text("replay:\n  capacity: 64\n")
    result = rhythm.scan([str(tmp_path)])
    reasons = dict(result.skipped)
    assert "nested too deeply" in reasons[str(tmp_path / "deep.json")]
    assert str(tmp_path / "deep.yaml") in reasons
    assert result.files == [str(tmp_path / "ok.yaml")]


def test_yaml_alias_bomb_is_walked_once():
    result = rhythm.scan([fixture("configs_bad", "laughs.yaml")])  # 10**9 leaves if aliases were expanded
    assert result.skipped == [] and result.findings == []


def test_too_many_keys_and_too_large_files_are_skipped(tmp_path):
    wide = tmp_path / "wide.yaml"
    wide.write_text("".join(f"buffer_{i}: {i}\n" for i in range(20_001)))
    big = tmp_path / "tokenizer.json"
    big.write_text('{"vocab": "' + "x" * (2 * 1024 * 1024) + '"}')
    reasons = dict(rhythm.scan([str(wide), str(big)]).skipped)
    assert "more than 20000 keys" in reasons[str(wide)] and "above the 2 MiB" in reasons[str(big)]


def test_json_values_come_from_json_not_yaml():
    report = rhythm.analyse([fixture("configs_bad", "exponent_values.json")])
    found = {f["key"]: f for f in report["findings"]}
    assert found["data.train_batch_size"]["value"] == 1000.0 and found["data.train_batch_size"]["line"] == 1
    assert report["rhythm"]["produced_per_step"] == 1000 and report["rhythm"]["capacity"] == 4000


def test_non_finite_known_keys_are_noted_and_json_output_stays_valid(capsys):
    report = rhythm.analyse([fixture("configs_bad", "nan_values.json")])
    assert "capacity" not in report["rhythm"]  # NaN is not silently replaced
    notes = " ".join(report["notes"])
    assert (
        "replay.capacity=nan" in notes and "actor_rollout_ref.rollout.n=nan" in notes and "not a finite number" in notes
    )
    _, out, _ = run_cli(capsys, "rhythm", fixture("configs_bad", "nan_values.json"), "--json")
    assert "NaN" in out and "Infinity" not in out
    parsed = json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in --json output"))
    assert {f["key"]: f["value"] for f in parsed["findings"]}["replay.capacity"] == "NaN"


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "data:\n  train_batch_size: 8\nparameter_sync_step: 0.5\nreplay:\n  capacity: 64\n",
            "parameter_sync_step=0.5 is below 1",
        ),
        ("data:\n  train_batch_size: 8\nreplay:\n  capacity: 0.5\n", "capacity=0.5 is below 1"),
        (
            "data:\n  train_batch_size: 8\nparameter_sync_step: 1000000000\nreplay:\n  capacity: 64\n",
            "too large to simulate",
        ),
        ("data:\n  train_batch_size: 0.000001\nreplay:\n  capacity: 1000000\n", "no trajectory reached the trainer"),
    ],
)
def test_numbers_that_cannot_be_planned_say_why(capsys, tmp_path, text, words):
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    report = rhythm.analyse([str(path)])
    assert report["plan"] is None and words in report["plan_error"]
    code, out, _ = run_cli(capsys, "rhythm", path)
    assert code == 0 and "turnover: not computed: " + words in out and "suggested max_age" not in out


@pytest.mark.parametrize(
    "item, words",
    [
        ("max_age=abc", "--set max_age='abc' is not a whole number; write a whole number >= 0"),
        ("max_age=2.5", "--set max_age=2.5 is not a whole number"),
        ("max_age=-1", "--set max_age=-1 must be >= 0"),
        ("produced_per_step=abc", "--set produced_per_step='abc' is not a number; write a number > 0"),
        ("consumed_per_step=0", "--set consumed_per_step=0 must be > 0"),
        ("consumed_per_step=nan", "--set consumed_per_step=nan is not a number"),
        ("capacity=0", "--set capacity=0 must be >= 1"),
        ("capacity=true", "--set capacity=True is not a whole number"),
        ("parameter_sync_step=1.5", "--set parameter_sync_step=1.5 is not a whole number"),
        ("latency_steps=-2", "--set latency_steps=-2 must be >= 0"),
        ("strategy=fifo", "--set strategy='fifo' is unknown; write --set strategy=drop or --set strategy=wait"),
    ],
)
def test_set_rhythm_values_are_validated_before_anything_runs(capsys, item, words):
    with pytest.raises(ValueError, match="^" + re.escape(words)):
        rhythm.parse_set([item])
    code, out, err = run_cli(capsys, "rhythm", fixture("rhythm", "trl_grpo.yaml"), "--set", item)
    assert code == 2 and out == "" and words in err


def test_set_accepts_valid_rhythm_values_and_free_config_keys():
    assert rhythm.parse_set(
        [
            "max_age=0",
            "capacity=4096",
            "produced_per_step=0.5",
            "latency_steps=0",
            "parameter_sync_step=2",
            "strategy=drop",
            "some.config.key=abc",
        ]
    ) == {
        "max_age": 0,
        "capacity": 4096,
        "produced_per_step": 0.5,
        "latency_steps": 0,
        "parameter_sync_step": 2,
        "strategy": "drop",
        "some.config.key": "abc",
    }


def test_set_reads_numbers_before_yaml():
    assert rhythm.parse_set(["capacity=1e4", "produced_per_step=12", "strategy=wait", "max_age=null"]) == {
        "capacity": 10000.0,
        "produced_per_step": 12,
        "strategy": "wait",
        "max_age": None,
    }
    report = rhythm.analyse(
        [fixture("rhythm", "homegrown.toml")],
        rhythm.parse_set(["capacity=1e4", "produced_per_step=5e2", "consumed_per_step=5e2"]),
    )
    assert report["plan"]["capacity"] == 10000 and report["plan"]["turnover_steps"] == 20


def test_threshold_goes_through_the_config_helper():
    report = rhythm.analyse(
        [fixture("rhythm", "verl_ppo_trainer.yaml")],
        rhythm.parse_set(["trainer.v1.sampler.max_off_policy_threshold=0.5"]),
    )
    assert "max_age" not in report["rhythm"]
    assert any("no max_age derived" in n for n in report["notes"])


def test_the_figure_to_act_on_comes_first_and_a_stall_is_the_second(capsys):
    plan = rhythm.plan(10, 10, 30, 1)
    assert (plan.suggested_max_age, plan.age_max_if_full) == (0, 2)
    _, out, _ = run_cli(capsys, "rhythm", fixture("rhythm", "verl_ppo_trainer.yaml"))
    lines = out.splitlines()
    assert lines[1].startswith("=> the oldest trajectory trained on is 1 step(s) old")
    assert "if the buffer ever fills (a trainer stall), the oldest trajectory trained on gets 8 step(s) old" in out
    assert "in steady state" not in out and "assumed: the buffer has filled" not in out


def test_yaml_without_pyyaml_is_skipped_with_a_fix(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "yaml", None)
    result = rhythm.scan([fixture("rhythm", "trl_grpo.yaml")])
    assert result.files == [] and "pip install pyyaml" in result.skipped[0][1]


def test_a_bare_launch_script_with_verl_091_settings_is_read_with_notes(tmp_path):
    # No verl config folder beside it (only the script's overrides), colocate_async, verl 0.9.1's null threshold
    # and pace: rhythm used to fail with a KeyError on the missing parameter_sync_step key.
    script = tmp_path / "run.sh"
    script.write_text(
        "python3 -m verl.trainer.main_ppo \\\n"
        "    data.train_batch_size=64 \\\n"
        "    actor_rollout_ref.rollout.n=4 \\\n"
        "    trainer.v1.trainer_mode=colocate_async \\\n"
        "    trainer.v1.sampler.max_off_policy_threshold=null \\\n"
        "    trainer.v1.sampler.max_off_policy_strategy=pace\n"
    )
    report = rhythm.analyse([str(script)])
    assert report["rhythm"]["parameter_sync_step"] == 1 and "max_age" not in report["rhythm"]
    notes = " ".join(report["notes"])
    assert "null turns verl's staleness control off" in notes and "models drop and wait only" in notes
