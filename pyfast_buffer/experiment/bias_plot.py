"""The bias study's figure: per arm, the trained-vs-generated shift (KS and mean difference) of difficulty,
length and latency, and what the arm paid (idle share, share generated but never trained), each with its
95% bootstrap interval over the seeds. Needs matplotlib; returns a reason string when it is missing."""

from __future__ import annotations

from typing import Any, Dict, Sequence

from .pyplot import NO_MATPLOTLIB, pyplot

_PANELS = (
    ("difficulty_ks", "difficulty KS"),
    ("length_ks", "length KS"),
    ("latency_ks", "latency KS"),
    ("difficulty_shift", "difficulty: trained - generated mean"),
    ("length_shift", "length: trained - generated mean (tokens)"),
    ("latency_shift", "latency: trained - generated mean (steps)"),
    ("idle_share", "trainer idle share"),
    ("wasted_share", "generated, never trained"),
    ("regenerations_per_prompt", "regenerations per prompt"),
)


def plot_bias(agg: Sequence[Dict[str, Any]], path: str, title: str) -> str:
    """Writes the figure to ``path`` and returns it (or why there is none)."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, axes = plt.subplots(3, 3, figsize=(13, 9))
    names = [a["arm"] for a in agg]
    for ax, (key, label) in zip(axes.flat, _PANELS):
        means = [a[key][0] if a.get(key) else float("nan") for a in agg]
        errs = [
            [m - a[key][1] if a.get(key) else 0 for m, a in zip(means, agg)],
            [a[key][2] - m if a.get(key) else 0 for m, a in zip(means, agg)],
        ]
        ax.bar(range(len(names)), means, yerr=errs, capsize=4, color=[f"C{i}" for i in range(len(names))])
        ax.axhline(0, color="0.3", linewidth=0.8)
        ax.set_title(label, fontsize=10)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
