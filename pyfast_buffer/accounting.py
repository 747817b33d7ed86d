"""The public face of the data accounting both buffers share: starved prompts, per-source bounds, data metrics.

Each buffer supplies five primitives (``_attempts_now``, ``_starved_now``, ``_source_counts_now``,
``_bias_now`` and ``_apply_source_max_age``); everything a user calls is written once, here. See
docs/data-bias.md for what the numbers mean.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from . import bias
from ._args import as_count
from .batch import ATTEMPT_FIELDS, PROTECTED_ADMISSION_FIELDS, metrics_prefix
from .config import BufferConfig, source_max_age_pairs
from .state import SOURCE_COUNT_FIELDS


class AccountingMethods:
    """Mixin: ``starved``, ``source_max_age``, ``data_metrics`` for StalenessBuffer and ReferenceBuffer."""

    config: BufferConfig
    _config_lock: threading.Lock
    _watch: bias.StarvationWatch
    _takes_seen: int

    def _attempts_now(self) -> Tuple[Tuple[int, ...], Dict[int, int]]:
        raise NotImplementedError

    def _starved_now(self, min_attempts: int) -> Dict[int, int]:
        raise NotImplementedError

    def _source_counts_now(self) -> np.ndarray:
        raise NotImplementedError

    def _bias_now(self) -> Optional[tuple]:
        raise NotImplementedError

    def _apply_source_max_age(self, source: int, max_age: int) -> None:
        raise NotImplementedError

    def ledger(self) -> Dict[str, int]:
        raise NotImplementedError  # each buffer's own (docs/design.md, "The ledger")

    def starved(self, min_attempts: int = 2) -> Dict[int, int]:
        """Returns ``{prompt_id: attempts}`` of every remembered prompt dispatched at least ``min_attempts``
        times (>= 1) with nothing of it trained yet, by prompt id (see docs/data-bias.md for the bound)."""
        return self._starved_now(as_count(min_attempts, "min_attempts", 1))

    @property
    def source_max_age(self) -> Dict[int, int]:
        """The per-source max_age overrides in force, ``{source: max_age}``.

        Settable between calls like ``max_age`` (a dict; sources left out go back to ``max_age``): the next
        take or evict_stale applies each source's cutoff to its entries.
        """
        return dict(self.config.source_bounds())

    @source_max_age.setter
    def source_max_age(self, value: Optional[Mapping[int, int]]) -> None:
        pairs = dict(source_max_age_pairs(value) or ())
        with self._config_lock:
            for source in set(dict(self.config.source_bounds())) - set(pairs):
                self._apply_source_max_age(source, -1)
            for source, max_age in pairs.items():
                self._apply_source_max_age(source, max_age)
            self.config = dataclasses.replace(self.config, source_max_age=tuple(sorted(pairs.items())) or None)

    def data_metrics(self) -> Dict[str, float]:
        """Returns what the bound did to the data so far, every value numeric, under the metrics prefix.

        The prompt-attempt counters (``retries``, ``prompts_retried``, ``regenerations``, ``protected``,
        ``prompts_starved``, ``attempts_forgotten``) and the ledger's protected admissions under pace
        (``protected_admitted``, ``admitted_ahead``); per tagged source ``source/<k>/<count>`` for the counts
        dispatched, generated, taken, trained, dropped, evicted, and ``source/<k>/starved`` (prompts starved now);
        and the bias monitor's ``bias/...`` numbers (bias.summarize).
        """
        prefix = metrics_prefix()
        attempts, starved_by_source = self._attempts_now()
        out: Dict[str, float] = {prefix + name: value for name, value in zip(ATTEMPT_FIELDS, attempts)}
        ledger = self.ledger()
        for name in PROTECTED_ADMISSION_FIELDS:
            out[prefix + name] = ledger[name]
        counts = self._source_counts_now()
        for slot in range(1, counts.shape[0]):
            source = slot - 1
            if not counts[slot].any() and source not in starved_by_source:
                continue
            for field, value in zip(SOURCE_COUNT_FIELDS, counts[slot].tolist()):
                out[f"{prefix}source/{source}/{field}"] = value
            out[f"{prefix}source/{source}/starved"] = starved_by_source.get(source, 0)
        out.update(bias.summarize(self._bias_now(), prefix))
        return out

    def _watch_take(self, stats: tuple) -> None:
        """After each take: feeds its per-source counts to the starvation warning and, every WINDOW_TAKES
        takes with INFO logging on, writes the bias record."""
        if self._watch.share is not None:
            self._watch.on_take({source: taken for source, taken, _ in stats[20]})
        self._takes_seen += 1
        if self._takes_seen % bias.WINDOW_TAKES == 0 and bias.logger.isEnabledFor(logging.INFO):
            bias.log_bias(self._bias_now())
