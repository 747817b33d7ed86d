"""The checkpoint format shared by both implementations (torch.save-able, implementation-neutral)."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Sequence, Union

import numpy as np
import torch

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
LATER_ENTRY_COLUMNS = ("finish_step",)
IN_FLIGHT_COLUMNS = ("prompt_id", "sample_step", "dispatch_ns")
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
) -> Dict[str, Any]:
    """Returns a state_dict from numpy columns in ring order (oldest first); ``next_take`` is the pace state
    (the step of the trainer's next take, docs/design.md), 0 for the other strategies."""
    return {
        "format": FORMAT,
        "config": dataclasses.asdict(config),
        "entries": {
            k: torch.from_numpy(np.asarray(entries[k], dtype=np.int64)) for k in ENTRY_COLUMNS + LATER_ENTRY_COLUMNS
        },
        "in_flight": {
            k: torch.from_numpy(np.asarray(in_flight[k], dtype=np.int64)) for k in IN_FLIGHT_COLUMNS + LEASE_COLUMNS
        },
        "ledger": {k: int(ledger[k]) for k in ALL_LEDGER_KEYS},
        "clock": int(clock),
        "evicted_unreported": int(evicted_unreported),
        "next_take": int(next_take),
    }


def _column(section: Dict[str, Any], key: str, where: str) -> np.ndarray:
    if key not in section:
        raise ValueError(f"state_dict['{where}'] lacks '{key}'; pass a dict made by state_dict()")
    value = section[key]
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
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
    for key in ("group_len", "sample_step", "group_id", "uses"):
        column = entries[key]
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
    ):
        raise ValueError("state_dict's ledger does not balance with the entries it holds; it was edited or is corrupt")
    return {
        "entries": entries,
        "in_flight": in_flight,
        "ledger": led,
        "clock": clock,
        "evicted_unreported": evicted_unreported,
        "next_take": next_take,
    }
