"""One arm of the experiment: the asynchronous sample -> buffer -> train loop, and its records.

``interleave`` (the default) alternates one sampling step and the trainer's turn in one
thread, so a fixed seed gives identical records; asynchrony comes from the sync interval,
the lag, and prompts that stay in flight for several sampling steps. ``thread`` runs the
producer in its own thread against the wall clock: real concurrency, not reproducible.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import torch

from pyfast_buffer import StalenessBuffer
from pyfast_buffer.adaptive import AdaptiveMaxAge
from pyfast_buffer.batch import metrics_prefix

from . import batch_metrics, progress
from .config import ArmConfig, ExperimentConfig
from .policy import GRUPolicy
from .producer import Producer
from .requeue import RequeueProducer, shift
from .rollout import RolloutWorker
from .slots import SlotProducer
from .store import TrajectoryStore
from .task import DigitSumTask
from .trainer import Trainer

Record = Dict[str, Any]


class ArmRun:
    """Builds everything an arm needs from the shared config; ``run()`` returns its records."""

    def __init__(self, cfg: ExperimentConfig, arm: ArmConfig, show_progress: bool = False) -> None:
        self.cfg, self.arm, self.show_progress = cfg, arm, show_progress
        self.task = DigitSumTask(cfg.digits, cfg.length)
        torch.manual_seed(cfg.seed)  # identical initial weights in every arm
        self.policy = GRUPolicy(self.task.vocab_size, cfg.digits, hidden=cfg.hidden)
        self.buf = StalenessBuffer(
            cfg.capacity,
            max_age=arm.max_age,
            strategy=arm.strategy,
            max_uses=arm.reuse,
            parameter_sync_step=cfg.parameter_sync_step,
            track_released=cfg.requeue,  # the requeue producer learns which attempts were lost from released()
            max_attempts=arm.max_attempts,
            # pace: one trainer step takes batch_size trajectories, i.e. batch_size // group_size prompt groups
            prompts_per_step=cfg.batch_size // cfg.group_size if arm.strategy == "pace" else None,
            age_from="finish" if arm.in_flight_updates else "start",
        )
        attempts = cfg.ticks * (cfg.slots or cfg.prompts_per_tick)  # at most one dispatch per slot per step
        self.store = TrajectoryStore(attempts * cfg.group_size, self.task.prompt_len, cfg.length)
        self.trainer = Trainer(self.policy, cfg.lr, cfg.clip_eps)
        self.rollout = RolloutWorker(self.policy, cfg.parameter_sync_step, arm.lag)
        self.producer: Producer = (
            SlotProducer(cfg, self.task, self.buf, self.store, self.rollout, arm.in_flight_updates)
            if cfg.slots
            else (RequeueProducer if cfg.requeue else Producer)(cfg, self.task, self.buf, self.store, self.rollout)
        )
        self.trained_costs: list = []  # requeue: (difficulty, length, delay) of every trajectory on its first use
        eval_gen = torch.Generator().manual_seed(cfg.seed * 1000 + 4)
        self.eval_prompts = self.task.sample_prompts(cfg.eval_prompts, eval_gen)
        self.controller = (
            AdaptiveMaxAge(
                self.buf,
                target_kl=arm.target_kl,
                target_clip=arm.target_clip,
                min_age=cfg.adaptive_min_age,
                max_age=cfg.adaptive_max_age,
                initial=min(cfg.adaptive_max_age, max(cfg.adaptive_min_age, arm.max_age)),
            )
            if arm.adaptive
            else None
        )
        self.max_age = self.controller.value if self.controller else arm.max_age
        self.records: List[Record] = []
        self._lock = threading.Lock()  # thread mode: records and the policy are shared with the producer

    # -- records -----------------------------------------------------------------------------------
    def _base(self, kind: str, tick: int) -> Record:
        return {"kind": kind, "arm": self.arm.name, "seed": self.cfg.seed, "tick": tick, "step": self.trainer.step}

    def _ledger(self) -> Record:
        return {f"ledger/{k}": v for k, v in self.buf.ledger().items()}

    def evaluate(self, tick: int) -> None:
        """Greedy decoding of the trainer's current weights on the fixed eval prompts (training distribution)."""
        with self._lock:
            responses, _ = self.policy.sample(self.eval_prompts, self.cfg.length, torch.Generator(), greedy=True)
            score = float(self.task.reward(self.eval_prompts, responses).mean())
            self.records.append({**self._base("eval", tick), "eval_reward": score})

    def train_once(self, tick: int, batch: Any) -> None:
        step = self.trainer.step
        if isinstance(self.producer, RequeueProducer):
            self.trained_costs += self.producer.cost_of(batch.traj_ids[batch.uses == 1])
        stats = self.trainer.train_step(self.store, batch.traj_ids)
        self.rollout.on_step(self.trainer.step, self.policy)
        # In-flight updates: the push reaches running generations, which finish with these weights or later.
        restamped = self.buf.restamp_in_flight(self.rollout.weights_step) if self.arm.in_flight_updates else 0
        uses = torch.bincount(batch.uses, minlength=self.arm.reuse + 1)[1:].tolist()
        first = batch.age[batch.uses == 1]
        ages = torch.bincount(batch.age).tolist()
        row = {
            **self._base("step", tick),
            "step": step,
            "batch_size": len(batch),
            **stats,
            "value_loss": None,
            "max_age": self.max_age,
            "age_mean": batch_metrics.metric(batch, "age_mean"),
            "age_max": batch_metrics.metric(batch, "age_max"),
            "span_max": int(batch.span.max()) if len(batch) else 0,  # finish step - stamp (in-flight updates)
            "restamped": restamped,  # in-flight prompts this step's weight push restamped
            "age_min_first_use": int(first.min()) if len(first) else None,
            "dropped_stale": batch_metrics.metric(batch, "dropped_stale"),
            "buffer_left": batch_metrics.metric(batch, "buffer_left"),
            "in_flight": batch_metrics.metric(batch, "in_flight"),
            **batch_metrics.age_hist(batch),
            **{f"age_count/{a}": c for a, c in enumerate(ages) if c},
            **{f"uses/{i + 1}": c for i, c in enumerate(uses)},
            **self._ledger(),
        }
        if self.controller is not None:  # between trainer steps: the next take uses the new bound
            self.max_age = self.controller.update(stats)
            row["controller_signal"] = self.controller.signal
        self.records.append(row)

    # -- interleave --------------------------------------------------------------------------------
    def _evict_stale(self) -> int:
        """Under drop, drops every ready entry past max_age now (counted as dropped_stale), so the
        length check below counts only entries a take may hand out and every take is a full batch."""
        return self.buf.evict_stale(self.trainer.step) if self.arm.strategy == "drop" else 0

    def _trainer_turn(self, tick: int) -> Record:
        """Trains while a batch's worth is ready; returns how many steps ran and what stopped it."""
        steps, blocked_by = 0, ""
        evicted = self._evict_stale()
        cap = self.cfg.max_steps_per_tick
        while len(self.buf) >= self.cfg.batch_size and (not cap or steps < cap):
            batch = self.buf.take(self.cfg.batch_size, self.trainer.step)
            if len(batch) == 0:  # wait: an in-flight prompt sits at max_age; drop: all were stale
                blocked_by = batch_metrics.blocked_by(batch)
                break
            self.train_once(tick, batch)
            steps += 1
            evicted += self._evict_stale()
        return {"trainer_steps": steps, "blocked_by": blocked_by, "dropped_stale_before_take": evicted}

    def run(self) -> List[Record]:
        bar = progress.bar(self.cfg.ticks, self.arm.name, self.show_progress)
        try:
            self.evaluate(0)
            if self.cfg.mode == "thread":
                self._run_threaded(bar)
            else:
                for t in range(self.cfg.ticks):
                    sampled = self.producer.tick(t)
                    turn = self._trainer_turn(t)
                    self._after_tick(t, sampled, turn, bar)
        finally:
            bar.close()
        if isinstance(self.producer, RequeueProducer):
            self.records.append(self._bias_record())
        return self.records

    def _bias_record(self) -> Record:
        """The bias study's numbers for this arm: what the bound did to the data (docs/data-bias.md)."""
        producer = self.producer
        assert isinstance(producer, RequeueProducer)
        ticks = [r for r in self.records if r["kind"] == "tick"]
        led = self.buf.ledger()
        prefix = metrics_prefix()
        m = {k[len(prefix) :]: v for k, v in self.buf.data_metrics().items()}
        return {
            **self._base("bias", self.cfg.ticks),
            # Trained groups (first uses) per sampling step: what the generation hardware turned into training.
            "goodput": len(self.trained_costs) / self.cfg.group_size / max(len(ticks), 1),
            "generator_idle_share": producer.idle_slot_steps / max(producer.slot_capacity(len(ticks)), 1),
            "trained_over_age_share": led["trained_over_age"] / max(led["taken"], 1),
            "idle_share": sum(1 for r in ticks if not r["trainer_steps"]) / max(len(ticks), 1),
            "wasted_share": (led["dropped_stale"] + led["evicted"]) / max(led["sampled_total"], 1),
            "regenerations_per_prompt": m["retries"] / max(producer.prompts_seen, 1),
            "regenerated_share": m["regenerations"] / max(led["sampled_total"], 1),
            "starved_prompts": len(self.buf.starved()),
            "protected_groups": m["protected"],
            "length_ks_sketch": m.get("bias/length_ks"),
            **shift(self.trained_costs, producer.generated),
        }

    def _after_tick(self, t: int, sampled: Record, turn: Record, bar: Any) -> None:
        with self._lock:
            self.records.append(
                {
                    **self._base("tick", t),
                    **sampled,
                    **turn,
                    "buffer_left": len(self.buf),
                    "in_flight": self.buf.in_flight,
                    **self._ledger(),
                }
            )
        last = t + 1 == self.cfg.ticks
        # Thread mode: the final evaluation waits until the trainer has drained (see _run_threaded).
        if (last and self.cfg.mode != "thread") or (not last and (t + 1) % self.cfg.eval_interval == 0):
            self.evaluate(t + 1)
        bar.update(1)
        bar.set_postfix_str(f"step={self.trainer.step} reward={sampled['sample_reward'] or 0.0:.2f}")

    # -- thread ------------------------------------------------------------------------------------
    def _run_threaded(self, bar: Any) -> None:
        """The producer runs in a thread at its own pace; the trainer blocks in take(timeout=...)."""
        done = threading.Event()
        errors: List[BaseException] = []
        current = [0]

        def produce() -> None:
            try:
                for t in range(self.cfg.ticks):
                    current[0] = t
                    sampled = self.producer.tick(t)
                    untimed = {"trainer_steps": None, "blocked_by": "", "dropped_stale_before_take": None}
                    self._after_tick(t, sampled, untimed, bar)
                    time.sleep(self.cfg.tick_seconds)
            except BaseException as exc:  # surfaced in the trainer thread below
                errors.append(exc)
            finally:
                done.set()

        worker = threading.Thread(target=produce, name="pyfast-buffer-producer", daemon=True)
        worker.start()
        while True:
            with self._lock:
                self._evict_stale()
            try:
                batch = self.buf.take(self.cfg.batch_size, self.trainer.step, timeout=0.2)
            except TimeoutError:
                if done.is_set():
                    break
                continue
            with self._lock:
                self.train_once(current[0], batch)
        worker.join()
        if errors:
            raise errors[0]
        self.evaluate(self.cfg.ticks)  # the trainer's final weights, after it drained the buffer
