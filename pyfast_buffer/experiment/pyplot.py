"""The one place the experiment imports matplotlib (the ``demo`` extra): headless, and a reason when it is missing.

Every figure function returns the path it wrote, or ``NO_MATPLOTLIB`` (a string starting "no figure") that the
runner prints instead; none raises for a missing optional extra.
"""

from __future__ import annotations

from typing import Any, Optional

NO_MATPLOTLIB = "no figure: matplotlib is not installed (pip install 'pyfast_buffer[demo]' adds it)"


def pyplot() -> Optional[Any]:
    """Returns ``matplotlib.pyplot`` on the Agg backend (files only, never a window), or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
