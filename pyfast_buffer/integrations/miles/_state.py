"""Where the Miles buffer's state lives in a Miles checkpoint directory (``--save`` / ``--load``)."""

from __future__ import annotations

import os

#: The folder under ``--save`` / ``--load`` for our state, one file per saved rollout id.
STATE_DIR = "pyfast_buffer"


def state_path(root: str, rollout_id: int) -> str:
    """The file holding the buffer's state saved after rollout ``rollout_id`` under checkpoint folder ``root``."""
    return os.path.join(root, STATE_DIR, f"miles_buffer_{rollout_id}.pkl")
