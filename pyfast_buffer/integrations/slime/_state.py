"""Where our state lives in a slime checkpoint, and how it is written (whole or not at all)."""

from __future__ import annotations

import os
import tempfile


def state_path(root: str, rollout_id: int) -> str:
    """Our state saved at rollout ``rollout_id`` under ``--save``/``--load`` folder ``root``: beside slime's own
    ``rollout/global_dataset_state_dict_{rollout_id}.pt``."""
    return os.path.join(root, "rollout", f"pyfast_buffer_state_{rollout_id}.pkl")


def write_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` to a temporary file in the same folder and renames it over ``path``: a crash mid-save
    leaves the previous file, never a truncated one."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".pyfast_buffer_", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
