"""Runs verl's replay buffer and ours on the same tag stream on a real TransferQueue, and records what each did.

A stream is a program: rounds of "dispatch k prompts at step s, let the rollout make t moves, sample b groups
at step s and clear their trajectories as verl's trainer does" (async: sometimes ``get_sampleable_count`` or
``wait_for_sampleable`` instead), and, per prompt in dispatch
order, its planned outcome: finished or failed, how many of its sessions write a trajectory, each trajectory's
0/1 accuracy (DAPO's ``acc`` in ``extra_fields.reward_extra_info`` and the canonical reward in ``rm_scores``).

The rollout is deterministic: a move advances the oldest in-flight prompt (by uid, which follows dispatch order)
one state, pending -> running -> its planned end, trajectories written before the final status as verl's agent
loop does. When a sampler would wait, its poll hook makes one move instead of sleeping (verl:
``_wait_for_next_poll``; ours: ``_pause``), so both see the same states at the same points; a wait with nothing
left in flight is recorded as ``stuck``. ``refill_fn(k)`` dispatches the next k planned prompts at the current step.

The two runs use the same partition, one after the other (TransferQueue cleared between). The only change made to
verl's buffer is a subclass that hands its selection the sampleable set in uid order: verl sorts the set by step
with Python's stable sort, so among equal steps its order is the set's iteration order, which no caller controls;
uid order is one of the orders verl can produce, and the one ours uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import transfer_queue as tq

STATES = ("pending", "running")


class Stuck(Exception):
    """A sampler waited with nothing in flight: no move can ever satisfy it."""


@dataclass(frozen=True)
class Plan:
    """One prompt's planned end."""

    status: str  # "finished" or "failure"
    written: int  # sessions that write a trajectory
    values: tuple  # 0/1 per written session


@dataclass
class Round:
    dispatch: int
    step_up: int  # the trainer step advances by this much before the round
    moves: int
    batch: int
    probe: str  # "sample", "count" or "wait" (wait_for_sampleable, async only)


@dataclass
class Program:
    mode: str  # "sync" or "async"
    strategy: str
    threshold: Optional[int]
    metric: Optional[str]
    refill_failed: bool
    partition: str
    plans: list
    rounds: list


@dataclass
class Trace:
    events: list = field(default_factory=list)

    def add(self, *event: Any) -> None:
        self.events.append(event)


class Rollout:
    """The deterministic rollout both samplers see (see the module docstring)."""

    def __init__(self, program: Program, trace: Trace) -> None:
        self.program, self.trace = program, trace
        self.partition = program.partition
        self.dispatched = 0
        self.in_flight: dict[str, list] = {}  # uid -> [state, step, plan]
        self.step = 0

    def dispatch(self, count: int) -> int:
        uids = []
        for _ in range(count):
            index = self.dispatched
            self.dispatched += 1
            uid = f"p{index:05d}"
            plan = self.program.plans[index % len(self.program.plans)]
            self.in_flight[uid] = ["pending", self.step, plan]
            uids.append(uid)
        if uids:
            tags = [{"is_prompt": True, "status": "pending", "global_steps": self.step} for _ in uids]
            tq.kv_batch_put(keys=uids, partition_id=self.partition, tags=tags)
        return count

    def refill(self, count: int) -> int:
        self.trace.add("refill", count)
        return self.dispatch(count)

    def move(self) -> None:
        if not self.in_flight:
            self.trace.add("stuck")
            raise Stuck
        uid = min(self.in_flight)
        state, step, plan = self.in_flight[uid]
        tag = {"is_prompt": True, "global_steps": step}
        if state == "pending":
            self.in_flight[uid][0] = "running"
            tq.kv_put(key=uid, partition_id=self.partition, tag={**tag, "status": "running"})
            return
        values = plan.values[: plan.written]
        if values:  # one call for the group's trajectories (verl's agent loop writes them one by one)
            from verl.utils.tensordict_utils import list_of_dict_to_tensordict

            rows = [
                {
                    "rm_scores": torch.tensor([0.0, 0.0, float(v)]),
                    "extra_fields": {"reward_extra_info": {"acc": float(v)}},
                }
                for v in values
            ]
            tq.kv_batch_put(
                keys=[f"{uid}_{session}_0" for session in range(len(values))],
                partition_id=self.partition,
                tags=[{"global_steps": step, "seq_len": 3 + session} for session in range(len(values))],
                fields=list_of_dict_to_tensordict(rows),
            )
        tq.kv_put(key=uid, partition_id=self.partition, tag={**tag, "status": plan.status})
        del self.in_flight[uid]


def listed() -> dict:
    return {pid: dict(items) for pid, items in (tq.kv_list() or {}).items() if items}


def clear_all() -> None:
    for pid, items in listed().items():
        tq.kv_clear(keys=list(items), partition_id=pid)


def normal_metrics(metrics: dict) -> dict:
    """Metrics with floats rounded (verl's numpy mean and ours may differ in the last bit)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out[key] = {float(k): v for k, v in value.items()}
        elif isinstance(value, float) or hasattr(value, "dtype"):
            out[key] = round(float(value), 9)
        else:
            out[key] = value
    return out


def run(program: Program, make_sampler: Callable[[Callable[[int], int], Callable[[], None]], Any]) -> Trace:
    """Runs ``program`` against the sampler ``make_sampler(refill_fn, move)`` builds; returns the trace."""
    clear_all()
    trace = Trace()
    rollout = Rollout(program, trace)
    sampler = make_sampler(rollout.refill, rollout.move)
    for index, rnd in enumerate(program.rounds):
        rollout.step += rnd.step_up
        rollout.dispatch(rnd.dispatch)
        for _ in range(rnd.moves):
            if rollout.in_flight:
                rollout.move()
        try:
            if rnd.probe == "count":
                trace.add(index, "count", sampler.get_sampleable_count(rollout.step, program.partition))
            elif rnd.probe == "wait":
                ready, metrics = sampler.wait_for_sampleable(rollout.step, program.partition, rnd.batch)
                trace.add(index, "wait", sorted(ready), normal_metrics(metrics))
            else:
                batch, metrics = sampler.sample(rollout.step, program.partition, rnd.batch)
                rows = sorted(zip(batch.keys, (tuple(sorted(t.items())) for t in batch.tags)))
                trace.add(index, "sample", rows, normal_metrics(metrics))
                if batch.keys:  # the trainer's end of step (verl's fit): the batch's trajectories are cleared
                    tq.kv_clear(keys=list(batch.keys), partition_id=batch.partition_id)
        except Stuck:
            trace.add(index, "stuck")
            break
        except (RuntimeError, ValueError) as exc:  # verl's and ours raise the same types where verl raises
            trace.add(index, type(exc).__name__)
            break
        trace.add(index, "listed", sorted(listed().get(program.partition, {})))
    return trace


def verl_sampler(program: Program, refill: Callable, move: Callable) -> Any:
    """verl 0.9.1's own buffer for ``program``, polling by moving the rollout, ties in uid order."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

    base = ReplayBuffer if program.mode == "sync" else ReplayBufferAsync

    class Verl(base):  # type: ignore[misc, valid-type]
        def _wait_for_next_poll(self, partition_id: str, last_debug_time: float) -> float:
            move()
            return last_debug_time

        def _select_prompt_uids(self, partition_id: str, sampleable_keys: Any, batch_size: int) -> Any:
            return super()._select_prompt_uids(partition_id, sorted(sampleable_keys), batch_size)

    return Verl(**constructor_args(program, refill))


def our_sampler(program: Program, refill: Callable, move: Callable) -> Any:
    from pyfast_buffer.integrations.verl import ReplayBuffer, ReplayBufferAsync

    base = ReplayBuffer if program.mode == "sync" else ReplayBufferAsync

    class Ours(base):  # type: ignore[misc, valid-type]
        def _pause(self, partition_id: str, backoff: float, deadline: float) -> float:
            move()
            return backoff

    return Ours(**{**constructor_args(program, refill), "sampler_kwargs": {"timeout": 60}})


def constructor_args(program: Program, refill: Callable) -> dict:
    """verl's own buffer arguments, as its trainer passes them (DAPO and refills as arguments)."""
    args = {
        "trainer_mode": "sync" if program.mode == "sync" else "colocate_async",
        "trainer_config": {},
        "max_off_policy_threshold": program.threshold,
        "max_off_policy_strategy": program.strategy,
        "refill_fn": refill,
        "poll_interval": 0.0,
        "sampler_kwargs": {},
    }
    if program.metric is not None or program.refill_failed:
        args.update(filter_groups_metric=program.metric, sync_refill_failed_groups=program.refill_failed)
        if program.mode == "sync":
            args.update(train_batch_size=4, gen_batch_size=1, max_inflight_gen_batches=2)
    return args


def first_difference(a: Trace, b: Trace) -> Optional[str]:
    for i, (x, y) in enumerate(zip(a.events, b.events)):
        if x != y:
            return f"event {i}: verl {x!r} != ours {y!r}"
    if len(a.events) != len(b.events):
        return f"verl recorded {len(a.events)} events, ours {len(b.events)}"
    return None
