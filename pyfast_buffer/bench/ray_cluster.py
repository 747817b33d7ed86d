"""Starting a private local Ray cluster: for ``pyfast-buffer bench --cases ray`` and the project's Ray tests."""

from __future__ import annotations

import os
import tempfile
from typing import Any


def init_local_cluster(**kwargs: Any) -> None:
    """Starts a local cluster of its own (``ray.init(address="local", ...)``) from a neutral directory.

    Ray puts the driver's working directory first on every worker's ``sys.path``. Run from a source
    checkout, that directory holds the uncompiled ``pyfast_buffer`` package, which would shadow the
    installed one in every worker; starting Ray from the temporary directory keeps workers on the install.
    """
    import ray

    # Workers keep the driver's directory as their own working directory, so it must outlive the cluster:
    # the system's temporary directory, not one made (and removed) here.
    here = os.getcwd()
    os.chdir(tempfile.gettempdir())
    try:
        ray.init(address="local", **kwargs)
    finally:
        os.chdir(here)
