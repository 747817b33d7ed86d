"""The pace acceptance scenario: 4 producer threads, heavy-tailed rollouts, weight lag, a trainer with a timeout.

Under pace (both implementations) it asserts the guarantee of docs/design.md ("pace"): over 300 training steps
nothing is dropped for staleness, no trajectory is trained past max_age, in flight + ready never exceeds
(lookahead + 1) * prompts_per_step groups, every trajectory is taken exactly once, the ledger balances after every
call, and no blocking call outlives its timeout. The same scenario under drop and wait is only reported
(trajectories generated but never trained, trainer time spent waiting, trained ages): those numbers depend on the
machine, so nothing about them is asserted; docs/guide.md quotes one run of ``pytest -s`` of this file.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List

import pytest

import pyfast_buffer as pfb

STEPS = 300
PER_STEP = 4  # prompt groups per training step
GROUP = 2  # trajectories per prompt
MAX_AGE = 4  # the age bound of the README demo; lagged weights (0-2 steps) still leave slack
PRODUCERS = 4
MEDIAN_S = 0.002  # median rollout latency; one rollout in ten takes 10x as long
DISPATCH_TIMEOUT = 0.05  # a producer whose prompt waits longer re-reads the weights and tries again
TAKE_TIMEOUT = 30.0
HANG_SLACK_S = 10.0  # a call that returns this long after its timeout has hung (not a speed check)
LIMIT = (MAX_AGE + 1) * PER_STEP  # lookahead defaults to max_age


def latency(rng: random.Random) -> float:
    """A heavy-tailed rollout time: lognormal around the median, and a tenth of the prompts 10x the median."""
    base = MEDIAN_S * rng.lognormvariate(0.0, 0.5)
    return base * 10 if rng.random() < 0.1 else base


@dataclass
class Run:
    """What one scenario run saw."""

    taken: List[int] = field(default_factory=list)
    ages: List[int] = field(default_factory=list)
    max_age_in_training: int = 0  # largest age trained during the STEPS steps (the drain after them excluded)
    completed: List[int] = field(default_factory=list)
    trainer_wait_s: float = 0.0
    overruns: List[str] = field(default_factory=list)  # calls that outlived timeout + HANG_SLACK_S
    violations: List[str] = field(default_factory=list)  # ledger or limit checks that failed
    ledger: Dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


def check(buf, run: Run, lock: threading.Lock, bounded: bool) -> None:
    """One ledger snapshot after a call: both identities, and (pace) in flight + ready within the limit."""
    led = buf.ledger()
    problems = []
    if led["sampled_total"] != led["retired"] + led["dropped_stale"] + led["evicted"] + led["buffer_left"]:
        problems.append(f"trajectory identity broken: {led}")
    if led["dispatched"] != led["completed"] + led["failed"] + led["in_flight"]:
        problems.append(f"prompt identity broken: {led}")
    if bounded and led["in_flight"] + led["buffer_left"] // GROUP > LIMIT:
        problems.append(f"in flight + ready above the limit {LIMIT}: {led}")
    if problems:
        with lock:
            run.violations.extend(problems)


def timed(run: Run, lock: threading.Lock, what: str, timeout: float, call):
    start = time.monotonic()
    try:
        return call()
    finally:
        elapsed = time.monotonic() - start
        if elapsed > timeout + HANG_SLACK_S:
            with lock:
                run.overruns.append(f"{what} took {elapsed:.1f} s with timeout={timeout}")


def scenario(impl, strategy: str, seed: int = 0, steps: int = STEPS) -> Run:
    kwargs = {"prompts_per_step": PER_STEP} if strategy == "pace" else {}
    buf = impl(1 << 14, max_age=MAX_AGE, strategy=strategy, **kwargs)
    run, lock = Run(), threading.Lock()
    paced = strategy == "pace"
    published = [0]  # the weights version producers generate with: the step after the last one trained
    stop = threading.Event()  # producers: dispatch no more
    producers_done = threading.Event()  # the finisher: once set, an empty heap means every rollout has finished
    slots = threading.Semaphore(LIMIT)  # drop and wait: the same concurrency, capped as a rollout pool caps it
    pending: list = []  # (due time, prompt, dispatch step) heap of rollouts in progress
    pending_cv = threading.Condition()
    next_prompt = [0]

    def produce(index: int) -> None:
        rng = random.Random(seed * 100 + index)
        while not stop.is_set():
            if not paced and not slots.acquire(timeout=0.05):
                continue
            with lock:
                prompt = next_prompt[0]
                next_prompt[0] += 1
            step = max(0, published[0] - rng.randint(0, 2))  # weight lag 0-2 steps
            try:
                timed(
                    run,
                    lock,
                    "dispatch",
                    DISPATCH_TIMEOUT,
                    lambda prompt=prompt, step=step: buf.dispatch(
                        [prompt], step, timeout=DISPATCH_TIMEOUT if paced else None
                    ),
                )
            except (TimeoutError, pfb.AdmissionError):  # no slot in time, or the lagged weights are past use:
                continue  # try again with the weights in force then
            except pfb.BufferClosedError:
                return
            check(buf, run, lock, paced)
            with pending_cv:
                heapq.heappush(pending, (time.monotonic() + latency(rng), prompt, step))
                pending_cv.notify()

    def finish_rollouts() -> None:  # completes each rollout when its latency has passed
        while True:
            with pending_cv:
                while not pending or pending[0][0] > time.monotonic():
                    if producers_done.is_set() and not pending:  # not stop: a producer admitted just before
                        return  # stop may not have pushed its rollout yet, and it would stay in flight forever
                    pending_cv.wait(0.001 if pending else 0.01)
                _, prompt, _ = heapq.heappop(pending)
            trajs = [prompt * GROUP + j for j in range(GROUP)]
            buf.complete(trajs, [prompt] * GROUP, finish_step=published[0])
            if not paced:
                slots.release()
            with lock:
                run.completed.extend(trajs)
            check(buf, run, lock, paced)

    producers = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
    finisher = threading.Thread(target=finish_rollouts)
    threads = [*producers, finisher]
    start = time.monotonic()
    for thread in threads:
        thread.start()

    def train(step: int, timeout) -> None:
        began = time.monotonic()
        batch = timed(run, lock, "take", timeout or 0.0, lambda: buf.take(PER_STEP * GROUP, step, timeout=timeout))
        run.trainer_wait_s += time.monotonic() - began
        run.taken.extend(batch.traj_ids.tolist())
        run.ages.extend(batch.age.tolist())
        check(buf, run, lock, paced)

    try:
        for step in range(steps):
            while True:
                try:
                    train(step, TAKE_TIMEOUT)
                    break
                except TimeoutError as exc:  # a full batch did not arrive in time: report it, try the step again
                    run.violations.append(f"step {step}: {exc}")
                    if not all(thread.is_alive() for thread in threads):  # no retry can help: fail, never hang
                        raise RuntimeError("a producer or the rollout finisher died; its exception is above") from exc
            published[0] = step + 1
        run.max_age_in_training = max(run.ages)
    finally:
        stop.set()
        for thread in producers:
            thread.join(60)
        with pending_cv:
            producers_done.set()
            pending_cv.notify()
        finisher.join(60)
    # Drain: every rollout has finished; the trainer goes on taking a step's worth per step until nothing is left.
    step = steps
    while len(buf):
        train(step, None)
        step += 1
    run.wall_s = time.monotonic() - start
    run.ledger = buf.ledger()
    buf.close()
    return run


@pytest.mark.parametrize("seed", [0, 1])
def test_pace_bounds_age_drops_nothing_and_accounts_for_everything(impl, seed):
    run = scenario(impl, "pace", seed)
    led = run.ledger
    assert run.violations == [] and run.overruns == []
    assert led["dropped_stale"] == 0 and led["evicted"] == 0 and led["trained_over_age"] == 0
    assert max(run.ages) <= MAX_AGE
    assert sorted(run.taken) == sorted(run.completed)  # every trajectory taken exactly once
    assert len(set(run.taken)) == len(run.taken) == led["taken"]
    assert led["in_flight"] == 0 and led["buffer_left"] == 0 and led["failed"] == 0
    assert led["admitted"] == led["dispatched"]
    assert len(run.taken) >= STEPS * PER_STEP * GROUP


@pytest.mark.parametrize("strategy", ["drop", "wait", "pace"])
def test_report_the_same_scenario_under_each_strategy(strategy, capsys):
    """Reports, asserts only the accounting: what each strategy costs in discarded work, waiting and age."""
    run = scenario(pfb.StalenessBuffer, strategy)
    led = run.ledger
    generated = led["sampled_total"]
    never_trained = led["dropped_stale"] + led["evicted"]
    with capsys.disabled():
        print(
            f"\n{strategy:>5}: generated {generated} trajectories, never trained {never_trained} "
            f"({100 * never_trained / max(generated, 1):.1f}%), trained over max_age={MAX_AGE}: "
            f"{led['trained_over_age']}, max trained age {run.max_age_in_training} (in the drain {max(run.ages)}), "
            f"trainer waited "
            f"{run.trainer_wait_s:.2f} s of {run.wall_s:.2f} s, admission waits {led['admission_waits']}"
        )
    assert run.violations == [] and run.overruns == []
    assert generated == led["retired"] + never_trained  # everything generated was trained or counted
