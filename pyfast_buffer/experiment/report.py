"""The text report: what each arm did in this configuration and step range, and which signs of the
procedure (docs/workflow.md) appear, each decided by an explicit threshold on the recorded data.

A reuse > 1 arm is compared with its baseline: the reuse-1 arm with the same strategy,
max_age and lag. Without such a baseline the comparisons are skipped and the report says so.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .summary import WINDOW, bound_kept

#: "loss falls while sampled reward does not follow", on within-arm trends (last minus first WINDOW of
#: sampling steps). The loss is taken on first-use trainer steps only (every entry on its first use),
#: because reuse passes 2..k start from a lower surrogate by construction. The arm's first-use loss
#: must fall by at least this much more than its baseline's...
LOSS_MARGIN = 0.02
#: ...while its sampled reward rises by less than the baseline's rise plus this.
REWARD_MARGIN = 0.02
#: "entropy falls faster": the arm halves its entropy within this share of the baseline's sampling steps
#: AND within this share of the baseline's trainer steps (reuse k takes up to k x the trainer steps).
ENTROPY_SPEEDUP = 0.8
#: "clip fraction stays high": mean clip fraction over the second half of trainer steps at least this...
CLIP_HIGH = 0.10
#: ...and at least this many times the baseline's.
CLIP_RATIO = 2.0


#: The three signs ``signs`` checks, in short; the report names them where it says none appears.
SIGN_NAMES = (
    "first-use loss falls more than the baseline's while sampled reward does not rise more",
    "entropy halves sooner per sampling step and per trainer step",
    f"clip fraction stays high (>= {CLIP_HIGH} and >= {CLIP_RATIO:g}x the baseline's)",
)


def _f(x: Optional[float], digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def baseline_of(s: Dict[str, Any], summaries: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    for b in summaries:
        if b["reuse"] == 1 and (b["strategy"], b["max_age"], b["lag"]) == (s["strategy"], s["max_age"], s["lag"]):
            return b
    return None


def _trend(last: Optional[float], first: Optional[float]) -> Optional[float]:
    return None if last is None or first is None else last - first


def signs(s: Dict[str, Any], base: Dict[str, Any]) -> List[str]:
    """The procedure's signs that the data show for arm ``s`` against its reuse-1 ``base``, in words."""
    found = []
    dl = _trend(s["loss_last_fresh"], s["loss_first_fresh"])
    dlb = _trend(base["loss_last_fresh"], base["loss_first_fresh"])
    dr = _trend(s["sample_reward_last"], s["sample_reward_first"])
    drb = _trend(base["sample_reward_last"], base["sample_reward_first"])
    if (
        dl is not None
        and dlb is not None
        and dr is not None
        and drb is not None
        and dl <= dlb - LOSS_MARGIN
        and dr < drb + REWARD_MARGIN
    ):
        found.append(
            f"first-use training loss falls more than the baseline's while sampled reward does not rise "
            f"more: first-use policy loss changed {dl:+.3f} vs {dlb:+.3f} (threshold: at least "
            f"{LOSS_MARGIN} more fall), sampled reward changed {dr:+.3f} vs {drb:+.3f} (threshold: less "
            f"than {REWARD_MARGIN} above the baseline's change); changes are last minus first {WINDOW:.0%} "
            f"of sampling steps"
        )
    t, tb = s["entropy_half_tick"], base["entropy_half_tick"]
    n, nb = s["entropy_half_step"], base["entropy_half_step"]
    faster_ticks = t is not None and (tb is None or t <= ENTROPY_SPEEDUP * tb)
    faster_steps = n is not None and (nb is None or n <= ENTROPY_SPEEDUP * nb)
    if faster_ticks and faster_steps:
        found.append(
            f"entropy falls faster, per sampling step and per trainer step: it halved by sampling step {t} "
            f"(after {n} trainer steps), the baseline "
            + (f"by sampling step {tb} (after {nb} trainer steps)" if tb is not None else "not within the run")
            + f" (threshold: within {ENTROPY_SPEEDUP:.0%} of the baseline's sampling steps and of its "
            f"trainer steps)"
        )
    elif faster_ticks:
        found.append(
            f"(not a sign) entropy halves sooner per sampling step only: sampling step {t} vs {tb}, but "
            f"after {n} trainer steps vs the baseline's {nb}, so per trainer step it is not "
            f"{ENTROPY_SPEEDUP:.0%} of the baseline's or less"
        )
    c, cb = s["clip_frac_late"], base["clip_frac_late"]
    if c is not None and cb is not None and c >= CLIP_HIGH and c >= CLIP_RATIO * cb:
        found.append(
            f"clip fraction stays high: {_f(c)} on average over the second half of trainer steps, "
            f"baseline {_f(cb)} (thresholds: >= {CLIP_HIGH} and >= {CLIP_RATIO:g}x baseline)"
        )
    return found


def over_age(s: Dict[str, Any]) -> Optional[str]:
    """A note when the arm trained on data older than its max_age (wait trains ready entries past it)."""
    if s["age_max"] is None or not s.get("age_over_bound", s["age_max"] > s["max_age"]):
        return None
    bound = (
        f"the max_age in force (adaptive, mean {s['max_age_mean']:.1f})"
        if s.get("adaptive")
        else f"max_age {s['max_age']}"
    )
    why = {
        "wait": "wait blocks only on in-flight prompts at max_age and never drops ready entries, so ready entries age "
        "past it",
        "pace": "one of pace's assumptions broke (counted in trained_over_age; docs/design.md lists them)",
    }
    return f"trained on data up to {s['age_max']} trainer steps old, past {bound}: " + why.get(
        s["strategy"], "unexpected under drop"
    )


def bound_line(s: Dict[str, Any]) -> str:
    """Whether the arm kept its bound, and its price: data dropped (drop), stalls and old data (wait), generation
    held back and trainer idle (pace)."""
    led = s["ledger"]
    sampled = max(1, led["sampled_total"])
    kept = bound_kept(s)
    verdict = (
        f"kept the bound (age max {s['age_max']} <= max_age {s['max_age']})"
        if kept
        else f"did NOT keep it (age max {s['age_max']} > max_age {s['max_age']}; {led.get('trained_over_age', 0)} "
        "uses counted in trained_over_age)"
    )
    idle = s.get("trainer_idle_share")
    idle_text = f"trainer idle on {idle:.0%} of sampling steps" if idle is not None else "trainer idle not counted"
    if s["strategy"] == "drop":
        paid = f"{led['dropped_stale'] / sampled:.0%} of sampled trajectories dropped stale; {idle_text}"
    elif s["strategy"] == "wait":
        paid = (
            f"trainer blocked on {s['stalled_ticks']} sampling steps; {led['evicted'] / sampled:.0%} of sampled "
            f"trajectories evicted; {idle_text}"
        )
    else:
        asked = led["dispatched"] + s.get("prompts_skipped", 0)
        paid = (
            f"{s.get('prompts_skipped', 0)} of {asked} prompts held back by admission (not dispatched); nothing "
            f"dropped; {idle_text}"
        )
        if s["reuse"] > 1:  # every use is a group's last under pace: the reuse the bound cost
            early = led.get("retired_early", 0)
            paid += (
                f"; reuse under the bound: {early} trajectories retired after one use of up to {s['reuse']} "
                f"({early * (s['reuse'] - 1)} uses not made)"
            )
    return f"{verdict}; paid: {paid}."


def arm_lines(s: Dict[str, Any]) -> List[str]:
    led = s["ledger"]
    sampled = max(1, led["sampled_total"])
    uses = ", ".join(f"{k}x: {v}" for k, v in sorted(s["uses_hist"].items()))
    return [
        f"{s['arm']}: {s['trainer_steps']} trainer steps; sampled reward {_f(s['sample_reward_first'])} -> "
        f"{_f(s['sample_reward_last'])} (first/last {WINDOW:.0%} of sampling steps); greedy eval "
        f"{_f(s['eval_first'])} -> {_f(s['eval_last'])}; entropy {_f(s['entropy_first'])} -> "
        f"{_f(s['entropy_last'])}; clip fraction {_f(s['clip_frac_late'])} and approx KL "
        f"{_f(s['approx_kl_late'], 4)} over the second half; age of trained data: mean {_f(s['age_mean'], 2)}, "
        f"max {s['age_max']} trainer steps ("
        + (
            f"max_age {s['max_age_spec']}, mean {_f(s['max_age_mean'], 2)} in force, {s['max_age_changes']} changes"
            if s.get("adaptive")
            else f"max_age {s['max_age']}"
        )
        + ").",
        f"  trajectories: {led['retired']} retired, {led['dropped_stale']} dropped stale "
        f"({led['dropped_stale'] / sampled:.0%}), {led['evicted']} evicted ({led['evicted'] / sampled:.0%}), "
        f"{led['buffer_left']} left of {led['sampled_total']} sampled; uses per taken entry: {uses}; "
        f"trainer blocked (wait) on {s['stalled_ticks']} sampling steps; ledger "
        + ("reconciles." if s["reconciled"] else "DOES NOT reconcile."),
    ]


def render(summaries: Sequence[Dict[str, Any]], cfg: Any) -> str:
    """Returns the report text: configuration, per-arm observations, the signs, and the limits."""
    out = [
        f"In this configuration and step range: {cfg.ticks} sampling steps per arm, seed {cfg.seed}, "
        f"task digit-sum ({cfg.length} digits in [0,{cfg.digits})), group size {cfg.group_size}, batch "
        f"{cfg.batch_size} trajectories, capacity {cfg.capacity}, parameter_sync_step "
        f"{cfg.parameter_sync_step}, mode {cfg.mode}.",
        "",
    ]
    for s in summaries:
        out.extend(arm_lines(s))
    out.append("")
    out.append(
        "Signs from the procedure (each reuse > 1 arm against the reuse-1 arm with the same strategy, max_age and "
        "lag): " + "; ".join(f"({i}) {name}" for i, name in enumerate(SIGN_NAMES, 1)) + ":"
    )
    for s in summaries:
        if s["reuse"] == 1:
            continue
        base = baseline_of(s, summaries)
        if base is None:
            out.append(f"- {s['arm']}: no reuse-1 arm with the same strategy, max_age and lag ran; not compared.")
            continue
        found = signs(s, base)
        if not any(not line.startswith("(not a sign)") for line in found):
            checked = "; ".join(f"({i}) {name.split(' (')[0]}" for i, name in enumerate(SIGN_NAMES, 1))
            out.append(f"- {s['arm']} vs {base['arm']}: none of the three signs appears (checked {checked}).")
        for line in found:
            out.append(f"- {s['arm']} vs {base['arm']}: {line}.")
    if all(s["reuse"] == 1 for s in summaries):
        out.append("- every arm has reuse 1: nothing to compare.")
    notes = [(s["arm"], over_age(s)) for s in summaries if over_age(s)]
    if notes:
        out += ["", "Age past max_age:"] + [f"- {arm}: {note}." for arm, note in notes]
    out += ["", "Which arms kept the bound (nothing trained older than max_age), and what each paid:"]
    out += [f"- {s['arm']}: {bound_line(s)}" for s in summaries]
    bounded = [s for s in summaries if s["strategy"] in ("drop", "pace")]
    broke = [s["arm"] for s in bounded if not bound_kept(s)]
    if bounded:
        out.append(
            f"- all {len(bounded)} drop and pace arms kept the bound"
            + (", reuse included." if any(s["reuse"] > 1 for s in bounded) else ".")
            if not broke
            else f"- drop and pace arms that did NOT keep the bound: {', '.join(broke)}."
        )
    out += [
        "",
        "These are short runs with one fixed seed on a toy task: they show direction in this range only, "
        "not what longer training or another task would do, and a gap between two arms can be seed noise "
        "(rerun with another --seed before trusting it).",
    ]
    return "\n".join(out)


def table(summaries: Sequence[Dict[str, Any]]) -> str:
    """The final summary table, one row per arm."""
    cols = [
        ("arm", 24, lambda s: s["arm"]),
        ("steps", 6, lambda s: s["trainer_steps"]),
        ("reward first", 12, lambda s: _f(s["sample_reward_first"])),
        ("reward last", 11, lambda s: _f(s["sample_reward_last"])),
        ("eval last", 9, lambda s: _f(s["eval_last"])),
        ("entropy", 7, lambda s: _f(s["entropy_last"])),
        ("clip", 5, lambda s: _f(s["clip_frac_late"], 2)),
        ("age", 5, lambda s: _f(s["age_mean"], 1)),
        ("age max", 7, lambda s: f"{s['age_max']}{'!' if over_age(s) else ''}"),
        ("retired", 7, lambda s: s["ledger"]["retired"]),
        ("dropped", 7, lambda s: s["ledger"]["dropped_stale"]),
        ("evicted", 7, lambda s: s["ledger"]["evicted"]),
        ("left", 5, lambda s: s["ledger"]["buffer_left"]),
        ("stalls", 6, lambda s: s["stalled_ticks"]),
        ("ledger", 6, lambda s: "ok" if s["reconciled"] else "BAD"),
    ]
    lines = ["  ".join(f"{name:>{w}}" if i else f"{name:<{w}}" for i, (name, w, _) in enumerate(cols))]
    for s in summaries:
        lines.append("  ".join(f"{get(s)!s:>{w}}" if i else f"{get(s)!s:<{w}}" for i, (_, w, get) in enumerate(cols)))
    if any(over_age(s) for s in summaries):
        lines.append("! age max is above the arm's max_age")
    return "\n".join(lines)
