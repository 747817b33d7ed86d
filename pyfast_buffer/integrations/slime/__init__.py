"""slime (THUDM/slime) integration: a staleness-bounded data source, a fully-async rollout function over it, and
a buffer filter, all loaded by slime by path (docs/slime.md)::

    --data-source-path pyfast_buffer.integrations.slime.StalenessDataSource
    --rollout-function-path pyfast_buffer.integrations.slime.generate_rollout_fully_async
    --custom-config-path ours.yaml          # pyfast_buffer_strategy: pace, pyfast_buffer_max_age: 2

or, for slime's non-fully-async path, ``--buffer-filter-path pyfast_buffer.integrations.slime.buffer_filter`` with
``--rollout-function-path pyfast_buffer.integrations.slime.generate_rollout`` (slime's own, telling the filter the
engine's weight version).

``StalenessDataSource`` subclasses slime's ``DataSource`` and is imported when first asked for (it needs a
checkout of THUDM/slime on the path: slime is not on PyPI); the rest imports nothing of slime until called, so this
module imports, star-imports and ``help()``s without slime.

Absolute imports only, and the package named in full: slime may load this file by path.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, List

from pyfast_buffer.integrations.slime._filter import StalenessBufferFilter, buffer_filter, generate_rollout
from pyfast_buffer.integrations.slime._options import MAX_AGE_ENV, STRATEGY_ENV, read_options
from pyfast_buffer.integrations.slime._rollout import generate_rollout_fully_async, stop_worker
from pyfast_buffer.integrations.slime._source_core import StalenessSourceCore
from pyfast_buffer.integrations.slime._state import state_path

if TYPE_CHECKING:  # loaded by __getattr__ on first use at run time (it imports slime)
    from pyfast_buffer.integrations.slime._source import StalenessDataSource  # noqa: F401 - for type checkers

#: This package's import name, spelled out: slime may load this file by path under another module name.
_PACKAGE = "pyfast_buffer.integrations.slime"
#: Names loaded on first use, and the module of this package that defines each (it imports slime).
_LAZY = {"StalenessDataSource": "_source"}
_HOW = "put a checkout of THUDM/slime on PYTHONPATH (slime is not on PyPI; docs/slime.md)"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# A star import binds a lazy name only where slime can be imported, so it never fails.
__all__ = [
    "MAX_AGE_ENV",
    "STRATEGY_ENV",
    "StalenessBufferFilter",
    "StalenessSourceCore",
    "buffer_filter",
    "generate_rollout",
    "generate_rollout_fully_async",
    "read_options",
    "state_path",
    "stop_worker",
    *(sorted(_LAZY) if _installed("slime") else []),
]


def __getattr__(name: str) -> Any:
    """Imports the module behind a lazy name on first use; without slime, says how to get it."""
    if name not in _LAZY:
        raise AttributeError(f"module {_PACKAGE!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f"{_PACKAGE}.{_LAZY[name]}")
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{_PACKAGE}.{name} subclasses slime's DataSource and needs slime, not importable here (no module named"
            f" {exc.name!r}): {_HOW}",
            name=exc.name,
        ) from exc
    return getattr(module, name)


def __dir__() -> List[str]:
    # help() and IDEs read every name listed here: a lazy one is listed only where it can be loaded.
    return sorted([*globals(), *(name for name in __all__ if name in _LAZY)])
