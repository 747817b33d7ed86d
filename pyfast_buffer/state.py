"""The checkpoint format shared by both implementations (torch.save-able, implementation-neutral)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import numpy as np

from . import _torch

FORMAT = "pyfast_buffer.state/1"
ENTRY_COLUMNS = (
    "traj_id",
    "group_id",
    "sample_step",
    "policy_version",
    "dispatch_ns",
    "complete_ns",
    "uses",
    "group_len",
)
#: Entry columns added later: written by pack, and a state_dict without one loads it as given here.
#: ``finish_step``: a state_dict from before version spans loads each entry as finished at its sample_step.
#: ``meta``: the response length, source slot and protected/observed flags (csrc/entry_meta.hpp); a state_dict
#: from before them loads each entry as an untagged put entry without a length (META_DEFAULT).
LATER_ENTRY_COLUMNS = ("finish_step", "meta")
META_DEFAULT = 0xFFFFFFFF
IN_FLIGHT_COLUMNS = ("prompt_id", "sample_step", "dispatch_ns")
#: An in-flight prompt saved before ``meta``: untagged, observed (it came through dispatch), not protected.
_IN_FLIGHT_META_DEFAULT = 0xFFFFFFFF | (1 << 41)
#: Columns of the prompt-attempts table, least recently touched first (csrc/prompt_attempts.hpp); ``flags``
#: bit 0 is "latest attempt lost", bit 1 "counted as retried".
ATTEMPT_COLUMNS = ("prompt_id", "attempts", "trained", "pending", "slot", "lost_trajs", "flags", "since_trained")
ATTEMPT_COUNTERS = ("retries", "prompts_retried", "regenerations", "protected", "forgotten")
#: Per source slot (untagged first, then sources 0..63): these cumulative counts.
SOURCE_COUNT_FIELDS = ("dispatched", "generated", "taken", "trained", "dropped", "evicted")
SOURCE_SLOTS = 65
#: Lease columns of in-flight prompts: ns of lease left when saved (-1: no lease) and ns in flight when saved.
#: A state_dict from before leases lacks them: its prompts load without a lease, as dispatched at load time.
LEASE_COLUMNS = ("lease_left_ns", "held_ns")
_LEASE_DEFAULTS = {"lease_left_ns": -1, "held_ns": 0}
LEDGER_KEYS = ("dispatched", "completed", "failed", "put_total", "taken", "retired", "dropped_stale", "evicted")
#: Counters added later: written by pack, read as 0 from a state_dict that predates them.
LATER_LEDGER_KEYS = (
    "max_age_changes",
    "expired",
    "admitted",
    "admission_refused",
    "admission_waits",
    "trained_over_age",
    "protected_admitted",
    "admitted_ahead",
    "retired_early",
)
ALL_LEDGER_KEYS = LEDGER_KEYS + LATER_LEDGER_KEYS
#: Largest ledger counter a state_dict may carry (the core's Ledger::kMaxCounter).
MAX_COUNTER = 2**60


Column = Union[np.ndarray, Sequence[int]]


def pack(
    config: Any,
    entries: Mapping[str, Column],
    in_flight: Mapping[str, Column],
    ledger: Mapping[str, int],
    clock: int,
    evicted_unreported: int,
    next_take: int = 0,
    attempts: Optional[Mapping[str, Column]] = None,
    attempt_counters: Optional[Mapping[str, int]] = None,
    source_counts: Optional[np.ndarray] = None,
) -> Dict[str, Any]:
    """Returns a state_dict from numpy columns in ring order (oldest first); ``next_take`` is the pace state
    (the step of the trainer's next take, docs/design.md), 0 for the other strategies; ``attempts``,
    ``attempt_counters`` and ``source_counts`` are the data accounting (docs/data-bias.md)."""
    as_tensor = lambda v: _torch.require().from_numpy(np.asarray(v, dtype=np.int64))  # noqa: E731
    empty = {k: np.empty(0, np.int64) for k in ATTEMPT_COLUMNS}
    counts = np.zeros((SOURCE_SLOTS, len(SOURCE_COUNT_FIELDS)), np.int64) if source_counts is None else source_counts
    return {
        "format": FORMAT,
        "config": dataclasses.asdict(config),
        "entries": {k: as_tensor(entries[k]) for k in ENTRY_COLUMNS + LATER_ENTRY_COLUMNS},
        "in_flight": {k: as_tensor(in_flight[k]) for k in IN_FLIGHT_COLUMNS + LEASE_COLUMNS + ("meta",)},
        "ledger": {k: int(ledger[k]) for k in ALL_LEDGER_KEYS},
        "clock": int(clock),
        "evicted_unreported": int(evicted_unreported),
        "next_take": int(next_take),
        "attempts": {k: as_tensor((attempts or empty)[k]) for k in ATTEMPT_COLUMNS},
        "attempt_counters": {k: int((attempt_counters or {}).get(k, 0)) for k in ATTEMPT_COUNTERS},
        "source_counts": as_tensor(counts).reshape(SOURCE_SLOTS, len(SOURCE_COUNT_FIELDS)),
    }


def _column(section: Dict[str, Any], key: str, where: str) -> np.ndarray:
    if key not in section:
        raise ValueError(f"state_dict['{where}'] lacks '{key}'; pass a dict made by state_dict()")
    value = section[key]
    array = value.detach().cpu().numpy() if _torch.is_tensor(value) else np.asarray(value)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(f"state_dict['{where}']['{key}'] must be a 1-D integer tensor")
    return array.astype(np.int64)


def _check_groups(entries: Dict[str, np.ndarray], n: int) -> None:
    """Raises ValueError unless the entries form contiguous groups of equal group_len, step, group id and uses."""
    lens = entries["group_len"]
    if n == 0:
        return
    if lens.min() < 1:
        raise ValueError(
            f"state_dict group at entry {int(np.argmax(lens < 1))} has group_len < 1; it was edited or is corrupt"
        )
    # Find the group starts by walking group_len (a Python walk over groups, not entries), then check
    # every entry against its group's first entry in one vectorised pass.
    if lens.max() == 1:
        return  # every entry is its own group: nothing to compare
    walk = lens.tolist()
    starts = []
    i = 0
    while i < n:
        starts.append(i)
        i += walk[i]
    if i != n:
        raise ValueError(
            f"state_dict group at entry {starts[-1]} runs past the last entry; it was edited or is corrupt"
        )
    first = np.asarray(starts, dtype=np.int64)
    owner = np.repeat(first, lens[first])
    cut_index = (entries["meta"] >> 32) & 0x1FF  # a group shares its source and protection (entry_meta.hpp)
    for column in (entries["group_len"], entries["sample_step"], entries["group_id"], entries["uses"], cut_index):
        bad = column != column[owner]
        if bad.any():
            at = int(owner[int(np.argmax(bad))])
            raise ValueError(
                f"state_dict group at entry {at} is not contiguous and uniform; it was edited or is corrupt"
            )


def unpack(sd: Any, capacity: int, max_uses: int) -> Dict[str, Any]:
    """Returns validated numpy columns of a state_dict, or raises TypeError/ValueError naming what is wrong."""
    if not isinstance(sd, dict) or sd.get("format") != FORMAT:
        raise TypeError(f"state_dict must be a dict made by state_dict() (format {FORMAT!r})")
    entries = {k: _column(sd.get("entries", {}), k, "entries") for k in ENTRY_COLUMNS}
    entries["finish_step"] = (
        _column(sd["entries"], "finish_step", "entries")
        if "finish_step" in sd.get("entries", {})
        else entries["sample_step"].copy()
    )
    in_flight = {k: _column(sd.get("in_flight", {}), k, "in_flight") for k in IN_FLIGHT_COLUMNS}
    section = sd.get("entries", {})
    n_entries = len(entries["traj_id"])
    entries["meta"] = (
        _column(section, "meta", "entries") if "meta" in section else np.full(n_entries, META_DEFAULT, dtype=np.int64)
    )
    section = sd.get("in_flight", {})
    n_prompts = len(in_flight["prompt_id"])
    in_flight["meta"] = (
        _column(section, "meta", "in_flight")
        if "meta" in section
        else np.full(n_prompts, _IN_FLIGHT_META_DEFAULT, dtype=np.int64)
    )
    for k in LEASE_COLUMNS:
        section = sd.get("in_flight", {})
        in_flight[k] = (
            _column(section, k, "in_flight")
            if k in section
            else np.full(len(in_flight["prompt_id"]), _LEASE_DEFAULTS[k], dtype=np.int64)
        )
    ledger = sd.get("ledger", {})
    missing = [k for k in LEDGER_KEYS if k not in ledger]
    if missing:
        raise ValueError(f"state_dict['ledger'] lacks {missing}; pass a dict made by state_dict()")
    n = len(entries["traj_id"])
    if any(len(col) != n for col in entries.values()) or len(set(map(len, in_flight.values()))) > 1:
        raise ValueError("state_dict columns differ in length; pass a dict made by state_dict()")
    if n > capacity:
        raise ValueError(
            f"state_dict holds {n} ready entries, more than capacity={capacity}; load it into a larger buffer"
        )
    clock = int(sd.get("clock", -1))
    steps, uses = entries["sample_step"], entries["uses"]
    if n and (steps.min() < 0 or steps.max() > clock):
        raise ValueError(f"state_dict has sample steps outside [0, clock={clock}]")
    if n and ((entries["finish_step"] < steps).any() or entries["finish_step"].max() > clock):
        raise ValueError(f"state_dict has finish steps before their sample step or after clock={clock}")
    if n and (uses.min() < 0 or uses.max() >= max_uses):
        raise ValueError(
            f"state_dict has entries used {int(uses.max())} times, not below max_uses={max_uses}; "
            "load it into a buffer with a larger max_uses"
        )
    for where, meta in (("entries", entries["meta"]), ("in_flight", in_flight["meta"])):
        if meta.size and (meta.min() < 0 or (meta >> 42).max() > 0 or ((meta >> 32) & 0xFF).max() >= SOURCE_SLOTS):
            raise ValueError(f"state_dict['{where}']['meta'] is out of range; it was edited or is corrupt")
    _check_groups(entries, n)
    prompts = in_flight["prompt_id"]
    if len(np.unique(prompts)) != len(prompts):
        raise ValueError("state_dict has a prompt in flight twice; it was edited or is corrupt")
    if len(prompts) and (in_flight["sample_step"].min() < 0 or in_flight["sample_step"].max() > clock):
        raise ValueError(f"state_dict has in-flight steps outside [0, clock={clock}]")
    if len(prompts) and (in_flight["lease_left_ns"].min() < -1 or in_flight["held_ns"].min() < 0):
        raise ValueError(
            "state_dict has in-flight lease_left_ns below -1 or held_ns below 0; it was edited or is corrupt"
        )
    led = {k: int(ledger.get(k, 0)) for k in ALL_LEDGER_KEYS}
    evicted_unreported = int(sd.get("evicted_unreported", 0))
    next_take = int(sd.get("next_take", 0))
    if not 0 <= next_take < 2**63:
        raise ValueError("state_dict has next_take outside [0, 2**63); it was edited or is corrupt")
    # The clock is a step the API accepted (<= 2**63 - 1) or -1 before any. Counters stay within the
    # core's bound (Ledger::kMaxCounter), so the buffer can go on adding to them without overflow.
    if any(not 0 <= v <= MAX_COUNTER for v in (*led.values(), evicted_unreported)):
        raise ValueError("state_dict has ledger counters outside [0, 2**60]; it was edited or is corrupt")
    if not -1 <= clock < 2**63:
        raise ValueError("state_dict has a clock outside int64; it was edited or is corrupt")
    if (
        led["put_total"] != led["retired"] + led["dropped_stale"] + led["evicted"] + n
        or led["dispatched"] != led["completed"] + led["failed"] + len(prompts)
        or not 0 <= evicted_unreported <= led["evicted"]
        or led["expired"] > led["failed"]
        or led["admitted"] > led["dispatched"]
        or led["trained_over_age"] > led["taken"]
        or led["protected_admitted"] > led["admitted"]
        or led["retired_early"] > led["retired"]
    ):
        raise ValueError("state_dict's ledger does not balance with the entries it holds; it was edited or is corrupt")
    return {
        "entries": entries,
        "in_flight": in_flight,
        "ledger": led,
        "clock": clock,
        "evicted_unreported": evicted_unreported,
        "next_take": next_take,
        **_unpack_accounting(sd),
    }


def _unpack_accounting(sd: Dict[str, Any]) -> Dict[str, Any]:
    """Returns the attempts table, its counters and the per-source counts of a state_dict (empty when it
    predates them), or raises ValueError/TypeError naming what is wrong."""
    section = sd.get("attempts", {})
    attempts = {k: _column(section, k, "attempts") if section else np.empty(0, np.int64) for k in ATTEMPT_COLUMNS}
    if len(set(map(len, attempts.values()))) > 1:
        raise ValueError("state_dict['attempts'] columns differ in length; pass a dict made by state_dict()")
    if any(int(attempts[k].min()) < 0 for k in ATTEMPT_COLUMNS[1:] if len(attempts[k])) or (
        len(attempts["slot"]) and int(attempts["slot"].max()) >= SOURCE_SLOTS
    ):
        raise ValueError("state_dict['attempts'] has a negative count or a source out of range; it was edited")
    raw = sd.get("attempt_counters", {})
    counters = {k: int(raw.get(k, 0)) for k in ATTEMPT_COUNTERS}
    if any(not 0 <= v <= MAX_COUNTER for v in counters.values()):
        raise ValueError("state_dict['attempt_counters'] lie outside [0, 2**60]; it was edited or is corrupt")
    value = sd.get("source_counts")
    if value is None:
        counts = np.zeros((SOURCE_SLOTS, len(SOURCE_COUNT_FIELDS)), dtype=np.int64)
    else:
        counts = (value.detach().cpu().numpy() if _torch.is_tensor(value) else np.asarray(value)).astype(np.int64)
        if counts.shape != (SOURCE_SLOTS, len(SOURCE_COUNT_FIELDS)) or (counts.size and counts.min() < 0):
            raise ValueError(f"state_dict['source_counts'] must be ({SOURCE_SLOTS}, 6) counts >= 0; it was edited")
    return {"attempts": attempts, "attempt_counters": counters, "source_counts": counts}
