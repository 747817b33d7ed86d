"""verl's rollout-skip cache (``skip.rollout_tq``) with our sampler, as with verl's own buffer.

verl wraps its buffers' ``sample`` with ``SkipManager.annotate_tq(role="rollout_tq", phase="sample")``: on the
listed steps the sampled batch is saved to disk, and a later run injects the saved trajectories into
TransferQueue instead of generating. Our ``sample`` is wrapped the same way inside verl. Needs ``verl==0.9.1``.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verl", minversion="0.9.1", reason="verl 0.9.1 is not installed (bash .ci/verl-stage.sh)")
pytest.importorskip("transfer_queue", reason="TransferQueue is not installed: pip install '.[verl]'")

import ray
from _verl_cpu_trainer import (
    SAMPLER,
    VERL_OWN_WARNINGS,
    balanced,
    base_overrides,
    clear_transfer_queue,
    compose,
    stop,
    train,
)

pytestmark = [pytest.mark.filterwarnings(w) for w in VERL_OWN_WARNINGS]

STEPS, CACHED, BATCH, N = 3, (1, 2), 8, 2


def skip_run(tmp_path, dump_dir, ours: bool):
    clear_transfer_queue()
    overrides = [
        "skip.rollout_tq.enable=true",
        f"skip.rollout_tq.dump_dir={dump_dir}",
        f"skip.rollout_tq.steps=[{','.join(map(str, CACHED))}]",
    ]
    config = compose(base_overrides(tmp_path, "sync", STEPS, batch=BATCH, n=N) + (SAMPLER if ours else []) + overrides)
    run = train(config, {"seed": 9, "fail_rate": 0.0})
    generated = ray.get(run.server.counts.remote())["generated"]
    stop(run)
    return run, generated


def dumps(dump_dir) -> dict:
    """{step: trajectories saved} of a rollout-skip dump directory."""
    found = {}
    for meta in dump_dir.rglob("meta.json"):
        found[int(meta.parent.parent.name)] = json.loads(meta.read_text())["num_trajectories"]
    return found


def test_our_sample_saves_and_replays_the_rollout_skip_cache_as_verls_does(verl_cpu, tmp_path):
    verls, _ = skip_run(tmp_path / "verl", tmp_path / "dump-verl", ours=False)
    assert type(verls.trainer.replay_buffer).__module__.startswith("verl.")
    ours, generated = skip_run(tmp_path / "ours", tmp_path / "dump-ours", ours=True)
    assert type(ours.trainer.replay_buffer).__module__.startswith("pyfast_buffer.")
    assert generated == STEPS * BATCH * N
    saved = dumps(tmp_path / "dump-ours")
    assert saved == dumps(tmp_path / "dump-verl") == {step: BATCH * N for step in CACHED}

    replay, generated = skip_run(tmp_path / "ours", tmp_path / "dump-ours", ours=True)  # phase two: load
    assert generated == (STEPS - len(CACHED)) * BATCH * N  # the cached steps generated nothing
    balanced(replay.trainer.replay_buffer.ledger("train"), paced=False)
    cached_lengths = sorted(tag["response_len"] for step, tags in ours.record.trained if step in CACHED for tag in tags)
    replayed = sorted(tag["response_len"] for step, tags in replay.record.trained if step in CACHED for tag in tags)
    assert replayed == cached_lengths  # the trajectories trained at the cached steps are the saved ones
