"""The NeMo RL sampler's settings: the extra keys of ``async_rl.sampler`` (``name: custom``), checked once.

NeMo hands them over raw (``cls(buffer, **extras)``: a YAML ``"3"`` stays a string), so every key is checked here
and a bad one is a TypeError or ValueError naming the key and the fix. No NeMo import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from pyfast_buffer._args import STRATEGIES
from pyfast_buffer.integrations._common import as_bool, check_keys

WHERE = "async_rl.sampler (pyfast_buffer.integrations.nemo_rl:StalenessSampler)"
KEYS = (
    "strategy",
    "max_age",
    "prompts_per_step",
    "lookahead",
    "capacity",
    "age_from",
    "abort_inflight",
    "starvation_share",
    "state_path",
    "slot_lease_s",
)
#: Our buffer's arguments that have no meaning through NeMo's sampler protocol, and why.
REFUSED = {
    "max_attempts": "NeMo RL gives a sampler no prompt identity across attempts (each retry is a new group id), so "
    "a prompt's untrained attempts cannot be counted; remove max_attempts",
    "source_max_age": "NeMo RL's buffer entries carry no data source at the sampler's reach; remove source_max_age",
    "max_uses": "NeMo RL clears a group's rows once it is trained, so a group is trained once; remove max_uses",
}


@dataclass(frozen=True)
class Options:
    strategy: str = "drop"
    max_age: int = 1
    prompts_per_step: Optional[int] = None
    lookahead: Optional[int] = None
    capacity: int = 1 << 16
    age_from: str = "start"
    abort_inflight: bool = True
    starvation_share: Optional[float] = None
    state_path: Optional[str] = None
    slot_lease_s: float = 300.0


def _int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{WHERE}: {name}={value!r} must be an int (write it unquoted in the YAML)")
    if value < minimum:
        raise ValueError(f"{WHERE}: {name}={value} must be >= {minimum}")
    return value


def parse(extras: Mapping[str, Any]) -> Options:
    for key, why in REFUSED.items():
        if key in extras:
            raise ValueError(f"{WHERE}: {key} cannot be honoured: {why}")
    check_keys(extras, KEYS, WHERE)
    strategy = extras.get("strategy", "drop")
    if strategy not in STRATEGIES:
        raise ValueError(f"{WHERE}: strategy={strategy!r} is unknown; use one of {list(STRATEGIES)}")
    max_age = _int(extras.get("max_age", 1), "max_age", 0)
    per_step = extras.get("prompts_per_step")
    per_step = None if per_step is None else _int(per_step, "prompts_per_step", 1)
    lookahead = extras.get("lookahead")
    if lookahead is not None:
        lookahead = _int(lookahead, "lookahead", 0)
        if strategy != "pace" or lookahead > max_age:
            raise ValueError(f"{WHERE}: lookahead={lookahead} needs strategy=pace and lookahead <= max_age={max_age}")
    age_from = extras.get("age_from", "start")
    if age_from not in ("start", "finish"):
        raise ValueError(
            f"{WHERE}: age_from={age_from!r} must be 'start' (the weights a group's generation began "
            "with) or 'finish' (the weights it ended with)"
        )
    share = extras.get("starvation_share")
    if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1):
        raise ValueError(f"{WHERE}: starvation_share={share!r} must be a number in (0, 1)")
    state_path = extras.get("state_path")
    if state_path is not None and not isinstance(state_path, str):
        raise TypeError(f"{WHERE}: state_path={state_path!r} must be a file path (str)")
    lease = extras.get("slot_lease_s", 300.0)
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease <= 1e6:
        raise ValueError(f"{WHERE}: slot_lease_s={lease!r} must be a number of seconds in (0, 1e6]")
    return Options(
        strategy=strategy,
        max_age=max_age,
        prompts_per_step=per_step,
        lookahead=lookahead,
        capacity=_int(extras.get("capacity", 1 << 16), "capacity", 1),
        age_from=age_from,
        abort_inflight=as_bool(extras.get("abort_inflight", True), "abort_inflight", WHERE),
        starvation_share=share,
        state_path=state_path,
        slot_lease_s=float(lease),
    )
