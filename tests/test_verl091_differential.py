"""Differential test: verl 0.9.1's own ``ReplayBuffer``/``ReplayBufferAsync`` and ours, side by side on the same
randomized tag streams on a real TransferQueue (``_verl_differential`` says how a stream runs).

Drawn by hypothesis: the trainer mode, the strategy (drop, wait), the threshold (1 to 4, or null), DAPO
(off, ``acc`` or verl 0.9.1's canonical ``reward``), sync failure refills, the partition (``train`` or ``val``),
each prompt's end (finished or failed, trajectories written, accuracies) and the rounds (prompts dispatched,
rollout moves, step advances, batch sizes, and which call the trainer makes). Compared step by step: every batch
(keys and tags), every metrics dict, every ``refill_fn`` call, what is left in TransferQueue after each call
(so every eviction), and where a run raises or can never be satisfied. Needs ``verl==0.9.1``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl", minversion="0.9.1", reason="verl 0.9.1 is not installed (bash .ci/verl-stage.sh)")
pytest.importorskip("transfer_queue", reason="TransferQueue is not installed: pip install '.[verl]'")

from _verl_cpu_trainer import VERL_OWN_WARNINGS, import_verl
from _verl_differential import Plan, Program, Round, first_difference, our_sampler, run, verl_sampler
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import_verl()
pytestmark = [pytest.mark.filterwarnings(w) for w in VERL_OWN_WARNINGS]

SESSIONS = 3


plans = st.builds(
    Plan,
    status=st.sampled_from(["finished", "finished", "finished", "failure"]),
    written=st.integers(0, SESSIONS),
    values=st.tuples(*[st.integers(0, 1)] * SESSIONS),
).map(lambda p: p if p.status == "failure" or p.written else Plan(p.status, 1, p.values))  # finished: >= 1 written


@st.composite
def programs(draw) -> Program:
    mode = draw(st.sampled_from(["sync", "async"]))
    metric = draw(st.sampled_from([None, None, "acc", "reward"]))
    refill_failed = mode == "sync" and metric is None and draw(st.booleans())
    probes = ["sample", "sample"] + (["count", "wait"] if mode == "async" else [])  # verl's sync buffer has neither
    rounds = []
    for _ in range(draw(st.integers(2, 8))):
        batch = draw(st.integers(1, 4))
        rounds.append(
            Round(
                # a trainer submits about a batch a step (verl's prepare_step), sometimes more or nothing
                dispatch=0 if draw(st.integers(0, 9)) == 0 else batch + draw(st.integers(0, 2)),
                step_up=draw(st.integers(0, 3)),
                moves=draw(st.integers(0, 12)),
                batch=batch,
                probe=draw(st.sampled_from(probes)),
            )
        )
    return Program(
        mode=mode,
        strategy=draw(st.sampled_from(["drop", "wait"])),
        threshold=draw(st.sampled_from([None, 1, 2, 3, 4])),
        metric=metric,
        refill_failed=refill_failed,
        partition=draw(st.sampled_from(["train", "train", "val"])),
        plans=draw(st.lists(plans, min_size=8, max_size=16)),
        rounds=rounds,
    )


# Each example is two runs on TransferQueue (about a second): 40 in CI, more with HYPOTHESIS_PROFILE=thorough.
EXAMPLES = min(settings().max_examples, 40) if settings().max_examples <= 60 else settings().max_examples


@settings(
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    deadline=None,
)
@given(program=programs())
def test_ours_does_what_verls_own_buffer_does_on_the_same_stream(verl_cpu, program):
    verls = run(program, lambda refill, move: verl_sampler(program, refill, move))
    ours = run(program, lambda refill, move: our_sampler(program, refill, move))
    assert first_difference(verls, ours) is None, (first_difference(verls, ours), program)
    batches = sum(1 for e in verls.events if len(e) > 1 and e[1] == "sample" and e[2])
    event(f"{program.mode} batches sampled: {min(batches, 3)}{'+' if batches >= 3 else ''}")
    event(f"ends: {verls.events[-1][-1] if verls.events[-1][-1] in ('stuck', 'RuntimeError') else 'all rounds'}")
    event(f"refill_fn called: {any(e[0] == 'refill' for e in verls.events)}")
    event(f"evictions in the metrics: {any('evicted' in str(e[3:]) for e in verls.events if len(e) > 3)}")


def test_the_harness_sees_a_difference(verl_cpu):
    # A sampler that returns one group too few is caught: the comparison can fail.
    program = Program(
        "async", "drop", 2, None, False, "train", [Plan("finished", 2, (1, 0, 1))], [Round(4, 0, 8, 2, "sample")]
    )
    verls = run(program, lambda refill, move: verl_sampler(program, refill, move))

    def short(refill, move):
        sampler = our_sampler(program, refill, move)
        sample = sampler.sample
        sampler.sample = lambda step, pid, n: sample(step, pid, n - 1)
        return sampler

    assert first_difference(verls, run(program, short)) is not None
