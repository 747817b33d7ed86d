"""Per-arm numbers computed from the records: windows at the start and end, ledger, reuse, ages."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from pyfast_buffer.workflow.audit import ledger_gap

#: The bias study's per-arm numbers (ArmRun._bias_record), in summary.json when the run requeues lost prompts.
BIAS_KEYS = (
    "goodput",
    "generator_idle_share",
    "trained_over_age_share",
    "idle_share",
    "wasted_share",
    "regenerations_per_prompt",
    "regenerated_share",
    "starved_prompts",
    "protected_groups",
    "length_ks_sketch",
    "difficulty_ks",
    "difficulty_shift",
    "length_ks",
    "length_shift",
    "latency_ks",
    "latency_shift",
)
#: Share of the sampling steps in the "first" and "last" windows the report compares.
WINDOW = 0.2

Record = Dict[str, Any]


def _mean(values: Sequence[float]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _window(rows: Sequence[Record], key: str, ticks: int, last: bool) -> Optional[float]:
    width = max(1, int(ticks * WINDOW))
    lo, hi = (ticks - width, ticks) if last else (0, width)
    return _mean([r[key] for r in rows if lo <= r["tick"] < hi])


def per_tick(rows: Sequence[Record], key: str) -> Tuple[List[int], List[float]]:
    """The sampling steps that have rows, and the mean ``key`` of each one's rows (the figure uses it too)."""
    by_tick: Dict[int, List[float]] = {}
    for r in rows:
        if r.get(key) is not None:  # e.g. no sample_reward on a step pace admitted nothing
            by_tick.setdefault(r["tick"], []).append(r[key])
    ticks = sorted(by_tick)
    return ticks, [sum(by_tick[t]) / len(by_tick[t]) for t in ticks]


def _idle_share(tick_rows: Sequence[Record]) -> Optional[float]:
    """Share of the sampling steps on which the trainer took no step (None in thread mode, which does not count)."""
    counted = [r["trainer_steps"] for r in tick_rows if r.get("trainer_steps") is not None]
    return sum(1 for n in counted if not n) / len(counted) if counted else None


def first_tick_below(rows: Sequence[Record], key: str, level: float) -> Optional[int]:
    """The first sampling step whose mean ``key`` over its trainer steps is at or below ``level``."""
    for tick, value in zip(*per_tick(rows, key)):
        if value <= level:
            return tick
    return None


def first_use(steps: Sequence[Record]) -> List[Record]:
    """Trainer steps whose every entry was on its first use (no reuse pass): comparable across reuse."""
    return [r for r in steps if r.get("uses/1") == r["batch_size"]]


def summarise(records: Sequence[Record], arm: Any, ticks: int, seed: Optional[int] = None) -> Dict[str, Any]:
    """Returns the numbers the report and the summary table show for one arm (of one seed, when given)."""
    mine = [r for r in records if r["arm"] == arm.name and (seed is None or r.get("seed") == seed)]
    steps = [r for r in mine if r["kind"] == "step"]
    tick_rows = [r for r in mine if r["kind"] == "tick"]
    evals = [r for r in mine if r["kind"] == "eval"]
    ledger = {k[len("ledger/") :]: v for k, v in tick_rows[-1].items() if k.startswith("ledger/")}
    uses = {int(k.split("/")[1]): 0 for k in steps[0] if k.startswith("uses/")} if steps else {}
    for r in steps:
        for k in uses:
            uses[k] += r[f"uses/{k}"]
    entropy0: Optional[float] = steps[0]["entropy"] if steps else None
    half = len(steps) // 2
    fresh = first_use(steps)
    half_tick = first_tick_below(steps, "entropy", entropy0 / 2) if entropy0 is not None else None
    half_step = next((r["step"] + 1 for r in steps if r["tick"] == half_tick), None)
    bounds = [r["max_age"] for r in steps if "max_age" in r]
    bias = next((r for r in mine if r["kind"] == "bias"), {})  # the bias study's numbers (requeue runs only)
    return {
        **{k: bias.get(k) for k in BIAS_KEYS if bias},
        "max_attempts": getattr(arm, "max_attempts", None),
        "in_flight_updates": getattr(arm, "in_flight_updates", False),
        "trainer_idle_share": _idle_share(tick_rows),
        "prompts_skipped": sum(r.get("prompts_skipped", 0) for r in tick_rows),
        "trained_over_age": ledger.get("trained_over_age", 0),
        "arm": arm.name,
        "seed": seed if seed is not None else (mine[0].get("seed") if mine else None),
        "reuse": arm.reuse,
        "strategy": arm.strategy,
        "max_age": arm.max_age,
        "lag": arm.lag,
        "adaptive": arm.adaptive,
        "max_age_spec": arm.max_age_spec,
        "max_age_mean": _mean(bounds),  # the bound in force at each take (moves on adaptive arms)
        "age_over_bound": any(r["age_max"] > r["max_age"] for r in steps if "max_age" in r),
        "max_age_changes": sum(1 for a, b in zip(bounds, bounds[1:]) if a != b),
        "drop_share": ledger["dropped_stale"] / ledger["sampled_total"] if ledger.get("sampled_total") else 0.0,
        "trainer_steps": len(steps),
        "stalled_ticks": sum(1 for r in tick_rows if r["blocked_by"] == "in_flight_at_max_age"),
        "sample_reward_first": _window(tick_rows, "sample_reward", ticks, last=False),
        "sample_reward_last": _window(tick_rows, "sample_reward", ticks, last=True),
        "eval_first": evals[0]["eval_reward"] if evals else None,
        "eval_last": evals[-1]["eval_reward"] if evals else None,
        "eval_best": max(r["eval_reward"] for r in evals) if evals else None,
        "loss_first": _window(steps, "policy_loss", ticks, last=False),
        "loss_last": _window(steps, "policy_loss", ticks, last=True),
        "entropy_first": entropy0,
        "entropy_last": _window(steps, "entropy", ticks, last=True),
        "loss_first_fresh": _window(fresh, "policy_loss", ticks, last=False),
        "loss_last_fresh": _window(fresh, "policy_loss", ticks, last=True),
        "fresh_steps": len(fresh),
        "entropy_half_tick": half_tick,
        "entropy_half_step": half_step,
        "clip_frac_late": _mean([r["clip_frac"] for r in steps[half:]]),
        "approx_kl_late": _mean([r["approx_kl"] for r in steps[half:]]),
        "age_mean": _mean([r["age_mean"] for r in steps]),
        "age_max": max((r["age_max"] for r in steps), default=None),
        "uses_hist": uses,
        "max_uses_seen": max((k for k, c in uses.items() if c), default=0),
        "ledger": ledger,
        "reconciled": reconciles(ledger),
    }


def bound_kept(s: Dict[str, Any]) -> bool:
    """True when no trajectory of the run was trained older than the arm's max_age (step records and ledger)."""
    return not s.get("age_over_bound") and not s.get("trained_over_age")


def reconciles(ledger: Dict[str, int]) -> bool:
    """Both ledger identities hold (docs/design.md, "The ledger"); the first via audit.ledger_gap, written once."""
    gap = ledger_gap(
        ledger["sampled_total"], ledger["retired"], ledger["dropped_stale"], ledger["evicted"], ledger["buffer_left"]
    )
    return gap == 0 and ledger["dispatched"] == ledger["completed"] + ledger["failed"] + ledger["in_flight"]
