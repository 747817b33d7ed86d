"""rhythm on verl as users run it: launch scripts of Hydra overrides, config folders composed from defaults.

The fixtures (tests/fixtures/verl_like/) are small files of our own in verl's shape: a config folder with a
defaults list and two trainer configs, an entry point whose hydra decorator names its config, and scripts.
"""

import pytest
from _workflow_helpers import fixture, run_cli

from pyfast_buffer.workflow import rhythm
from pyfast_buffer.workflow.launch_script import LaunchScriptError, parse_launch_script
from pyfast_buffer.workflow.verl_sources import RhythmInputError

SCRIPT = fixture("verl_like", "examples", "run_grpo.sh")
CONFIG = fixture("verl_like", "verl", "trainer", "config")


def _rows(report):
    return {f["key"]: f for f in report["findings"] if f["decides"]}


def test_a_launch_script_is_read_as_bash_would_expand_it():
    text = """#!/bin/bash
N=${N:-4}
BASE=base
ARGS=(
    a.b=$N                 # a default, then an array item
    "c.d=${BASE}/x y"
)
ARGS+=( e.f='quoted' )
OUT=$(date)
if true; then
    N=99
fi
python3 -m verl.trainer.main_ppo "${ARGS[@]}" \\
    +g.h=$((N * 2)) ++i.j=[1,2] ~k.l \\
    m.n=$OUT o.p=$UNSET q.r=$N "$@"
"""
    script = parse_launch_script(text, "s.sh")
    assert (script.entry, script.line) == ("verl.trainer.main_ppo", 13)
    got = {o.key: o for o in script.overrides}
    assert (got["a.b"].value, got["a.b"].line, got["a.b"].defaults) == (4, 5, ("N",))
    assert got["a.b"].conditional == ()  # the array was fixed before the if, as in bash
    assert (got["q.r"].value, got["q.r"].conditional) == (4, ("N",))  # also set inside the if: outside value read
    assert (got["c.d"].value, got["c.d"].line) == ("base/x y", 6)
    assert (got["e.f"].value, got["e.f"].line) == ("quoted", 8)
    assert (got["g.h"].prefix, got["g.h"].value, got["g.h"].line) == ("+", 8, 14)
    assert (got["i.j"].prefix, got["i.j"].value) == ("++", [1, 2])
    assert got["k.l"].prefix == "~"
    assert got["m.n"].unresolved == ("$(...)",) and got["o.p"].unresolved == ("UNSET",)
    assert any('"$@"' in note for note in script.notes)


def test_rhythm_on_a_launch_script_names_the_script_lines_and_the_unbounded_buffer(capsys):
    report = rhythm.analyse([SCRIPT])
    rows = _rows(report)
    for key, line in (
        ("data.train_batch_size", 12),
        ("actor_rollout_ref.rollout.n", 17),
        ("trainer.v1.separate_async.parameter_sync_step", 31),
        ("trainer.v1.sampler.max_off_policy_strategy", 32),
    ):
        assert (rows[key]["path"], rows[key]["line"]) == (SCRIPT, line), key
    assert rows["trainer.v1.sampler.max_off_policy_threshold"]["path"].endswith("config/ppo_trainer.yaml")
    assert rows["data.train_batch_size"]["value"] == 512  # ${TRAIN_BATCH_SIZE:-512}, the environment unread
    assert report["rhythm"]["capacity"] is None and report["rhythm"]["parameter_sync_step"] == 2
    plan = report["plan"]
    assert plan["fills"] is False and plan["age_max"] == 2  # weight lag 1 + one warm-up batch ahead
    assert "clip_ratio" not in str(list(rows)) and "qat" not in str(list(rows))  # noise only with --all
    code, out, _ = run_cli(capsys, "rhythm", SCRIPT)
    assert code == 0
    assert out.splitlines()[1].startswith("=> the oldest trajectory trained on is 2 step(s) old")
    assert "nothing bounds the buffer" in out and "in steady state" not in out and "drops 100" not in out
    assert "uses SYNC, which the script also sets inside an if/case/loop" in out
    assert "is the default of ${TRAIN_BATCH_SIZE:-...}" in out


def test_all_lists_the_keys_that_do_not_decide_the_rhythm(capsys):
    _, out, _ = run_cli(capsys, "rhythm", CONFIG)
    assert "clip_ratio" not in out and "more matched key(s) do not decide the rhythm: --all lists them" in out
    _, out, _ = run_cli(capsys, "rhythm", CONFIG, "--all")
    assert "actor_rollout_ref.actor.clip_ratio" in out and "actor_rollout_ref.actor.qat.group_size" in out


def test_a_config_folder_is_composed_from_its_defaults_for_the_entry_points_config():
    report = rhythm.analyse([CONFIG])
    rows = _rows(report)
    assert rows["data.train_batch_size"]["path"].endswith("config/data/legacy_data.yaml")
    assert rows["data.train_batch_size"]["line"] == 1
    assert rows["actor_rollout_ref.rollout.n"]["path"].endswith("config/rollout/rollout.yaml")
    assert report["config"].endswith("ppo_trainer.yaml")
    assert any("main_ppo.py's @hydra.main" in n and "also here: sft_trainer" in n for n in report["notes"])
    # trainer_mode sync: weights every step, so separate_async's parameter_sync_step does not apply
    assert report["rhythm"]["parameter_sync_step"] == 1 and report["plan"]["age_max"] == 0


def test_base_and_config_name_choose_the_config_a_script_builds_on(tmp_path):
    script = tmp_path / "run.sh"  # outside the verl tree: the folder comes from --base
    script.write_text("python3 -m verl.trainer.main_ppo data.train_batch_size=32 actor_rollout_ref.rollout.n=4\n")
    report = rhythm.analyse([str(script)], base=CONFIG, config_name="ppo_trainer")
    assert report["rhythm"]["produced_per_step"] == 128 and report["config"].endswith("ppo_trainer.yaml")
    with pytest.raises(RhythmInputError, match=r"'nope' \(--config-name\) is not in .*ppo_trainer, sft_trainer"):
        rhythm.analyse([str(script)], base=CONFIG, config_name="nope")


def _refusal(path, error):
    """The message of the ``error`` (a ValueError) that analyse raises on ``path``."""
    with pytest.raises(error) as caught:
        rhythm.analyse([path])
    assert isinstance(caught.value, ValueError)
    return str(caught.value)


def test_several_candidate_configs_are_listed_and_one_is_asked_for(capsys):
    ambiguous = fixture("verl_like", "examples", "run_unknown_config.sh")
    message = _refusal(ambiguous, RhythmInputError)
    assert "several trainer configs (ppo_trainer, sft_trainer)" in message
    assert "run_unknown_config.sh:4 passes --config-name=" in message and "choose one with --config-name" in message
    code, _, err = run_cli(capsys, "rhythm", ambiguous)
    assert code == 2 and "choose one with --config-name NAME" in err


def test_a_script_that_launches_no_verl_is_refused_with_what_to_pass(capsys):
    not_a_launcher = fixture("verl_like", "examples", "prepare_data.sh")
    message = _refusal(not_a_launcher, LaunchScriptError)
    assert "no verl launch command found" in message and "never runs the script" in message
    assert "pyfast-buffer rhythm path/to/verl/trainer/config" in message
    code, out, err = run_cli(capsys, "rhythm", not_a_launcher)
    assert code == 2 and "no verl launch command found" in err and "invalid YAML" not in out + err


def test_a_hydra_folder_of_one_config_is_read_and_of_several_asks(tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - _self_\ndata:\n  train_batch_size: 16\n")
    report = rhythm.analyse([str(tmp_path)])
    assert report["config"].endswith("mine.yaml") and any("the only trainer config" in n for n in report["notes"])
    (tmp_path / "other.yaml").write_text("defaults:\n  - _self_\n")
    message = _refusal(str(tmp_path), RhythmInputError)
    assert "several trainer configs (mine, other)" in message and "ppo_trainer, is not there" in message
