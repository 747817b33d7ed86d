"""pytest plugin for the sanitizer run (.ci/sanitizers.sh loads it with ``-p native_only_plugin``): deselects
the cases that run only the pure-Python twin (``impl`` parametrized as "reference"), which give ASan and
UBSan nothing to see; tests that compare the two implementations stay."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        only_twin = callspec is not None and callspec.params.get("impl") == "reference"
        (drop if only_twin else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
