"""The goodput frontier: per strategy and max_age, what the runs trained per sampling step and what the data cost,
with each number's bootstrap interval over the seeds, and pace's goodput as a ratio of drop's on the same seed.

A ratio is taken seed by seed (the same seed gives both arms the same prompts, weights and rollout costs), then
bootstrapped like every other number (aggregate.bootstrap_interval).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .aggregate import Interval, bootstrap_interval
from .report_seeds import fmt

#: The numbers the frontier carries per point: (key in a run's summary, label, digits).
POINT_METRICS = (
    ("goodput", "goodput (trained groups per sampling step)", 3),
    ("length_ks", "length KS", 3),
    ("generator_idle_share", "generator idle", 3),
    ("idle_share", "trainer idle", 3),
    ("wasted_share", "generated, never trained", 3),
    ("trained_over_age_share", "trained over max_age", 3),
    ("age_mean", "age mean", 2),
    ("age_max", "age max", 0),
    ("eval_last", "greedy eval (final)", 3),
)
#: The goal of the study: pace's goodput at least this share of drop's at every max_age >= GOAL_MIN_AGE, with
#: nothing trained over the bound and the length KS below GOAL_KS.
GOAL_RATIO, GOAL_MIN_AGE, GOAL_KS = 0.95, 2, 0.02


def kind(run: Dict[str, Any]) -> str:
    """The strategy of a run as the frontier names it: drop, wait, pace, with "+inflight" for in-flight updates
    and "+att<k>" for max_attempts (so a capped drop arm is never taken for the drop reference)."""
    cap = f"+att{run['max_attempts']}" if run.get("max_attempts") else ""
    return run["strategy"] + ("+inflight" if run.get("in_flight_updates") else "") + cap


def _interval(values: Sequence[Optional[float]]) -> Optional[Interval]:
    kept = [float(v) for v in values if v is not None]
    return bootstrap_interval(kept) if kept else None


def frontier(runs: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One point per (kind, max_age) among runs that carry ``goodput`` (the slot or requeue producers), in
    max_age then kind order; empty when there are none."""
    runs = [r for r in runs if r.get("goodput") is not None and not r.get("adaptive")]
    drop = {
        (r["seed"], r["max_age"], bool(r.get("in_flight_updates"))): r["goodput"]
        for r in runs
        if kind(r) in ("drop", "drop+inflight") and r["reuse"] == 1
    }
    points = []
    for key in sorted({(r["max_age"], kind(r)) for r in runs if r["reuse"] == 1}):
        mine = [r for r in runs if (r["max_age"], kind(r)) == key and r["reuse"] == 1]
        point: Dict[str, Any] = {"max_age": key[0], "kind": key[1], "n": len(mine)}
        for metric, _, _ in POINT_METRICS:
            point[metric] = _interval([r.get(metric) for r in mine])
        # Against drop (ages from the dispatch), and against drop with the same in-flight updates (like for like).
        for name, inflight in (("goodput_vs_drop", False), ("goodput_vs_drop_same_updates", None)):
            ratios = [
                r["goodput"] / drop[ref]
                for r in mine
                for ref in [(r["seed"], r["max_age"], bool(r.get("in_flight_updates")) if inflight is None else False)]
                if drop.get(ref)  # a drop arm that trained nothing (or did not run) has no ratio
            ]
            point[name] = bootstrap_interval(ratios) if ratios else None
        points.append(point)
    return points


def goal_lines(points: Sequence[Dict[str, Any]]) -> List[str]:
    """The report's lines on the goal: pace (and pace+inflight) against drop at every max_age >= GOAL_MIN_AGE."""
    out = []
    for p in points:
        if not p["kind"].startswith("pace") or p["goodput_vs_drop"] is None:
            continue
        ratio, ks, over = p["goodput_vs_drop"], p["length_ks"], p["trained_over_age_share"]
        same = p.get("goodput_vs_drop_same_updates")
        like = (
            f" ({same[0]:.3f} [{same[1]:.3f}, {same[2]:.3f}] x drop with the same in-flight updates)"
            if same is not None and p["kind"].endswith("+inflight")
            else ""
        )
        checks = [
            ratio[0] >= GOAL_RATIO,
            over is not None and over[2] == 0,
            ks is not None and ks[0] < GOAL_KS,
        ]
        scope = "" if p["max_age"] >= GOAL_MIN_AGE else f" (below max_age {GOAL_MIN_AGE}: outside the goal)"
        out.append(
            f"- max_age {p['max_age']}, {p['kind']}: goodput {ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] x drop's "
            f"(goal >= {GOAL_RATIO}){like}, trained over max_age {over[0] if over else float('nan'):.3f}, length KS "
            f"{ks[0] if ks else float('nan'):.3f} (goal < {GOAL_KS}): "
            + ("goal met" if all(checks) else "goal NOT met")
            + scope
        )
    return out


def table(points: Sequence[Dict[str, Any]]) -> str:
    """One row per point: max_age, kind, goodput vs drop, and each POINT_METRICS mean [low, high]."""
    head = ["max_age", "kind", "goodput vs drop", "vs drop, same updates"] + [label for _, label, _ in POINT_METRICS]
    rows = []
    for p in points:
        cells = [str(p["max_age"]), p["kind"], fmt(p["goodput_vs_drop"], 3), fmt(p["goodput_vs_drop_same_updates"], 3)]
        cells += [fmt(p[m], d) for m, _, d in POINT_METRICS]
        rows.append(cells)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)] if rows else []
    lines = ["  ".join(f"{h:>{w}}" for h, w in zip(head, widths))]
    lines += ["  ".join(f"{c:>{w}}" for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)
