"""Where our state lives in a slime checkpoint, and how it is written (whole or not at all) and read (checked)."""

from __future__ import annotations

import os

import numpy as np

from pyfast_buffer import checkpoint, durable

#: The ``format`` of the checked file ``write_state`` writes: the pickled state as raw bytes under its sha256.
FILE_FORMAT = "pyfast_buffer.slime.state/1"
PICKLE_START = b"\x80"  # the PROTO opcode every pickle of protocol 2 or later starts with (earlier builds' files)


def state_path(root: str, rollout_id: int) -> str:
    """Our state saved at rollout ``rollout_id`` under ``--save``/``--load`` folder ``root``: beside slime's own
    ``rollout/global_dataset_state_dict_{rollout_id}.pt``."""
    return os.path.join(root, "rollout", f"pyfast_buffer_state_{rollout_id}.pkl")


def write_state(path: str, pickled: bytes) -> None:
    """Writes the pickled state to ``path`` in the package's checked format (``checkpoint.save_state``, through
    ``durable.write_file``: temporary file, fsync, rename, fsync of the folder; missing folders created): a process
    killed mid-save leaves the previous file or the new one, whole, and a damaged file is refused before anything in
    it is unpickled (docs/checkpoints.md). The file keeps its ``.pkl`` name, so a resume finds it where it was."""
    durable.make_directories(os.path.dirname(os.path.abspath(path)))
    checkpoint.save_state({"format": FILE_FORMAT, "pickle": np.frombuffer(pickled, dtype=np.uint8)}, path)


def read_state(path: str) -> bytes:
    """The pickled state ``write_state`` stored at ``path``, after the file's checks (length, sha256) passed, or
    the whole file where an earlier build wrote a plain pickle (told by its first byte, as Miles's loader does).
    A damaged or foreign file raises CheckpointError naming it."""
    with open(path, "rb") as f:
        if f.read(1) == PICKLE_START:  # earlier builds wrote the pickle itself, unchecked
            f.seek(0)
            return f.read()
    tree = checkpoint.load_state(path)
    if not isinstance(tree, dict) or tree.get("format") != FILE_FORMAT or "pickle" not in tree:
        raise checkpoint.CheckpointError(
            path, f"is not a slime data-source state ({FILE_FORMAT}); point --load at the folder --save wrote"
        )
    return np.asarray(tree["pickle"]).tobytes()
