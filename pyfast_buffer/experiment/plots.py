"""The figure: every arm's curves on one sampling-step axis, and the ledger as stacked bars.

Needs matplotlib (the ``demo`` extra); ``plot`` returns a reason string instead of a path
when it is missing, and the caller prints it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from .pyplot import NO_MATPLOTLIB, pyplot
from .summary import bound_kept
from .summary import per_tick as _per_tick

Record = Dict[str, Any]
#: Panels of per-trainer-step metrics: (record key, title).
_STEP_PANELS = (
    ("policy_loss", "policy loss (clipped surrogate)"),
    ("entropy", "entropy (nats/token)"),
    ("clip_frac", "clip fraction"),
    ("approx_kl", "approx KL to behaviour policy"),
    ("age_mean", "mean age of trained data (steps)"),
)
#: (ledger key, label, face colour, hatch): greys far apart plus a hatch each, so the four segments stay apart
#: in print and for colour-blind readers, and no bar shares a colour with an arm's curve (C0, C1, ...).
_LEDGER = (
    ("retired", "retired (taken max_uses times)", "0.25", ""),
    ("dropped_stale", "dropped stale", "white", "xxx"),
    ("evicted", "evicted", "0.65", "///"),
    ("buffer_left", "left in buffer", "0.92", "..."),
)
#: Index, in ``_STEP_PANELS``, of the age panel that gets the max_age line.
_AGE_PANEL = 4


def _smooth(values: List[float], width: int) -> List[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= width:
            acc -= values[i - width]
        out.append(acc / min(i + 1, width))
    return out


def plot(records: Sequence[Record], summaries: Sequence[Dict[str, Any]], path: str, title: str) -> str:
    """Writes the PNG to ``path`` and returns ``path``; returns a 'no figure: ...' reason without matplotlib."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    arms = [s["arm"] for s in summaries]
    ticks = max(r["tick"] for r in records) + 1
    width = max(1, ticks // 40)
    fig, axes = plt.subplots(2, 4, figsize=(19, 8.5))
    flat = axes.ravel()
    colors = {a: f"C{i}" for i, a in enumerate(arms)}
    # The legend says which arms kept their bound: nothing trained older than max_age.
    labels = {
        s["arm"]: s["arm"] + (" (bound kept)" if bound_kept(s) else f" (trained up to age {s['age_max']})")
        for s in summaries
    }
    for arm in arms:
        mine = [r for r in records if r["arm"] == arm]
        xs, ys = _per_tick([r for r in mine if r["kind"] == "tick"], "sample_reward")
        flat[0].plot(xs, _smooth(ys, width), color=colors[arm], label=labels[arm])
        ev = [r for r in mine if r["kind"] == "eval"]
        flat[1].plot([r["tick"] for r in ev], [r["eval_reward"] for r in ev], "o-", color=colors[arm], ms=3)
        steps = [r for r in mine if r["kind"] == "step"]
        for ax, (key, _) in zip(flat[2:7], _STEP_PANELS):
            xs, ys = _per_tick(steps, key)
            ax.plot(xs, _smooth(ys, width), color=colors[arm])
        _max_age_line(flat[2 + _AGE_PANEL], steps, colors[arm])
    titles = ["sampled reward (rollout side)", "greedy eval reward (trainer weights)"] + [t for _, t in _STEP_PANELS]
    for ax, t in zip(flat[:7], titles):
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("sampling step")
        ax.grid(alpha=0.3)
    flat[0].legend(fontsize=8, loc="best")
    _max_age_legend(flat[2 + _AGE_PANEL])
    _ledger_bars(flat[7], summaries, colors)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _ledger_bars(ax: Any, summaries: Sequence[Dict[str, Any]], colors: Dict[str, str]) -> None:
    bottoms = [0] * len(summaries)
    xs = list(range(len(summaries)))
    for key, label, colour, hatch in _LEDGER:
        heights = [s["ledger"][key] for s in summaries]
        ax.bar(xs, heights, bottom=bottoms, label=label, color=colour, hatch=hatch, edgecolor="black", linewidth=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(xs)
    ax.set_xticklabels([s["arm"].replace("-", "\n") for s in summaries], fontsize=7)
    ax.set_ylabel("trajectories")
    ax.set_title("ledger: where every sampled trajectory went", fontsize=10)
    ax.legend(
        fontsize=9,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.3),
        ncol=2,
        frameon=False,
        handlelength=2.5,
        handleheight=1.4,
    )


def _max_age_line(ax: Any, steps: Sequence[Record], colour: str) -> None:
    """The arm's max_age in force (a flat line unless the arm is adaptive), dashed in the arm's colour."""
    xs, bounds = _per_tick([r for r in steps if "max_age" in r], "max_age")
    if xs:
        ax.step(xs, bounds, where="post", color=colour, linestyle="--", linewidth=1.2, alpha=0.9)


def _max_age_legend(ax: Any) -> None:
    from matplotlib.lines import Line2D

    ax.legend(
        handles=[
            Line2D([], [], color="0.3", label="mean age"),
            Line2D([], [], color="0.3", linestyle="--", label="max_age in force"),
        ],
        fontsize=8,
        loc="best",
    )


#: The multi-seed figure's per-trainer-step panels: (record key, title).
_BAND_STEP_PANELS = (
    ("entropy", "entropy (nats/token)"),
    ("clip_frac", "clip fraction"),
    ("approx_kl", "approx KL to behaviour policy"),
    ("age_mean", "mean age of trained data (steps)"),
    ("max_age", "max_age in force (adaptive arms move it)"),
)


def _seed_curve(rows: Sequence[Record], key: str, ticks: int, width: int) -> Any:
    """One seed's per-sampling-step curve of ``key``, on every sampling step (interpolated between the steps that
    have rows, NaN before the first and after the last), then smoothed over ``width`` steps."""
    import numpy as np

    xs, ys = _per_tick(rows, key)
    grid = np.arange(ticks, dtype=float)
    if not xs:
        return np.full(ticks, np.nan)
    curve = np.interp(grid, xs, ys, left=np.nan, right=np.nan)
    kernel = np.ones(width) / width
    valid = ~np.isnan(curve)
    filled = np.where(valid, curve, 0.0)
    counts = np.convolve(valid.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        smooth = np.convolve(filled, kernel, mode="same") / counts
    smooth[~valid] = np.nan
    return smooth


def plot_bands(
    records: Sequence[Record], aggregate: Sequence[Dict[str, Any]], seeds: Sequence[int], path: str, title: str
) -> str:
    """The multi-seed figure: each arm's mean curve over seeds with its 95% bootstrap band (seeds resampled)."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    import numpy as np

    from .aggregate import band

    ticks = max(r["tick"] for r in records) + 1
    width = max(1, ticks // 40)
    fig, axes = plt.subplots(2, 4, figsize=(19, 8.5))
    flat = axes.ravel()
    for i, a in enumerate(aggregate):
        colour, arm = f"C{i}", a["arm"]
        by_seed = {s: [r for r in records if r["arm"] == arm and r.get("seed") == s] for s in seeds}
        panels = [("tick", "sample_reward", flat[0])] + [
            ("step", k, ax) for (k, _), ax in zip(_BAND_STEP_PANELS, flat[2:7])
        ]
        for kind, key, ax in panels:
            curves = np.stack(
                [_seed_curve([r for r in rows if r["kind"] == kind], key, ticks, width) for rows in by_seed.values()]
            )
            mean, low, high = band(curves)
            grid = np.arange(ticks)
            ax.plot(grid, mean, color=colour, label=arm if ax is flat[0] else None)
            ax.fill_between(grid, low, high, color=colour, alpha=0.2, linewidth=0)
        _max_age_line(flat[2 + 3], [r for r in records if r["arm"] == arm and r["kind"] == "step"], colour)
        ev_ticks = sorted({r["tick"] for r in records if r["kind"] == "eval" and r["arm"] == arm})
        ev = np.array(
            [
                [
                    next((r["eval_reward"] for r in rows if r["kind"] == "eval" and r["tick"] == t), np.nan)
                    for t in ev_ticks
                ]
                for rows in by_seed.values()
            ]
        )
        mean, low, high = band(ev)
        flat[1].plot(ev_ticks, mean, "o-", color=colour, ms=3)
        flat[1].fill_between(ev_ticks, low, high, color=colour, alpha=0.2, linewidth=0)
        share = a.get("drop_share")
        if share is not None:
            flat[7].bar(i, share[0], color=colour, yerr=[[share[0] - share[1]], [share[2] - share[0]]], capsize=4)
    titles = ["sampled reward (rollout side)", "greedy eval reward (trainer weights)"] + [
        t for _, t in _BAND_STEP_PANELS
    ]
    for ax, t in zip(flat[:7], titles):
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("sampling step")
        ax.grid(alpha=0.3)
    _max_age_legend(flat[2 + 3])
    # below the panels: inside one, the legend hides the curves it names
    fig.legend(
        *flat[0].get_legend_handles_labels(), loc="lower center", ncol=min(len(aggregate), 6), fontsize=9, frameon=False
    )
    flat[7].set_xticks(range(len(aggregate)))
    flat[7].set_xticklabels([a["arm"].replace("-", "\n") for a in aggregate], fontsize=7)
    flat[7].set_title("share of sampled trajectories dropped stale (95% interval)", fontsize=10)
    flat[7].grid(alpha=0.3, axis="y")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
