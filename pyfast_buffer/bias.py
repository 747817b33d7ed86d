"""What the staleness bound does to the data: sketch summaries, KS statistics and the starvation warning.

Both buffers keep, per (fate, quantity), a fixed log-linear histogram ("sketch", the core's
``value_sketch.hpp``): values below 32 exactly, then 16 buckets per power of two, so a bucket spans at most
1/16 of its lower edge; values at or above 2**41 share the last bucket. Fates are *generated* (completed),
*trained* (taken for the first time) and *lost* (dropped stale or evicted before any take); quantities are
rollout latency (complete - dispatch, in microseconds) and response length (tokens, when ``complete`` was
given ``lengths``). This module turns the bucket counts into numbers, identically for both buffers.

Errors, stated once: a mean is exact (from the exact sum); a quantile is the midpoint of the bucket that holds
the sample quantile, so it is within 1/32 (3.1 %) of it (exact below 32); a KS statistic is evaluated at bucket
edges, so it never exceeds the exact two-sample statistic and falls short of it by at most the largest mass a
single bucket holds in either sample.
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

logger = logging.getLogger("pyfast_buffer")

SUB = 16  #: sub-buckets per power of two (the core's kSketchSub)
TOP_BIT = 41  #: values >= 2**TOP_BIT share the last bucket (kSketchTopBit)
BUCKETS = 2 * SUB + SUB * (TOP_BIT - 5)  #: buckets per sketch (kSketchBuckets)
FATES = ("generated", "trained", "lost")
QUANTITIES = ("latency", "length")
WINDOW_PARTS = 4  #: sub-windows of the sliding window (kWindowParts)
WINDOW_TAKES = 16  #: take calls per sub-window (kWindowTakes): the window spans the last 48 to 64 takes
#: Relative error bound of a reported quantile (values >= 32; exact below).
QUANTILE_ERROR = 1 / (2 * SUB)


def bucket_of(values: np.ndarray) -> np.ndarray:
    """Returns the sketch bucket of each int64 value (negative values count as 0), as the core computes it."""
    v = np.clip(np.asarray(values, dtype=np.int64), 0, (1 << TOP_BIT) - 1)
    out = v.copy()
    big = v >= 2 * SUB
    if big.any():
        b = v[big]
        e = np.floor(np.log2(b.astype(np.float64))).astype(np.int64)
        # log2 of a float can round up just below a power of two: correct e so that 2**e <= b < 2**(e+1)
        e -= (np.left_shift(np.int64(1), e) > b).astype(np.int64)
        e += (np.left_shift(np.int64(1), e + 1) <= b).astype(np.int64)
        out[big] = SUB * (e - 3) + (np.right_shift(b, e - 4) & (SUB - 1))
    return out


def bucket_edges() -> Tuple[np.ndarray, np.ndarray]:
    """Returns (lower edge, width) of every bucket as int64 arrays (the last bucket's width is nominal)."""
    b = np.arange(BUCKETS, dtype=np.int64)
    low = b.copy()
    width = np.ones(BUCKETS, dtype=np.int64)
    big = b >= 2 * SUB
    e = b[big] // SUB + 3
    low[big] = (SUB + b[big] % SUB) << (e - 4)
    width[big] = np.left_shift(np.int64(1), e - 4)
    return low, width


_LOW, _WIDTH = bucket_edges()
_MID = _LOW + (_WIDTH - 1) / 2.0  # exact buckets (width 1) report their value


def quantile(counts: np.ndarray, q: float) -> float:
    """Returns the q-quantile (inverted CDF: the smallest value with CDF >= q) of a sketch, as its bucket's
    midpoint; nan for an empty sketch."""
    total = int(counts.sum())
    if total == 0:
        return float("nan")
    rank = max(int(np.ceil(q * total)), 1)
    return float(_MID[int(np.searchsorted(np.cumsum(counts), rank))])


def ks(a: np.ndarray, b: np.ndarray) -> float:
    """Returns the two-sample Kolmogorov-Smirnov statistic of two sketches, at bucket edges; nan if one is empty."""
    na, nb = int(a.sum()), int(b.sum())
    if na == 0 or nb == 0:
        return float("nan")
    return float(np.max(np.abs(np.cumsum(a) / na - np.cumsum(b) / nb)))


def ks_error_bound(a: np.ndarray, b: np.ndarray) -> float:
    """Returns how far below the exact KS statistic ``ks(a, b)`` may fall: the largest single-bucket mass."""
    na, nb = int(a.sum()), int(b.sum())
    if na == 0 or nb == 0:
        return float("nan")
    return float(max((a / na).max(), (b / nb).max()))


class Sketches:
    """The twin's bias monitor: the same sketches as the core's BiasMonitor, in numpy."""

    def __init__(self) -> None:
        parts = 1 + WINDOW_PARTS  # the cumulative sketches, then the sub-windows
        self.counts = np.zeros((parts, 6, BUCKETS), dtype=np.int64)
        self.n = np.zeros((parts, 6), dtype=np.int64)
        self.sum = np.zeros((parts, 6), dtype=np.float64)
        self.current = 0
        self.takes_in_current = 0
        self.rotations = 0

    def add(self, fate: int, quantity: int, values: Iterable[int]) -> None:
        """Adds ``values`` of ``quantity`` (0 latency, 1 length) with ``fate`` (0 generated, 1 trained, 2 lost)."""
        v = np.fromiter(values, dtype=np.int64)
        if v.size == 0:
            return
        k = fate * 2 + quantity
        hist = np.bincount(bucket_of(v), minlength=BUCKETS)
        for part in (0, 1 + self.current):
            self.counts[part, k] += hist
            self.n[part, k] += v.size
            self.sum[part, k] += float(v.astype(np.float64).sum())

    def on_take(self) -> None:
        """Counts one take call; rotates the sub-windows every WINDOW_TAKES calls."""
        self.takes_in_current += 1
        if self.takes_in_current < WINDOW_TAKES:
            return
        self.takes_in_current = 0
        self.current = (self.current + 1) % WINDOW_PARTS
        self.counts[1 + self.current] = 0
        self.n[1 + self.current] = 0
        self.sum[1 + self.current] = 0.0
        self.rotations += 1

    def arrays(self) -> tuple:
        """Returns copies in the layout of the core's ``Ring.bias()``."""
        return (self.counts.copy(), self.n.copy(), self.sum.copy(), self.current, self.takes_in_current, self.rotations)


def summarize(arrays: Optional[tuple], prefix: str) -> Dict[str, float]:
    """Returns the bias metrics under ``prefix + "bias/"`` from a monitor snapshot (``Ring.bias()`` layout).

    Per scope (cumulative, and ``window/`` for the sliding window), quantity and fate: ``mean``, ``p50``,
    ``p90`` and ``n``; per scope and quantity, ``<quantity>_ks``: the KS statistic between trained and
    generated (nan until both have values). Empty before the first dispatch.
    """
    if arrays is None:
        return {}
    counts, n, sums = arrays[0], arrays[1], arrays[2]
    scopes = (
        ("", counts[0], n[0], sums[0]),
        ("window/", counts[1:].sum(axis=0), n[1:].sum(axis=0), sums[1:].sum(axis=0)),
    )
    out: Dict[str, float] = {}
    for scope, c, nn, ss in scopes:
        for qi, quantity in enumerate(QUANTITIES):
            for fi, fate in enumerate(FATES):
                k = fi * 2 + qi
                key = f"{prefix}bias/{scope}{quantity}/{fate}/"
                count = int(nn[k])
                out[key + "n"] = count
                out[key + "mean"] = float(ss[k]) / count if count else float("nan")
                out[key + "p50"] = quantile(c[k], 0.5)
                out[key + "p90"] = quantile(c[k], 0.9)
            out[f"{prefix}bias/{scope}{quantity}_ks"] = ks(c[2 + qi], c[qi])  # trained vs generated
    return out


#: The bias record the buffers log (INFO, logger ``pyfast_buffer``) every WINDOW_TAKES takes once a prompt was
#: dispatched: cumulative KS statistics (trained vs generated), the window's, and the cumulative means and p50s
#: that read them. ``pyfast-buffer audit`` reports the last one. New fields are only ever appended.
BIAS_FIELDS = (
    "latency_ks",
    "length_ks",
    "window/latency_ks",
    "window/length_ks",
    "latency/generated/mean",
    "latency/trained/mean",
    "latency/lost/mean",
    "latency/generated/p50",
    "latency/trained/p50",
    "length/generated/mean",
    "length/trained/mean",
    "length/lost/mean",
)


def log_bias(arrays: Optional[tuple]) -> None:
    """Writes the bias record of a monitor snapshot (BIAS_FIELDS, ``nan`` where a sketch is empty)."""
    numbers = summarize(arrays, "")
    if numbers:
        logger.info("bias " + " ".join(f"{k}=%.6g" for k in BIAS_FIELDS), *(numbers["bias/" + k] for k in BIAS_FIELDS))


class StarvationWatch:
    """Warns once per window when a source's share of trained trajectories falls below ``share`` while it still
    has prompts dispatched in that window (both buffers use this one, fed by the counts each call returns).

    The window is the monitor's: WINDOW_PARTS * WINDOW_TAKES take calls, checked at the end of each.
    """

    def __init__(self, share: Optional[float]) -> None:
        self.share = share
        self._takes = 0
        self._trained: Dict[int, int] = {}
        self._dispatched: Dict[int, int] = {}
        self.warned: List[Tuple[int, float]] = []  # (source, share) of every warning, oldest first

    def on_dispatch(self, sources: Optional[np.ndarray], n: int) -> None:
        """Counts ``n`` prompts dispatched with per-prompt (or one) source tags; untagged ones are not watched."""
        if self.share is None or sources is None:
            return
        tags = np.broadcast_to(sources, (n,)) if sources.size == 1 else sources
        for s, k in zip(*np.unique(tags, return_counts=True)):
            self._dispatched[int(s)] = self._dispatched.get(int(s), 0) + int(k)

    def on_take(self, taken_by_source: Dict[int, int]) -> None:
        """Counts one take's trajectories by source (-1: untagged); at a window's end, warns and starts the next."""
        if self.share is None:
            return
        for s, k in taken_by_source.items():
            self._trained[s] = self._trained.get(s, 0) + k
        self._takes += 1
        if self._takes < WINDOW_PARTS * WINDOW_TAKES:
            return
        total = sum(self._trained.values())
        for source in sorted(self._dispatched):
            got = self._trained.get(source, 0) / total if total else 0.0
            if source >= 0 and got < self.share:
                self.warned.append((source, got))
                logger.warning(
                    "source %d: %.1f%% of the trajectories trained in the last %d takes, below starvation_share=%g, "
                    "while %d of its prompts were dispatched; its rollouts may be too slow for its max_age: raise "
                    "source_max_age[%d] or set max_attempts (see docs/data-bias.md)",
                    source,
                    100 * got,
                    self._takes,
                    self.share,
                    self._dispatched[source],
                    source,
                )
        self._takes = 0
        self._trained, self._dispatched = {}, {}
