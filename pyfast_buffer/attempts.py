"""The twin's prompt-attempt table: csrc/prompt_attempts.hpp written the plain way (an OrderedDict).

Per prompt id: attempts (dispatches), trained (groups taken at least once), pending (groups ready, not yet
taken, dropped or evicted), the source slot of its latest dispatch, the trajectories of its attempts lost
since that dispatch and two flags. At most ``bound`` records; past it the least recently touched (dispatched
or completed) is forgotten and counted, and that prompt starts again at attempt 1.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Tuple

import numpy as np

from .state import ATTEMPT_COLUMNS, ATTEMPT_COUNTERS, SOURCE_SLOTS


def default_attempts_bound(capacity: int) -> int:
    """Records kept for a ring of ``capacity`` entries (the core's default_attempts_bound)."""
    return max(2 * capacity, 1 << 16)


class PromptAttempts:
    """Bounded per-prompt attempt records, least recently touched first."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        # id -> [attempts, trained, pending, slot, lost_trajs, last_lost, retried, since_trained]
        self._records: OrderedDict[int, List[int]] = OrderedDict()
        self.counters: Dict[str, int] = dict.fromkeys(ATTEMPT_COUNTERS, 0)
        self.starved = 0
        self.starved_by_slot = [0] * SOURCE_SLOTS

    @staticmethod
    def _is_starved(r: List[int]) -> bool:
        return r[0] >= 2 and r[1] == 0

    def _add_starved(self, slot: int, delta: int) -> None:
        self.starved += delta
        self.starved_by_slot[slot] += delta

    def on_dispatch(self, prompt: int, slot: int) -> int:
        """Records a dispatch; counts a retry when the latest finished attempt left untrained; returns the number
        of dispatches since the prompt was last trained, this one included."""
        r = self._records.get(prompt)
        if r is None:
            r = self._records[prompt] = [0, 0, 0, slot, 0, 0, 0, 0]
            if len(self._records) > self.bound:
                _, old = self._records.popitem(last=False)
                if self._is_starved(old):
                    self._add_starved(old[3], -1)
                self.counters["forgotten"] += 1
        else:
            self._records.move_to_end(prompt)
        if r[0] > 0 and r[5]:
            self.counters["retries"] += 1
            self.counters["regenerations"] += r[4]
            if not r[6]:
                r[6] = 1
                self.counters["prompts_retried"] += 1
        was = self._is_starved(r)
        if r[3] != slot and was:
            self.starved_by_slot[r[3]] -= 1
            self.starved_by_slot[slot] += 1
        r[3], r[4], r[5] = slot, 0, 0
        r[0] = min(r[0] + 1, 2**31 - 1)
        r[7] = min(r[7] + 1, 2**31 - 1)
        if not was and self._is_starved(r):
            self._add_starved(slot, +1)
        return r[7]

    def peek_untrained_run(self, prompt: int) -> int:
        """Returns what ``on_dispatch(prompt, ...)`` would return now, changing nothing."""
        r = self._records.get(prompt)
        return 1 if r is None else min(r[7] + 1, 2**31 - 1)

    def on_complete(self, prompt: int) -> None:
        r = self._records.get(prompt)
        if r is not None:
            r[2] += 1
            self._records.move_to_end(prompt)

    def on_failed(self, prompt: int) -> None:
        r = self._records.get(prompt)
        if r is not None:
            r[5] = 1

    def on_trained(self, prompt: int) -> None:
        r = self._records.get(prompt)
        if r is None or r[2] == 0:
            return
        was = self._is_starved(r)
        r[2] -= 1
        r[1] = min(r[1] + 1, 2**31 - 1)
        r[5], r[7] = 0, 0
        if was:
            self._add_starved(r[3], -1)

    def on_lost(self, prompt: int, trajs: int) -> None:
        r = self._records.get(prompt)
        if r is None or r[2] == 0:
            return
        r[2] -= 1
        r[5] = 1
        r[4] += trajs

    def starved_prompts(self, min_attempts: int) -> Dict[int, int]:
        return {p: r[0] for p, r in sorted(self._records.items()) if r[0] >= min_attempts and r[1] == 0}

    def snapshot(self) -> Tuple[Tuple[int, ...], Dict[int, int]]:
        """Returns (retries, prompts_retried, regenerations, protected, starved, forgotten) and the starved
        count of every tagged source that has one, as the core's ``Ring.attempts()``."""
        c = self.counters
        values = (c["retries"], c["prompts_retried"], c["regenerations"], c["protected"], self.starved, c["forgotten"])
        by_source = {slot - 1: k for slot, k in enumerate(self.starved_by_slot) if slot > 0 and k}
        return values, by_source

    def export(self) -> Dict[str, np.ndarray]:
        rows = [(p, r[0], r[1], r[2], r[3], r[4], r[5] | (r[6] << 1), r[7]) for p, r in self._records.items()]
        cols = list(zip(*rows)) if rows else [()] * len(ATTEMPT_COLUMNS)
        return {k: np.asarray(col, dtype=np.int64) for k, col in zip(ATTEMPT_COLUMNS, cols)}

    def load(self, columns: Dict[str, np.ndarray], counters: Dict[str, int]) -> None:
        rows = list(zip(*(columns[k].tolist() for k in ATTEMPT_COLUMNS)))[-self.bound :]
        self._records = OrderedDict()
        for p, a, t, pend, slot, lost, flags, since in rows:
            self._records.pop(p, None)
            clip = lambda v: min(v, 2**31 - 1)  # noqa: E731  (the core keeps int32 counts)
            self._records[p] = [clip(a), clip(t), clip(pend), slot, lost, flags & 1, (flags >> 1) & 1, clip(since)]
        self.counters = dict(counters)
        self.starved, self.starved_by_slot = 0, [0] * SOURCE_SLOTS
        for r in self._records.values():
            if self._is_starved(r):
                self._add_starved(r[3], +1)
