"""pyfast_buffer in TorchRL: ``StalenessSampler``, a replay-buffer ``Sampler`` that trains only fresh-enough data.

    from pyfast_buffer.integrations.torchrl import StalenessSampler
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(65_536), batch_size=512,
                                sampler=StalenessSampler(max_age=2))
    ...
    sampler.consumer_version = collector.policy_version   # after each weight update

docs/torchrl.md has the arguments, what maps to what, and what was measured. Needs ``pip install
"pyfast_buffer[torchrl]"``; torchrl is imported by this subpackage only, when ``StalenessSampler`` is first asked
for: the module imports, star-imports and ``help()``s without it.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, List

if TYPE_CHECKING:  # at run time loaded by __getattr__ on first use (it subclasses torchrl's Sampler)
    from pyfast_buffer.integrations.torchrl._sampler import StalenessSampler  # noqa: F401 - for type checkers

_LAZY = ("StalenessSampler",)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# A star import binds StalenessSampler only where torchrl is installed, so it never fails.
__all__ = list(_LAZY) if _installed("torchrl") else []


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from pyfast_buffer.integrations.torchrl import _sampler
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{__name__}.{name} subclasses torchrl's Sampler and needs torchrl, not installed here (no module named "
            f"{exc.name!r}): pip install 'pyfast_buffer[torchrl]'",
            name=exc.name,
        ) from exc
    return getattr(_sampler, name)


def __dir__() -> List[str]:
    # help() and IDEs read every name listed here: a lazy one is listed only where it can be loaded.
    return sorted([*globals(), *__all__])
