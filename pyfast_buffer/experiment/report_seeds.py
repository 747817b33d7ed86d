"""The multi-seed report: per arm, mean and 95% bootstrap interval of each summary number, the pairs of
arms whose intervals separate (and only those named as different), and the adaptive arms against the
fixed bounds."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .aggregate import BIAS_METRICS, BOOTSTRAP_SEED, LEVEL, METRICS, RESAMPLES, Interval, separated
from .summary import WINDOW

#: Higher is better for these (sample efficiency); lower is better for STABILITY (closer to on-policy).
EFFICIENCY = ("sample_reward_last", "eval_last")
STABILITY = ("clip_frac_late", "approx_kl_late")


def fmt(iv: Optional[Interval], digits: int) -> str:
    if iv is None:
        return "n/a"
    return f"{iv[0]:.{digits}f} [{iv[1]:.{digits}f}, {iv[2]:.{digits}f}]"


def _label(key: str) -> Tuple[str, int]:
    return next((label, digits) for k, label, digits in METRICS + BIAS_METRICS if k == key)


def differences(agg: Sequence[Dict[str, Any]]) -> List[str]:
    """Per metric, each arm and the arms whose intervals lie wholly below its own (the intervals are in the table).

    A pair where either arm lacks the value on some seed (entropy never halved) is not compared: the mean of the
    seeds that reached it is biased toward fast runs.
    """
    out = []
    for key, label, _ in METRICS:
        if key == "max_age_mean":  # set by the arm, not measured
            continue
        above: Dict[str, List[str]] = {}
        censored = False
        for i, a in enumerate(agg):
            for b in agg[i + 1 :]:
                if a[key + "_reached"] < a["n"] or b[key + "_reached"] < b["n"]:
                    censored = censored or bool(a[key + "_reached"] or b[key + "_reached"])
                    continue
                sign = separated(a[key], b[key])
                if sign:
                    hi, lo = (a, b) if sign > 0 else (b, a)
                    above.setdefault(hi["arm"], []).append(lo["arm"])
        text = (
            "; ".join(f"{hi} > {', '.join(los)}" for hi, los in above.items())
            if above
            else "no two arms' intervals separate (no difference shown)"
        )
        note = " (arms that did not reach it on every seed are not compared)" if censored else ""
        out.append(f"- {label}: {text}{note}")
    return out


def _fixed_peers(a: Dict[str, Any], agg: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    peers = [
        b
        for b in agg
        if not b["max_age_spec"].startswith("adaptive")
        and (b["reuse"], b["strategy"], b["lag"]) == (a["reuse"], a["strategy"], a["lag"])
    ]
    return sorted(peers, key=lambda b: int(b["max_age_spec"]))


def adaptive_lines(agg: Sequence[Dict[str, Any]]) -> List[str]:
    """Each adaptive arm against the loosest and the tightest fixed bound with its reuse, strategy and lag."""
    out = []
    for a in agg:
        if not a["max_age_spec"].startswith("adaptive"):
            continue
        peers = _fixed_peers(a, agg)
        if len(peers) < 2:
            out.append(
                f"- {a['arm']}: fewer than two fixed-max_age arms with the same reuse, strategy and lag; not compared."
            )
            continue
        tight, loose = peers[0], peers[-1]
        out.append(
            f"- {a['arm']} (mean max_age in force {fmt(a['max_age_mean'], 2)}) against the loosest fixed "
            f"bound ({loose['arm']}) on sample efficiency and the tightest ({tight['arm']}) on stability:"
        )
        for keys, peer, better in ((EFFICIENCY, loose, 1), (STABILITY, tight, -1)):
            for key in keys:
                label, digits = _label(key)
                sign = separated(a[key], peer[key])
                verdict = (
                    "intervals overlap: no difference shown"
                    if sign == 0
                    else "better, intervals separate"
                    if sign == better
                    else "worse, intervals separate"
                )
                out.append(f"    {label}: adaptive {fmt(a[key], digits)} vs {fmt(peer[key], digits)}: {verdict}")
    return out


def render(agg: Sequence[Dict[str, Any]], summaries: Sequence[Dict[str, Any]], cfg: Any, seeds: Sequence[int]) -> str:
    out = [
        f"In this configuration and step range: {cfg.ticks} sampling steps per run, {len(seeds)} seeds "
        f"({', '.join(map(str, seeds))}), every arm once per seed; task digit-sum ({cfg.length} digits in "
        f"[0,{cfg.digits})), group size {cfg.group_size}, batch {cfg.batch_size} trajectories, capacity "
        f"{cfg.capacity}, parameter_sync_step {cfg.parameter_sync_step}, mode {cfg.mode}.",
        f"Each number is the mean over seeds and its {LEVEL:.0%} percentile-bootstrap interval ({RESAMPLES} "
        f"resamples of the seeds, numpy generator seed {BOOTSTRAP_SEED}). Sampled reward is the mean over the "
        f"last {WINDOW:.0%} of sampling steps; clip fraction and approx KL over the second half of trainer "
        "steps; drop share = dropped stale / sampled.",
        "",
    ]
    for a in agg:
        reached = (
            f" (entropy halved on {a['entropy_half_tick_reached']} of {a['n']} seeds)"
            if a["entropy_half_tick_reached"] < a["n"]
            else ""
        )
        out.append(
            f"{a['arm']}: "
            + "; ".join(
                f"{label} {fmt(a[key], digits)}"
                for key, label, digits in METRICS
                if key != "max_age_mean" or a["max_age_spec"].startswith("adaptive")
            )
            + reached
            + "; ledger "
            + ("reconciles on every seed." if a["reconciled"] else "DOES NOT reconcile.")
        )
    out += ["", "Differences (named only where the two arms' intervals do not overlap):", *differences(agg)]
    adaptive = adaptive_lines(agg)
    if adaptive:
        out += ["", "Adaptive max_age against fixed bounds:", *adaptive]
    out += [
        "",
        f"These are short runs on a toy task with {len(seeds)} seeds: an overlap means this many seeds "
        "cannot tell the arms apart, not that they are equal, and a separation holds in this configuration "
        "and step range only.",
    ]
    return "\n".join(out)


def table(agg: Sequence[Dict[str, Any]]) -> str:
    """Two tables (efficiency, then stability and cost), one row per arm, cells 'mean [low, high]'."""
    blocks: Tuple[Tuple[str, ...], ...] = (
        ("sample_reward_last", "eval_last", "entropy_half_tick", "entropy_half_step"),
        ("clip_frac_late", "approx_kl_late", "drop_share", "stalled_ticks", "trainer_steps", "max_age_mean"),
    )
    if any("difficulty_ks" in a for a in agg):  # the bias study: what the bound did to the data
        blocks += (
            ("idle_share", "wasted_share", "regenerations_per_prompt", "starved_prompts"),
            ("difficulty_ks", "difficulty_shift", "length_ks", "length_shift", "latency_ks", "latency_shift"),
        )
    width = max(len(a["arm"]) for a in agg)
    lines = []
    for block in blocks:
        cells = [
            [
                fmt(a[k], _label(k)[1]) + (f" ({a[k + '_reached']}/{a['n']})" if a[k + "_reached"] < a["n"] else "")
                for k in block
            ]
            for a in agg
        ]
        widths = [max(len(_label(k)[0]), *(len(row[i]) for row in cells)) for i, k in enumerate(block)]
        lines.append("  ".join([f"{'arm':<{width}}"] + [f"{_label(k)[0]:>{w}}" for k, w in zip(block, widths)]))
        for a, row in zip(agg, cells):
            lines.append("  ".join([f"{a['arm']:<{width}}"] + [f"{c:>{w}}" for c, w in zip(row, widths)]))
        lines.append("")
    if any(a[k + "_reached"] < a["n"] for a in agg for k, _, _ in METRICS):
        lines.append(
            "(k/n): the value exists on k of the n seeds (entropy did not halve within the others); the "
            "interval is over those k"
        )
    return "\n".join(lines).rstrip()
