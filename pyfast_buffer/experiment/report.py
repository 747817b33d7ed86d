"""The text report: what each arm did in this configuration and step range, and which signs of the
procedure (seeds/000) appear, each decided by an explicit threshold on the recorded data.

A reuse > 1 arm is compared with its baseline: the reuse-1 arm with the same strategy,
max_age and lag. Without such a baseline the comparisons are skipped and the report says so.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .summary import WINDOW

#: "loss falls": the arm's late policy loss sits at least this far below its baseline's.
LOSS_MARGIN = 0.02
#: "reward does not follow": the arm's late sampled reward is less than this above its baseline's.
REWARD_MARGIN = 0.02
#: "entropy falls faster": the arm halves its entropy at most this share of the baseline's sampling steps.
ENTROPY_SPEEDUP = 0.8
#: "clip fraction stays high": mean clip fraction over the second half of trainer steps at least this...
CLIP_HIGH = 0.10
#: ...and at least this many times the baseline's.
CLIP_RATIO = 2.0


def _f(x: Optional[float], digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def baseline_of(s: Dict[str, Any], summaries: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    for b in summaries:
        if b["reuse"] == 1 and (b["strategy"], b["max_age"], b["lag"]) == (s["strategy"], s["max_age"], s["lag"]):
            return b
    return None


def signs(s: Dict[str, Any], base: Dict[str, Any]) -> List[str]:
    """The procedure's signs that the data show for arm ``s`` against its reuse-1 ``base``, in words."""
    found = []
    if (None not in (s["loss_last"], base["loss_last"], s["sample_reward_last"], base["sample_reward_last"])
            and s["loss_last"] <= base["loss_last"] - LOSS_MARGIN
            and s["sample_reward_last"] < base["sample_reward_last"] + REWARD_MARGIN):
        found.append(f"training loss falls while sampled reward does not follow: late policy loss "
                     f"{_f(s['loss_last'])} vs {_f(base['loss_last'])} (>= {LOSS_MARGIN} lower), late sampled "
                     f"reward {_f(s['sample_reward_last'])} vs {_f(base['sample_reward_last'])} "
                     f"(not {REWARD_MARGIN} higher)")
    t, tb = s["entropy_half_tick"], base["entropy_half_tick"]
    if t is not None and (tb is None or t <= ENTROPY_SPEEDUP * tb):
        found.append(f"entropy falls faster: it halved by sampling step {t}, the baseline "
                     + (f"by step {tb}" if tb is not None else "not within the run")
                     + f" (threshold: at most {ENTROPY_SPEEDUP:.0%} of the baseline's steps)")
    c, cb = s["clip_frac_late"], base["clip_frac_late"]
    if c is not None and cb is not None and c >= CLIP_HIGH and c >= CLIP_RATIO * cb:
        found.append(f"clip fraction stays high: {_f(c)} on average over the second half of trainer steps, "
                     f"baseline {_f(cb)} (thresholds: >= {CLIP_HIGH} and >= {CLIP_RATIO:g}x baseline)")
    return found


def arm_lines(s: Dict[str, Any]) -> List[str]:
    led = s["ledger"]
    sampled = max(1, led["sampled_total"])
    uses = ", ".join(f"{k}x: {v}" for k, v in sorted(s["uses_hist"].items()))
    return [
        f"{s['arm']}: {s['trainer_steps']} trainer steps; sampled reward {_f(s['sample_reward_first'])} -> "
        f"{_f(s['sample_reward_last'])} (first/last {WINDOW:.0%} of sampling steps); greedy eval "
        f"{_f(s['eval_first'])} -> {_f(s['eval_last'])}; entropy {_f(s['entropy_first'])} -> "
        f"{_f(s['entropy_last'])}; clip fraction {_f(s['clip_frac_late'])} and approx KL "
        f"{_f(s['approx_kl_late'], 4)} over the second half; mean age of trained data {_f(s['age_mean'], 2)} steps.",
        f"  trajectories: {led['retired']} retired, {led['dropped_stale']} dropped stale "
        f"({led['dropped_stale'] / sampled:.0%}), {led['evicted']} evicted ({led['evicted'] / sampled:.0%}), "
        f"{led['buffer_left']} left of {led['sampled_total']} sampled; uses per taken entry: {uses}; "
        f"trainer blocked (wait) on {s['stalled_ticks']} sampling steps; ledger "
        + ("reconciles." if s["reconciled"] else "DOES NOT reconcile."),
    ]


def render(summaries: Sequence[Dict[str, Any]], cfg: Any) -> str:
    """Returns the report text: configuration, per-arm observations, the signs, and the limits."""
    out = [f"In this configuration and step range: {cfg.ticks} sampling steps per arm, seed {cfg.seed}, "
           f"task digit-sum ({cfg.length} digits in [0,{cfg.digits})), group size {cfg.group_size}, batch "
           f"{cfg.batch_size} trajectories, capacity {cfg.capacity}, parameter_sync_step "
           f"{cfg.parameter_sync_step}, mode {cfg.mode}.", ""]
    for s in summaries:
        out.extend(arm_lines(s))
    out.append("")
    out.append("Signs from the procedure (each reuse > 1 arm against the reuse-1 arm with the same strategy, "
               "max_age and lag):")
    for s in summaries:
        if s["reuse"] == 1:
            continue
        base = baseline_of(s, summaries)
        if base is None:
            out.append(f"- {s['arm']}: no reuse-1 arm with the same strategy, max_age and lag ran; not compared.")
            continue
        found = signs(s, base)
        if not found:
            out.append(f"- {s['arm']} vs {base['arm']}: none of the three signs appears.")
        for line in found:
            out.append(f"- {s['arm']} vs {base['arm']}: {line}.")
    if all(s["reuse"] == 1 for s in summaries):
        out.append("- every arm has reuse 1: nothing to compare.")
    out += ["", "These are short runs with one fixed seed on a toy task: they show direction in this range only, "
            "not what longer training or another task would do, and a gap between two arms can be seed noise "
            "(rerun with another --seed before trusting it)."]
    return "\n".join(out)


def table(summaries: Sequence[Dict[str, Any]]) -> str:
    """The final summary table, one row per arm."""
    cols = [("arm", 24, lambda s: s["arm"]), ("steps", 6, lambda s: s["trainer_steps"]),
            ("reward first", 12, lambda s: _f(s["sample_reward_first"])),
            ("reward last", 11, lambda s: _f(s["sample_reward_last"])), ("eval last", 9, lambda s: _f(s["eval_last"])),
            ("entropy", 7, lambda s: _f(s["entropy_last"])), ("clip", 5, lambda s: _f(s["clip_frac_late"], 2)),
            ("age", 5, lambda s: _f(s["age_mean"], 1)), ("retired", 7, lambda s: s["ledger"]["retired"]),
            ("dropped", 7, lambda s: s["ledger"]["dropped_stale"]), ("evicted", 7, lambda s: s["ledger"]["evicted"]),
            ("left", 5, lambda s: s["ledger"]["buffer_left"]), ("stalls", 6, lambda s: s["stalled_ticks"]),
            ("ledger", 6, lambda s: "ok" if s["reconciled"] else "BAD")]
    lines = ["  ".join(f"{name:>{w}}" if i else f"{name:<{w}}" for i, (name, w, _) in enumerate(cols))]
    for s in summaries:
        lines.append("  ".join(f"{str(get(s)):>{w}}" if i else f"{str(get(s)):<{w}}"
                               for i, (_, w, get) in enumerate(cols)))
    return "\n".join(lines)
