"""Argument checks and conversions shared by the native buffer and its reference twin.

Every public call converts its arguments here first, so both implementations
reject the same bad input with the same message, before touching any state.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any, NoReturn, Optional, cast

import numpy as np

from . import _torch

_INT64_MAX = int(np.iinfo(np.int64).max)
_INT64_DTYPE = np.dtype(np.int64)
#: Longest timeout, lease or expiry age accepted, in seconds (about 31 years): the core's kMaxSeconds.
MAX_TIMEOUT = 1e9
#: Largest ring capacity (the core's kMaxCapacity).
MAX_CAPACITY = 1 << 40
#: Largest source tag (the core's kMaxSource).
MAX_SOURCE = 63
#: Response lengths lie below this (the core's kNoLength marks "none").
MAX_LENGTH = 2**32 - 1
#: The staleness strategies: the buffer's ``strategy`` and verl's ``max_off_policy_strategy`` (same names).
STRATEGIES = ("drop", "wait", "pace")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _refuse_meta(value: Any, name: str) -> None:
    """Raises naming ``name`` for a meta tensor (a shape, no data), which torch refuses with a message naming none."""
    if value.device.type == "meta":
        raise ValueError(
            f"{name} is a meta tensor (a shape without data); pass a tensor that holds the values (e.g. on the CPU) "
            "or a list"
        )


def _refuse_dataless_or_lazy(value: Any, name: str) -> None:
    """Raises naming ``name`` for a tensor whose memory cannot be read as its values: a meta tensor, or a view with
    a pending negation (its memory holds x for the value -x; torch's ``.numpy()`` refuses it naming no argument),
    or a sparse tensor (no dense memory: ``.numpy()`` refuses it naming no argument). A conjugate view is complex,
    refused by its dtype before this. Only the slow tensor paths call this (after ``.numpy()`` declined the tensor,
    or numpy could not read a list holding it), so plain CPU tensors pay nothing for it."""
    _refuse_meta(value, name)
    if value.is_neg():
        raise ValueError(f"{name} is a negative view (tensor.is_neg()); pass {name}.resolve_neg() instead")
    if str(value.layout) != "torch.strided":  # sparse COO/CSR/CSC/BSR: no dense memory to read
        raise TypeError(f"{name} is a {value.layout} tensor; pass {name}.to_dense() instead")


def _refuse_unreadable_element(value: Any, name: str, exc: Exception) -> NoReturn:
    """Raises naming ``name`` (an argument) for a list that numpy could not read (``exc``): names the first tensor
    inside it that cannot be read as its values (meta, negative view, sparse) and the fix; else a TypeError with
    numpy's (torch's) reason (a tensor that requires grad or lives on a device says what to call in it)."""
    torch = _torch.loaded()
    if torch is not None and not isinstance(value, (str, bytes)):
        for at, item in enumerate(value):
            if isinstance(item, torch.Tensor):
                _refuse_dataless_or_lazy(item, f"{name}[{at}]")
    raise TypeError(
        f"{name} holds an element numpy cannot read as an id ({exc}); pass a list of ints, a numpy array or a tensor"
    )


def _is_bool_array(value: Any) -> bool:
    """A numpy array or tensor of dtype bool (a 0-d one in a list of ids would be read as 0 or 1)."""
    if isinstance(value, np.ndarray):
        return value.dtype == np.bool_
    torch = _torch.loaded()
    return torch is not None and isinstance(value, torch.Tensor) and value.dtype == torch.bool


def _item(value: Any, name: str) -> Any:
    """The Python value of a 0-d numpy array or tensor (``.item()`` reads a negative view's value right)."""
    if not isinstance(value, np.ndarray):
        _refuse_meta(value, name)
    return value.item()


def _is_scalar_array(value: Any) -> bool:
    """A 0-d numpy array or tensor (a tensor only if torch is loaded: whoever made one imported it)."""
    if isinstance(value, np.ndarray):
        return value.ndim == 0
    torch = _torch.loaded()
    return torch is not None and isinstance(value, torch.Tensor) and value.ndim == 0


def as_ids(value: Any, name: str, copy: bool = False) -> np.ndarray:
    """Returns ``value`` as a 1-D contiguous int64 numpy array, or raises TypeError/ValueError naming ``name``.

    The result may share memory with the caller's array; with ``copy`` it never does, and the caller's
    data is read exactly once (so another thread rewriting it cannot make this call see two versions).
    The native core copies what it is given before it releases the GIL, so its wrapper passes no copy.
    """
    if isinstance(value, np.ndarray) and value.dtype == np.int64 and value.ndim == 1:
        return np.array(value, order="C") if copy else np.ascontiguousarray(value)
    torch = _torch.loaded()  # None: no tensor can exist in this process, so none is checked for
    if torch is not None and type(value) is torch.Tensor:
        try:  # a CPU tensor without grad: a view of its memory, then numpy's own path (one call, no checks here)
            return as_ids(cast(Any, value).numpy(), name, copy)
        except (RuntimeError, TypeError):  # on a device, or requires grad: the general path below
            pass
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
            raise TypeError(f"{name} has dtype {value.dtype}; pass integer ids (e.g. tensor.long())")
        _refuse_dataless_or_lazy(value, name)
        # A CUDA (or other device) tensor is copied to the host here: one synchronising copy per call. Keep ids
        # on the CPU in a hot loop (the buffer holds ids, never data).
        array = cast(Any, value).detach().cpu().numpy()
    elif isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name}={value!r} is not a sequence of ints; pass a list, numpy array or torch tensor")
    else:
        try:
            array = np.asarray(value)
        except (OverflowError, ValueError) as exc:
            raise ValueError(f"{name} does not fit int64 ({exc}); pass ids in [-2**63, 2**63)") from None
        except (RuntimeError, TypeError) as exc:  # a tensor inside that numpy cannot read (negative view, sparse...)
            _refuse_unreadable_element(value, name, exc)
        if array.size == 0:
            return np.empty(0, dtype=np.int64)
        if array.dtype == object:
            if isinstance(value, (AbstractSet, Mapping)):  # numpy makes one 0-d object of it
                kind = "dict" if isinstance(value, Mapping) else "set"
                fix = "list(d) for its keys, list(d.values()) for its values" if kind == "dict" else "e.g. sorted(ids)"
                raise TypeError(
                    f"{name} is a {kind} ({type(value).__name__}), not a sequence of ids (it has no order); "
                    f"pass a list, numpy array or tensor ({fix})"
                )
            if all(_is_int(v) for v in value):
                raise ValueError(f"{name} has ids that do not fit int64; pass ids in [-2**63, 2**63)")
        # numpy turns [True, 2] into int64 [1, 2]: a bool among ints (a mask passed by mistake, a flag in the wrong
        # place) would be taken as id 1. A container with a dtype of its own says so in that dtype (checked below);
        # a list or tuple of Python objects is looked at here, on this general path only (one pass over the types).
        if array.dtype.kind in "iu" and not hasattr(value, "dtype") and type(value) is not range:
            types = set(map(type, value))
            # A 0-d bool array or tensor among ints is read as 0/1 too: looked for only when the list holds one.
            arrays = (np.ndarray,) if torch is None else (np.ndarray, torch.Tensor)
            found = None
            if bool in types or np.bool_ in types or any(issubclass(t, arrays) for t in types):
                found = next(((i, v) for i, v in enumerate(value) if _is_bool(v) or _is_bool_array(v)), None)
            if found is not None:
                at, flag = found
                raise TypeError(
                    f"{name} holds a bool at index {at} ({flag!r}) among ints; pass ints, not bools "
                    "(int(flag) if 0/1 was meant; a mask selects values, it is not one)"
                )
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} has dtype {array.dtype}; ids must be ints, not floats or bools")
    if array.ndim != 1:
        raise ValueError(f"{name} has shape {tuple(array.shape)}; pass a 1-D sequence (flatten it first)")
    if copy or array.dtype.kind == "u":  # own the data before reading its values: they are checked, then converted
        array = np.array(array, order="C")
    if array.dtype.kind == "u" and array.size and int(array.max()) > _INT64_MAX:
        raise ValueError(f"{name} has ids above 2**63 - 1; pass ids that fit int64")
    return np.ascontiguousarray(array, dtype=np.int64)


def as_step(value: Any, name: str) -> int:
    """Returns ``value`` as an int >= 0, or raises TypeError/ValueError naming ``name``."""
    if type(value) is int and 0 <= value <= _INT64_MAX:  # the hot path: skip the ABC checks
        return value
    if _is_scalar_array(value):
        value = _item(value, name)
    if not _is_int(value):
        if _is_bool(value):
            raise TypeError(
                f"{name}={value!r} is a bool; pass the trainer's global step as an int >= 0 (e.g. {name}={int(value)})"
            )
        if isinstance(value, float) and math.isnan(value):
            raise ValueError(f"{name}=nan is not a step; pass the trainer's global step as an int >= 0")
        raise TypeError(f"{name}={value!r} is not an int; pass the trainer's global step as an int >= 0")
    value = int(value)
    if value < 0:
        raise ValueError(f"{name}={value} is negative; steps are ints >= 0")
    if value > _INT64_MAX:
        raise ValueError(f"{name}={value} does not fit int64; steps are ints below 2**63")
    return value


def as_steps(value: Any, name: str, n: int, copy: bool = False) -> np.ndarray:
    """Returns one stamp (shape (1,)) or ``n`` stamps as int64 >= 0, or raises naming ``name``."""
    if type(value) is int and 0 <= value <= _INT64_MAX:
        return np.array((value,), dtype=np.int64)
    if _is_int(value) or isinstance(value, (float, bool, np.bool_)) or _is_scalar_array(value):
        return np.array([as_step(value, name)], dtype=np.int64)
    steps = as_ids(value, name, copy)
    if len(steps) != n:
        raise ValueError(f"{name} has {len(steps)} stamps for {n} trajectories; pass one int or one per trajectory")
    if steps.size and steps.min() < 0:
        raise ValueError(f"{name} has negative stamp {int(steps.min())}; steps are ints >= 0")
    return steps


def as_count(value: Any, name: str, minimum: int = 1, maximum: int = _INT64_MAX) -> int:
    """Returns ``value`` as an int in [minimum, maximum], or raises TypeError/ValueError naming ``name``."""
    if type(value) is int and minimum <= value <= maximum:
        return value
    if not _is_int(value):
        raise TypeError(f"{name}={value!r} is not an int; pass an int >= {minimum}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    if value > maximum:
        raise ValueError(f"{name}={value} must be <= {maximum}")
    return int(value)


def as_seconds(value: Any, name: str, allow_zero: bool, fix: str) -> float:
    """Returns ``value`` as a finite float of seconds, > 0 (>= 0 with allow_zero) and <= MAX_TIMEOUT, or raises
    TypeError/ValueError naming ``name`` and ending with ``fix``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={value!r} is not a number; pass seconds as a float; {fix}")
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float, e.g. 10**400
        raise ValueError(f"{name}={value} is too large; pass at most {MAX_TIMEOUT:g} s; {fix}") from None
    low = ">= 0" if allow_zero else "> 0"
    if math.isnan(seconds) or math.isinf(seconds) or not (seconds >= 0 if allow_zero else seconds > 0):
        raise ValueError(f"{name}={seconds} must be a finite number of seconds {low}; {fix}")
    if seconds > MAX_TIMEOUT:
        raise ValueError(f"{name}={seconds:g} exceeds the longest accepted, {MAX_TIMEOUT:g} s (about 31 years); {fix}")
    return seconds


class _ProbeTimeout(float):
    """The timeout of one attempt of an awaitable call (aio.py): a call that would wait raises WouldBlock instead,
    changing and counting nothing. Only aio passes it; the core knows it as kProbeTimeout."""


PROBE = _ProbeTimeout(-(2.0**-1000))  # the core's kProbeTimeout (its PROBE_TIMEOUT): a caller's -1 stays an error


def is_probe(timeout: Any) -> bool:
    """Whether ``timeout`` is the probe timeout (PROBE, or a copy of it that crossed a process boundary)."""
    return isinstance(timeout, _ProbeTimeout)


def as_timeout(value: Any) -> Optional[float]:
    """Returns None, a finite float in [0, MAX_TIMEOUT] of seconds, or PROBE itself; else TypeError/ValueError."""
    if value is None:
        return None
    if is_probe(value):
        return PROBE
    return as_seconds(value, "timeout", True, "pass None not to block")


def as_lease(value: Any) -> Optional[float]:
    """Returns None or a lease as a finite float in (0, MAX_TIMEOUT] seconds, or raises TypeError/ValueError."""
    if value is None:
        return None
    return as_seconds(value, "lease", False, "pass None for no lease")


def same_length(a: np.ndarray, a_name: str, b: np.ndarray, b_name: str) -> None:
    """Raises ValueError unless ``a`` and ``b`` have the same length."""
    if len(a) != len(b):
        raise ValueError(
            f"{a_name} has {len(a)} entries but {b_name} has {len(b)}; pass one {b_name[:-1]} per trajectory"
        )


def as_slots(source: Any, n: int, per: str) -> Optional[np.ndarray]:
    """Returns None for ``source=None``, else the core's source slots (source + 1) as an int32 array of one
    entry (one int for all) or ``n`` (one per id); raises TypeError/ValueError naming ``source``."""
    if source is None:
        return None
    if _is_int(source) or _is_scalar_array(source):
        value = as_count(int(_item(source, "source") if _is_scalar_array(source) else source), "source", -(2**63))
        if not 0 <= value <= MAX_SOURCE:
            raise ValueError(
                f"source={value} is out of range; pass a source in [0, {MAX_SOURCE}] (or None for untagged)"
            )
        return np.array((value + 1,), dtype=np.int32)
    tags = as_ids(source, "source")
    if len(tags) != n:
        raise ValueError(f"source has {len(tags)} tags for {n} {per}; pass one int or one per {per[:-1]}")
    if tags.size and (tags.min() < 0 or tags.max() > MAX_SOURCE):
        bad = int(tags[(tags < 0) | (tags > MAX_SOURCE)][0])
        raise ValueError(f"source={bad} is out of range; pass a source in [0, {MAX_SOURCE}] (or None for untagged)")
    return (tags + 1).astype(np.int32)


def as_lengths(lengths: Any, n: int) -> Optional[np.ndarray]:
    """Returns None, or one response length per trajectory as int64 in [0, 2**32 - 1); raises naming ``lengths``."""
    if lengths is None:
        return None
    values = as_ids(lengths, "lengths")
    if len(values) != n:
        raise ValueError(f"lengths has {len(values)} entries for {n} trajectories; pass one length per trajectory")
    if values.size and (values.min() < 0 or values.max() >= MAX_LENGTH):
        bad = int(values[(values < 0) | (values >= MAX_LENGTH)][0])
        raise ValueError(f"lengths: {bad} is not a token count; pass ints in [0, 2**32 - 1)")
    return values
