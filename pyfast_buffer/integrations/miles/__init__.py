"""Miles (radixark/miles) integration: a staleness-bounded fully-async data buffer and a paced rollout function.

Switched on with Miles's own flags (docs/miles.md), one of::

    --fully-async --custom-async-data-buffer-path pyfast_buffer.integrations.miles.StalenessDataBuffer  # drop
    --rollout-function-path pyfast_buffer.integrations.miles.StalenessRolloutFn  # pace (or wait, drop), resumable

``StalenessDataBuffer`` imports nothing of Miles: it follows Miles's ``DataBuffer`` contract by shape, so this
module imports, star-imports and ``help()``s without Miles. ``StalenessRolloutFn`` subclasses Miles's
``FullyAsyncRolloutFn``, so it is imported when first asked for and needs a checkout of Miles on the path (Miles has
no usable PyPI release: ``miles-rl`` 0.0.2 predates the fully-async data buffer).

Absolute imports only, and the package named in full: a framework may load this file by path.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, List

from pyfast_buffer.integrations.miles._buffer import STRATEGY_ENV, StalenessDataBuffer
from pyfast_buffer.integrations.miles._state import state_path

if TYPE_CHECKING:  # loaded by __getattr__ on first use at run time (it imports Miles)
    from pyfast_buffer.integrations.miles._rollout import StalenessRolloutFn  # noqa: F401 - for type checkers

_PACKAGE = "pyfast_buffer.integrations.miles"
#: Names loaded on first use, and the module of this package that defines each (it imports Miles).
_LAZY = {"StalenessRolloutFn": "_rollout"}
_HOW = "put a checkout of radixark/miles on PYTHONPATH (docs/miles.md)"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# A star import binds a lazy name only where Miles can be imported, so it never fails.
__all__ = ["STRATEGY_ENV", "StalenessDataBuffer", "state_path", *(sorted(_LAZY) if _installed("miles") else [])]


def __getattr__(name: str) -> Any:
    """Imports the module behind a lazy name on first use; without Miles, says how to get it."""
    if name not in _LAZY:
        raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f"{_PACKAGE}.{_LAZY[name]}")
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{_PACKAGE}.{name} subclasses Miles's FullyAsyncRolloutFn and needs Miles, not importable here (no module"
            f" named {exc.name!r}): {_HOW}",
            name=exc.name,
        ) from exc
    return getattr(module, name)


def __dir__() -> List[str]:
    # help() and IDEs read every name listed here: a lazy one is listed only where it can be loaded.
    return sorted([*globals(), *(name for name in __all__ if name in _LAZY)])
