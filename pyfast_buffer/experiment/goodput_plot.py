"""The goodput study's figure: against max_age, per strategy, the goodput (trained groups per sampling step), the
length KS between trained and generated data, and the generator's and trainer's idle shares, each point the
mean over seeds with its 95% bootstrap interval (frontier.py). Needs matplotlib; returns a reason when missing."""

from __future__ import annotations

from typing import Any, Dict, Sequence

from .pyplot import NO_MATPLOTLIB, pyplot

_PANELS = (
    ("goodput", "goodput: trained groups per sampling step"),
    ("length_ks", "length KS, trained vs generated"),
    ("generator_idle_share", "generator idle share (slots waiting)"),
    ("wasted_share", "generated, never trained"),
)


def plot_frontier(points: Sequence[Dict[str, Any]], path: str, title: str) -> str:
    """Writes the figure to ``path`` and returns it (or why there is none)."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    lags = {p["lag"] for p in points}
    kinds = list(dict.fromkeys((p["kind"], p["lag"]) for p in points))
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (key, label) in zip(axes.flat, _PANELS):
        for i, (k, lag) in enumerate(kinds):
            mine = [p for p in points if (p["kind"], p["lag"]) == (k, lag) and p.get(key)]
            if not mine:
                continue
            name = k if len(lags) == 1 else f"{k}, lag {lag}"
            ages = [p["max_age"] for p in mine]
            mean = [p[key][0] for p in mine]
            err = [[m - p[key][1] for m, p in zip(mean, mine)], [p[key][2] - m for m, p in zip(mean, mine)]]
            ax.errorbar(ages, mean, yerr=err, marker="o", capsize=3, label=name, color=f"C{i}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_age (trainer steps)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
