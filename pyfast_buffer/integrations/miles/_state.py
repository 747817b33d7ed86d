"""Where the Miles buffer's state lives in a Miles checkpoint directory (``--save`` / ``--load``)."""

from __future__ import annotations

import os

#: The folder under ``--save`` / ``--load`` for our state, one file per saved rollout id.
STATE_DIR = "pyfast_buffer"


def state_path(root: str, rollout_id: int) -> str:
    """The file holding the buffer's state saved after rollout ``rollout_id`` under checkpoint folder ``root``:
    ``miles_buffer_<rollout_id>.pfb`` (our checkpoint format), or, when only that exists, the ``.pkl`` an earlier
    build wrote, so a checkpoint made before the change still resumes (``StalenessDataBuffer.load`` reads both)."""
    path = os.path.join(root, STATE_DIR, f"miles_buffer_{rollout_id}.pfb")
    legacy = f"{path[: -len('.pfb')]}.pkl"
    return legacy if not os.path.exists(path) and os.path.exists(legacy) else path
