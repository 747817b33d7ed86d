"""torch, imported on the first call that makes or reads a tensor instead of at ``import pyfast_buffer``.

torch takes seconds to import; a Ray producer that only puts ids, steps and payload bytes never needs it. Two
questions are asked here without importing it: a value can only be a tensor if torch is already loaded (whoever
made the tensor imported it), and pinned memory is only possible with a torch built for CUDA or ROCm.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import Any

#: torch once this process has finished importing it; None before. Kept here so that the hot paths pay one global
#: read, and so that a module another thread is still importing is never mistaken for torch (see ``loaded``).
_TORCH: Any = None


def _finished(module: Any) -> bool:
    """Whether ``module`` has finished executing its import. While a thread is inside ``import torch`` (about 2 s),
    ``sys.modules["torch"]`` already holds the partly built module, without ``Tensor``, ``int64`` and the rest;
    importlib marks such a module's spec ``_initializing`` until its code has run (the flag its own module lock
    is decided by), so that flag is read here too."""
    spec = getattr(module, "__spec__", None)
    return not getattr(spec, "_initializing", False)


def require() -> Any:
    """torch, imported now if it is not yet; without torch installed, the ``ModuleNotFoundError: No module named
    'torch'`` that ``import pyfast_buffer`` raised before torch became lazy. While another thread is importing
    torch this waits for that import to finish (importlib's module lock), never returning a half-built module."""
    global _TORCH
    if _TORCH is not None:
        return _TORCH
    import torch  # blocks on the import lock while another thread is still running torch's __init__

    _TORCH = torch
    return torch


def loaded() -> Any:
    """torch if this process has finished importing it, else None (then no argument can be a tensor: a tensor is
    made by torch's code, which cannot hand one out before its own import has finished)."""
    global _TORCH
    if _TORCH is not None:
        return _TORCH
    module = sys.modules.get("torch")
    if module is None or not _finished(module):
        return None
    _TORCH = module
    return module


def is_tensor(value: object) -> bool:
    """Whether ``value`` is a tensor, without importing torch (none exists before torch is loaded)."""
    torch = loaded()
    return torch is not None and isinstance(value, torch.Tensor)


def may_have_gpu() -> bool:
    """False when torch is missing or its build has neither CUDA nor ROCm (``torch.version.cuda`` and ``.hip``
    both None), read from torch/version.py without importing torch; True when a GPU build is installed."""
    torch = loaded()
    if torch is not None:
        return torch.version.cuda is not None or torch.version.hip is not None
    try:
        spec = importlib.util.find_spec("torch")  # finds the package on sys.path without running its __init__
    except ImportError:  # a finder refused it: torch cannot be imported, so nothing can be pinned
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        with open(os.path.join(next(iter(spec.submodule_search_locations)), "version.py"), encoding="utf-8") as file:
            text = file.read()
    except OSError:  # an unusual layout: ask torch itself
        return True
    # version.py assigns e.g. `cuda: Optional[str] = None` on a CPU build and `cuda: Optional[str] = '12.8'` on
    # a CUDA one; anything this pattern cannot read counts as a possible GPU, so torch is asked.
    for name in ("cuda", "hip"):
        match = re.search(rf"^{name}\s*(?::[^=\n]*)?=\s*(.+)$", text, re.MULTILINE)
        if match is None or match.group(1).strip() != "None":
            return True
    return False


def cuda_available() -> bool:
    """``torch.cuda.is_available()``, importing torch only where a GPU build makes the answer possibly True."""
    return may_have_gpu() and bool(require().cuda.is_available())
