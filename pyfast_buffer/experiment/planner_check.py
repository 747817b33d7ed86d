"""The rhythm planner (``rhythm.plan``) against the ages an arm measured at the same rates.

The planner models a FIFO of single-use trajectories: ``produced_per_step`` in, ``consumed_per_step`` out
per trainer step, weights pushed every ``parameter_sync_step``, a constant latency, and the buffer those
rates give (one that fills and evicts its oldest when production outruns consumption, else one that the
trainer drains as it is fed). The experiment gives it the same numbers: production
per trainer step = trajectories completed per sampling step / trainer steps per sampling step,
consumption = the batch size, the buffer's capacity, the sync step, and the rollout lag as the constant
latency (a lag of L trainer steps ages every trajectory by L, as a latency would). The random part of the
experiment's latency (``--latency-mean``) is not modelled, and neither are reuse (> 1) or drops, so only a
reuse-1 arm is compared; the ``fifo`` preset is the case where every assumption holds.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from pyfast_buffer.workflow.plan import plan

from .config import ArmConfig, ExperimentConfig

Record = Dict[str, Any]
#: Steady state: the ages of trainer steps taken in the second half of the sampling steps.
STEADY_FROM = 0.5


def measured_ages(records: Sequence[Record], arm: str, seed: Optional[int], ticks: int) -> Dict[int, int]:
    """Trajectories trained on per age (trainer steps), over the steady-state trainer steps of one run."""
    counts: Dict[int, int] = {}
    for r in records:
        if r["kind"] != "step" or r["arm"] != arm or (seed is not None and r.get("seed") != seed):
            continue
        if r["tick"] < STEADY_FROM * ticks:
            continue
        for key, value in r.items():
            if key.startswith("age_count/"):
                age = int(key.split("/")[1])
                counts[age] = counts.get(age, 0) + value
    return dict(sorted(counts.items()))


def total_variation(p: Dict[int, float], q: Dict[int, float]) -> float:
    """Half the L1 distance between two distributions over ages (0 = identical, 1 = disjoint)."""
    return 0.5 * sum(abs(p.get(a, 0.0) - q.get(a, 0.0)) for a in set(p) | set(q))


def compare(
    records: Sequence[Record], cfg: ExperimentConfig, arm: ArmConfig, seed: Optional[int] = None
) -> Optional[Dict[str, Any]]:
    """Planner prediction and measurement for one reuse-1 run, or None when the arm is not comparable."""
    if arm.reuse != 1 or arm.adaptive or arm.strategy == "pace" or cfg.requeue:
        return None  # the planner models neither pace's admission nor requeued prompts
    counts = measured_ages(records, arm.name, seed, cfg.ticks)
    total = sum(counts.values())
    steady = [
        r
        for r in records
        if r["kind"] == "tick"
        and r["arm"] == arm.name
        and (seed is None or r.get("seed") == seed)
        and r["tick"] >= STEADY_FROM * cfg.ticks
    ]
    steps = sum(r["trainer_steps"] or 0 for r in steady)
    if not total or not steps:
        return None
    produced = cfg.prompts_per_tick * cfg.group_size * (1.0 - cfg.fail_prob) * len(steady) / steps
    p = plan(
        produced,
        cfg.batch_size,
        cfg.capacity,
        cfg.parameter_sync_step,
        max_age=arm.max_age,
        strategy=arm.strategy,
        latency_steps=arm.lag,
    )
    measured = {a: c / total for a, c in counts.items()}
    mean = sum(a * s for a, s in measured.items())
    return {
        "arm": arm.name,
        "seed": seed,
        "produced_per_step": produced,
        "consumed_per_step": cfg.batch_size,
        "capacity": cfg.capacity,
        "parameter_sync_step": cfg.parameter_sync_step,
        "latency_steps": arm.lag,
        "planned": dict(p.age_distribution),
        "measured": measured,
        "planned_mean": p.age_mean,
        "measured_mean": mean,
        "tv_distance": total_variation(p.age_distribution, measured),
        "buffer_full_share": sum(
            1 for r in steady if r["buffer_left"] + cfg.batch_size * (r["trainer_steps"] or 0) >= cfg.capacity
        )
        / len(steady),
        "planned_fills": p.fills,
        "steady_steps": steps,
        "steps_to_fill": cfg.capacity / (produced - cfg.batch_size) if produced > cfg.batch_size else None,
        "random_latency": cfg.latency_mean > 0 or cfg.fail_prob > 0,
        "latency_mean": cfg.latency_mean,
        "max_latency": cfg.max_latency,
        "fail_prob": cfg.fail_prob,
    }


def render(checks: Sequence[Dict[str, Any]]) -> List[str]:
    """The report's side-by-side section: per age, the planned and the measured share of trained trajectories."""
    if not checks:
        return ["Rhythm planner vs measured ages: no reuse-1 arm ran (the planner models single-use FIFO only)."]
    out = [
        f"Rhythm planner (rhythm.plan) vs measured ages of trained trajectories, steady state (sampling steps from "
        f"{STEADY_FROM:.0%} of the run on):"
    ]
    for c in checks:
        out.append(
            f"- {c['arm']}"
            + (f" seed {c['seed']}" if c["seed"] is not None else "")
            + f": plan(produced_per_step={c['produced_per_step']:.4g}, "
            f"consumed_per_step={c['consumed_per_step']}, "
            f"capacity={c['capacity']}, parameter_sync_step={c['parameter_sync_step']}, "
            f"latency_steps={c['latency_steps']})"
        )
        ages = sorted(set(c["planned"]) | set(c["measured"]))
        out.append("    age      " + "".join(f"{a:>7}" for a in ages) + "     mean")
        out.append(
            "    planned  "
            + "".join(f"{c['planned'].get(a, 0.0):>7.1%}" for a in ages)
            + f"  {c['planned_mean']:>7.2f}"
        )
        out.append(
            "    measured "
            + "".join(f"{c['measured'].get(a, 0.0):>7.1%}" for a in ages)
            + f"  {c['measured_mean']:>7.2f}"
        )
        why = []
        fills = c.get("planned_fills", True)
        if fills and c["buffer_full_share"] < 0.5:
            to_fill = c.get("steps_to_fill")
            why.append(
                f"the planner models a buffer that fills, but it was full on only {c['buffer_full_share']:.0%} "
                "of these sampling steps"
                + (
                    f": production exceeds consumption by {c['produced_per_step'] - c['consumed_per_step']:.3g} a "
                    f"trainer step, so filling capacity {c['capacity']} takes about {to_fill:.0f} trainer steps, "
                    f"more than the {c.get('steady_steps', 0)} measured here (a longer run, or a smaller capacity, "
                    "reaches the planned state)"
                    if to_fill is not None and to_fill > c.get("steady_steps", 0)
                    else ""
                )
            )
        elif not fills and c["buffer_full_share"] >= 0.5:
            why.append(
                f"the planner models a buffer that never fills, but it was full on {c['buffer_full_share']:.0%} "
                "of these sampling steps (bursts of late completions fill it)"
            )
        if c["random_latency"]:
            why.append(
                f"assumption not met: the plan adds a constant latency of {c['latency_steps']} step(s), while "
                f"this run's latency is random (geometric, mean {c.get('latency_mean', 0):g} sampling steps, up "
                f"to {c.get('max_latency', 0)}) and {c.get('fail_prob', 0):.0%} of prompts fail; with "
                "--latency-mean 0 --max-latency 0 --fail-prob 0 (the fifo preset) every assumption holds and "
                "the two agree within total variation 0.05"
            )
        out.append(f"    total variation distance {c['tv_distance']:.3f}" + (f" ({'; '.join(why)})" if why else ""))
    return out
