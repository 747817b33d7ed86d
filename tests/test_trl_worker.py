"""StalenessRolloutWorker inside TRL 1.16's real AsyncGRPOTrainer (tests/_trl_helpers.py says what runs for real).

For each strategy the bound is read from TRL's own records (``trainer.state.log_history``): TRL's per-sample filter
drops nothing and its ``sample/staleness_max`` never exceeds our ``max_age``, while groups really went stale (ages
reached the bound); the ledger balances after every step; the parameters change; a resume continues exactly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("trl", reason="needs TRL: pip install 'pyfast_buffer[trl]'")
pytest.importorskip("requests", reason="TRL's trainer builds its vLLM client from requests: pip install requests")

import torch  # noqa: E402
from _trl_helpers import Run, balanced, trl_drops, trl_staleness_max  # noqa: E402

from pyfast_buffer.integrations.trl import GenerationStopped, StalenessRolloutWorker  # noqa: E402
from pyfast_buffer.integrations.trl.tiny import sum_dataset, sum_reward, tiny_policy  # noqa: E402

STEPS = 10


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_policy(str(tmp_path_factory.mktemp("policy")))


class LedgerEveryStep:
    """A trainer callback that checks the worker's ledger after every optimizer step."""

    def __init__(self, worker):
        from transformers import TrainerCallback

        outer = self

        class Check(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                outer.seen.append(balanced(worker.buffer.ledger()))

        self.seen = []
        self.callback = Check()


@pytest.mark.parametrize("strategy", ["drop", "wait", "pace"])
def test_bound_holds_in_trls_own_log(tmp_path, model, strategy):
    run = Run(str(tmp_path), strategy, max_age=1, steps=STEPS, model=model, seed=1)
    check = LedgerEveryStep(run.worker)
    run.trainer.add_callback(check.callback)
    before = {n: p.detach().clone() for n, p in run.trainer.model.named_parameters()}
    try:
        history = run.train()
    finally:
        run.close()
    ledger = run.worker.buffer.ledger()
    steps = [h for h in history if "loss" in h]
    assert len(steps) == STEPS
    assert trl_drops(history) == 0, "TRL's own staleness filter fired"
    assert trl_staleness_max(history) <= 1
    # staleness really occurred: groups were trained at the bound, and drop had stale groups to drop
    assert max(h.get("pyfast_buffer/trajectory_age/max", 0) for h in history) == 1
    if strategy == "drop":
        assert ledger["dropped_stale"] > 0 and run.worker.counts["groups_dropped_stale"] > 0
    else:
        assert ledger["dropped_stale"] == 0
    if strategy == "pace":
        assert ledger["trained_over_age"] == 0 and ledger["admission_refused"] + ledger["admission_waits"] > 0
    assert run.worker.counts["delivered_over_age"] == 0
    assert check.seen and all(check.seen), "the ledger did not balance after some step"
    assert balanced(ledger)
    # our figures reached TRL's logs, under our prefix
    assert steps[-1]["pyfast_buffer/taken"] == ledger["taken"] >= STEPS * 8
    # whole groups: every delivered group id is new, and TRL's group ids stay unique
    assert len(run.delivered) == len(set(run.delivered))
    changed = [n for n, p in run.trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "training changed no parameter"


def test_token_budget_runs_one_version_tighter(tmp_path, model):
    run = Run(str(tmp_path), "pace", max_age=2, steps=6, model=model, token_budget=64, seed=2)
    try:
        assert run.worker.plan.margin == 1 and run.worker.buffer.max_age == 1
        history = run.train()
    finally:
        run.close()
    assert trl_drops(history) == 0 and trl_staleness_max(history) <= 2
    assert run.worker.counts["delivered_over_age"] == 0 and balanced(run.worker.buffer.ledger())


def test_refuses_a_trl_bound_below_ours(tmp_path, model):
    with pytest.raises(ValueError, match=r"AsyncGRPOConfig\.max_staleness=1 .*max_age=2"):
        Run(str(tmp_path), "drop", max_age=2, steps=2, model=model, max_staleness=1)


def test_refuses_other_num_generations_and_split_steps(model):
    from types import SimpleNamespace

    from pyfast_buffer.integrations.trl._options import plan

    worker = StalenessRolloutWorker(
        dataset=sum_dataset(4), processing_class=model[1], reward_funcs=[sum_reward], num_generations=4,
        max_completion_length=4, complete=_never, max_age=1,
    )
    args = SimpleNamespace(max_staleness=4, num_generations=8, per_device_train_batch_size=8, world_size=1,
                           gradient_accumulation_steps=1, weight_sync_steps=1, token_budget=0, queue_maxsize=0)
    with pytest.raises(ValueError, match=r"AsyncGRPOConfig\.num_generations=8 differs .*num_generations=4"):
        plan(worker, args)
    args.num_generations, args.per_device_train_batch_size = 4, 6
    with pytest.raises(ValueError, match=r"6 samples a step is not a whole number of groups"):
        plan(worker, args)
    args.per_device_train_batch_size, args.weight_sync_steps = 8, 2
    got = plan(worker, args)
    assert (got.groups_per_version, got.margin) == (4, 0)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"strategy": "fresh"}, ValueError, "strategy='fresh'"),
        ({"max_age": -1}, ValueError, "max_age=-1"),
        ({"num_generations": 1}, ValueError, "num_generations=1"),
        ({"reward_funcs": "accuracy"}, TypeError, "reward_funcs"),
        ({"complete": 3}, TypeError, "complete must be an async callable"),
        ({"lookahead": 1, "strategy": "drop"}, ValueError, "lookahead=1 needs strategy='pace'"),
        ({"stop_timeout": 0}, ValueError, "stop_timeout=0"),
    ],
)
def test_bad_arguments_are_named(model, kwargs, error, words):
    base = dict(
        dataset=sum_dataset(4),
        processing_class=model[1],
        reward_funcs=[sum_reward],
        num_generations=4,
        max_completion_length=4,
        complete=_never,
    )
    base.update(kwargs)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        StalenessRolloutWorker(**base)


async def _never(prompt_ids, max_tokens):
    await asyncio.sleep(3600)
    return [], []
