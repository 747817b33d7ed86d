"""Where our state lives in a slime checkpoint, and how it is written (whole or not at all)."""

from __future__ import annotations

import os

from pyfast_buffer import durable


def state_path(root: str, rollout_id: int) -> str:
    """Our state saved at rollout ``rollout_id`` under ``--save``/``--load`` folder ``root``: beside slime's own
    ``rollout/global_dataset_state_dict_{rollout_id}.pt``."""
    return os.path.join(root, "rollout", f"pyfast_buffer_state_{rollout_id}.pkl")


def write_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` through the package's one writer (``durable.write_file``: temporary file, fsync,
    rename, fsync of the folder): a process killed mid-save leaves the previous file or the new one, whole, and a
    finished save survives a power cut (docs/checkpoints.md). Creates the folder if needed."""
    durable.make_directories(os.path.dirname(os.path.abspath(path)))
    durable.write_file(path, data)
