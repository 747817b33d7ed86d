"""Starting a private local Ray cluster for this project's tests and benchmarks."""

from __future__ import annotations

import os
import tempfile
from typing import Any


def init_local_cluster(**kwargs: Any) -> None:
    """Starts a local cluster of its own (``ray.init(address="local", ...)``) from a neutral directory.

    Ray puts the driver's working directory first on every worker's ``sys.path``. Run from a source
    checkout, that directory holds the uncompiled ``pyfast_buffer`` package, which would shadow the
    installed one in every worker; starting Ray from a temporary directory keeps workers on the install.
    """
    import ray

    here = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="pyfast-buffer-ray-") as neutral:
        os.chdir(neutral)
        try:
            ray.init(address="local", **kwargs)
        finally:
            os.chdir(here)
