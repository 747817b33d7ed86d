"""The goodput frontier: per strategy and max_age, what the runs trained per sampling step and what the data cost,
with each number's bootstrap interval over the seeds, and pace's goodput as a ratio of drop's on the same seed.

A ratio is taken seed by seed (the same seed gives both arms the same initial weights and the same stream of fresh
prompts; rollout costs are drawn per attempt, so they match only while the arms make the same attempts), then
bootstrapped like every other number (aggregate.bootstrap_interval). Arms are compared only at the same max_age and
lag (the key of a point).
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
    """One point per (max_age, lag, kind) among the reuse-1, fixed-bound runs that carry ``goodput`` (the slot or
    requeue producers), in that order; empty when there are none."""
    runs = [r for r in runs if r.get("goodput") is not None and not r.get("adaptive") and r["reuse"] == 1]
    drop = {
        (r["seed"], r["max_age"], r["lag"], bool(r.get("in_flight_updates"))): r["goodput"]
        for r in runs
        if kind(r) in ("drop", "drop+inflight")
    }
    points = []
    for key in sorted({(r["max_age"], r["lag"], kind(r)) for r in runs}):
        mine = [r for r in runs if (r["max_age"], r["lag"], kind(r)) == key]
        point: Dict[str, Any] = {"max_age": key[0], "lag": key[1], "kind": key[2], "n": len(mine)}
        for metric, _, _ in POINT_METRICS:
            point[metric] = _interval([r.get(metric) for r in mine])
        # Against drop (ages from the dispatch), and against drop with the same in-flight updates (like for like).
        for name, like_for_like in (("goodput_vs_drop", False), ("goodput_vs_drop_same_updates", True)):
            ratios = [
                r["goodput"] / drop[ref]
                for r in mine
                for ref in [(r["seed"], r["max_age"], r["lag"], like_for_like and bool(r.get("in_flight_updates")))]
                if drop.get(ref)  # a drop arm that trained nothing (or did not run) has no ratio
            ]
            point[name] = bootstrap_interval(ratios) if ratios else None
        points.append(point)
    return points


def goal_lines(points: Sequence[Dict[str, Any]]) -> List[str]:
    """The report's lines on the goal: each pace kind against drop at every max_age >= GOAL_MIN_AGE, like for like
    (pace with in-flight updates against drop with the same updates; the ratio to plain drop is shown beside it)."""
    out = []
    for p in points:
        inflight = p["kind"].endswith("+inflight")
        ratio = p["goodput_vs_drop_same_updates"] if inflight else p["goodput_vs_drop"]
        if not p["kind"].startswith("pace") or ratio is None:
            continue
        ks, over, plain = p["length_ks"], p["trained_over_age_share"], p["goodput_vs_drop"]
        checks = [ratio[0] >= GOAL_RATIO, over is not None and over[2] == 0, ks is not None and ks[0] < GOAL_KS]
        scope = "" if p["max_age"] >= GOAL_MIN_AGE else f" (below max_age {GOAL_MIN_AGE}: outside the goal)"
        reference = "drop with the same in-flight updates" if inflight else "drop"
        beside = f"; {plain[0]:.3f} [{plain[1]:.3f}, {plain[2]:.3f}] x plain drop" if inflight and plain else ""
        out.append(
            f"- max_age {p['max_age']}, lag {p['lag']}, {p['kind']}: goodput {ratio[0]:.3f} [{ratio[1]:.3f}, "
            f"{ratio[2]:.3f}] x {reference} (goal >= {GOAL_RATIO}){beside}; trained over max_age "
            f"{over[0] if over else float('nan'):.3f}; length KS {ks[0] if ks else float('nan'):.3f} (goal < "
            f"{GOAL_KS}): " + ("goal met" if all(checks) else "goal NOT met") + scope
        )
    return out


def table(points: Sequence[Dict[str, Any]]) -> str:
    """One row per point: max_age, kind, goodput vs drop, and each POINT_METRICS mean [low, high]."""
    head = ["max_age", "lag", "kind", "goodput vs drop", "vs drop, same updates"]
    head += [label for _, label, _ in POINT_METRICS]
    rows = []
    for p in points:
        cells = [str(p["max_age"]), str(p["lag"]), p["kind"], fmt(p["goodput_vs_drop"], 3)]
        cells.append(fmt(p["goodput_vs_drop_same_updates"], 3))
        cells += [fmt(p[m], d) for m, _, d in POINT_METRICS]
        rows.append(cells)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)] if rows else []
    lines = ["  ".join(f"{h:>{w}}" for h, w in zip(head, widths))]
    lines += ["  ".join(f"{c:>{w}}" for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)
