"""How the workflow commands print: one report to stdout, quiet when the reader goes away; and the sections about
the last prompt-attempt and bias records of a log, read from its lines and printed (audit's, docs/data-bias.md)."""

from __future__ import annotations

import math
import os
import re
import sys
from typing import Dict, Iterable, List, Mapping, Tuple

from ..bias import BIAS_FIELDS

#: The prompt-attempt fields of the buffer's record (running values: the last one counts), see docs/data-bias.md.
DATA_FIELDS = ("retried", "starved", "regenerations")
_DATA = re.compile(r"(?<![\w/.\-])(" + "|".join(DATA_FIELDS) + r")=(\d+)(?![\w.])")
_BIAS = re.compile(r"(?<![\w/.\-])bias (.*)$")

#: What each prompt-attempt field counts, printed after the values.
_PROMPT_LEGEND = (
    " (retried: prompts dispatched again after an untrained attempt; starved: >= 2 attempts, none trained; "
    "regenerations: trajectories generated for attempts that were lost and redone)"
)
#: The bias quantities, their unit, and what to print when none was measured (the sketch is empty: nan).
_BIAS_QUANTITIES = (
    ("latency", "us", "no latencies logged (dispatched and completed trajectories have one, put's do not)"),
    ("length", "tokens", "no lengths logged (pass lengths= to complete() to compare response lengths)"),
)
#: A KS at or above this between trained and generated is worth a hint (docs/data-bias.md).
_KS_HINT = 0.1


def print_output(text: str) -> None:
    """Prints ``text``; a reader that went away (``| head``) ends the output quietly."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def data_and_bias(lines: Iterable[str]) -> Tuple[Dict[str, int], Dict[str, float]]:
    """Returns the last prompt-attempt values and the last bias record of a log (both empty when absent)."""
    data: Dict[str, int] = {}
    last_bias: Dict[str, float] = {}
    for line in lines:
        for key, value in _DATA.findall(line):
            data[key] = int(value)
        found = _BIAS.search(line)
        if found:
            pairs = dict(item.split("=", 1) for item in found.group(1).split() if "=" in item)
            try:
                record = {k: float(pairs[k]) for k in BIAS_FIELDS if k in pairs}
            except ValueError:
                continue  # not the buffer's record
            if record:
                last_bias = record
    return data, last_bias


def prompt_lines(data: Mapping[str, int], order: Iterable[str]) -> List[str]:
    """The ``prompts (last record)`` section: the prompt-attempt values in ``order``; none when ``data`` is empty."""
    if not data:
        return []
    values = ", ".join(f"{k}={data[k]}" for k in order if k in data)
    return ["", f"prompts (last record): {values}{_PROMPT_LEGEND}"]


def bias_lines(bias: Mapping[str, float]) -> List[str]:
    """The ``bias`` section of the last bias record (bias.BIAS_FIELDS); none when there is no record.

    The buffer writes ``nan`` where a sketch is empty: a quantity with nothing measured (no ``lengths=``) is said
    to be missing instead of printed as nan, and one empty value (nothing lost) is printed as ``-``.
    """
    if not bias:
        return []
    out = ["", "bias (last record; trained vs generated, docs/data-bias.md):"]
    for quantity, unit, missing in _BIAS_QUANTITIES:
        ks, window = bias.get(f"{quantity}_ks", math.nan), bias.get(f"window/{quantity}_ks", math.nan)
        means = {
            f: bias[f"{quantity}/{f}/mean"] for f in ("generated", "trained", "lost") if f"{quantity}/{f}/mean" in bias
        }
        if all(math.isnan(v) for v in (ks, window, *means.values())):
            out.append(f"  {quantity}: {missing}")
            continue
        shown = ", ".join(f"{fate} {_num(v, '.6g')}" for fate, v in means.items())
        legend = " (-: no trajectory of that kind)" if any(math.isnan(v) for v in means.values()) else ""
        out.append(f"  {quantity}: KS {_num(ks, '.4g')} (window {_num(window, '.4g')}); mean {unit}: {shown}{legend}")
    worst = max((v for k, v in bias.items() if k.endswith("_ks") and not math.isnan(v)), default=math.nan)
    if worst >= _KS_HINT:
        out.append(
            f"  hint: a KS of {worst:.2f} means the trained data differs from what was generated; see "
            "data_metrics() per source, starved() and max_attempts / source_max_age"
        )
    return out


def _num(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)
