"""Says, before torch does, that a device passed to ``Batch.to`` cannot be used by this torch.

torch's own failure for a CUDA device on a CPU-only build is a bare ``AssertionError: Torch not compiled
with CUDA enabled`` raised deep inside ``Tensor.to``; a training loop copied onto a laptop hits it first.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from . import _torch

_ACCELERATORS = ("cuda", "mps", "xpu")  # device types whose torch module has is_available()


def _device_argument(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Any]:
    """The device of a ``Tensor.to`` call (``to(device, ...)``, ``to(device=...)``), or None (``to(dtype)``)."""
    if "device" in kwargs:
        return kwargs["device"]
    if args and isinstance(args[0], (str, _torch.require().device, int)) and not isinstance(args[0], bool):
        return args[0]
    return None


def check_usable(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
    """Raises ValueError for a device string torch does not know, RuntimeError for one it cannot use here."""
    wanted = _device_argument(args, kwargs)
    if wanted is None:
        return
    torch = _torch.require()  # loaded already: Batch.to is a call on a tensor
    try:
        device = torch.device(wanted)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"Batch.to(device={wanted!r}): not a torch device ({exc}); pass e.g. 'cpu', 'cuda' or 'cuda:0'"
        ) from None
    if device.type not in _ACCELERATORS:
        return
    backend = getattr(torch, device.type, None)
    available = getattr(backend, "is_available", None)
    if available is not None and not available():
        build = f"torch {torch.__version__}"
        raise RuntimeError(
            f"Batch.to(device={wanted!r}): {build} cannot use {device.type} here (torch.{device.type}.is_available() "
            f"is False: a CPU-only build of torch, or no {device.type} device visible); pass "
            f"device='{device.type}' if torch.{device.type}.is_available() else 'cpu'"
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeError(
            f"Batch.to(device={wanted!r}): only {torch.cuda.device_count()} CUDA device(s) are visible; "
            f"pass an index below {torch.cuda.device_count()}, or 'cuda' for the current one"
        )
