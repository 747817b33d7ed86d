"""Stand-ins for the packages a framework's rollout modules import but that cannot install on a CPU machine
(sglang, ray, ...): any ``import root`` or ``import root.x.y`` of a stubbed root gets a module whose every
attribute is a ``MagicMock``. Only module-level imports and decorators touch them on the paths the tests run.
Used by the upstream runners; not collected by pytest.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Iterable
from unittest import mock


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = mock.MagicMock(name=f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = frozenset(roots)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install(roots: Iterable[str]) -> None:
    """Stubs every root in ``roots`` that is not importable for real."""
    import importlib.util

    missing = [r for r in roots if r not in sys.modules and importlib.util.find_spec(r) is None]
    if missing:
        sys.meta_path.insert(0, _StubFinder(missing))
