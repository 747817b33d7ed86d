"""Durable checkpoints: a buffer's state_dict saved atomically to one file, loaded back whole or refused whole.

File layout (all integers little-endian)::

    offset 0   magic          8 bytes  b"\\x89PFB\\r\\n\\x1a\\n"
    offset 8   version        u32      FORMAT_VERSION
    offset 12  header_bytes   u64      length of the JSON header
    offset 20  payload_bytes  u64      length of the array payload
    offset 28  sha256         32 bytes over bytes [0, 28) + header + payload
    offset 60  header         JSON: the state_dict's tree, arrays replaced by references; padded with spaces
    ...        payload        raw bytes of every array, each at a 64-byte aligned offset

The header is JSON and the payload is raw numbers, so loading a file runs no code from it (unlike
pickle or ``torch.load(weights_only=False)``). The writer is generic: any nested dict/list/tuple of
tensors, numpy arrays, ints, floats, strings, bools and None is stored, so new state_dict keys need no
change here. Why each check exists and what the atomicity guarantees are: docs/checkpoints.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, Union

import numpy as np

from . import _torch, durable

if TYPE_CHECKING:  # torch loads when a checkpoint holds or yields a tensor, not with the package
    import torch

MAGIC = b"\x89PFB\r\n\x1a\n"  # PNG-style: a high byte and CR/LF/EOF catch text-mode and 7-bit mangling
FORMAT_VERSION = 1
IN_FLIGHT_CHOICES = ("keep", "fail")
#: What load does with restored in-flight prompts unless told: their workers are usually gone (docs/checkpoints.md).
DEFAULT_IN_FLIGHT = "fail"
#: Suffix of the temporary files save writes next to the target (``.<name>.<host>.<pid>.<token>.pfb-tmp``).
TEMP_SUFFIX = durable.TEMP_SUFFIX

_PREFIX = struct.Struct("<8sIQQ")
_DIGEST_BYTES = 32
_FIXED_BYTES = _PREFIX.size + _DIGEST_BYTES
_ALIGN = 64
_ARRAY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: plain numbers, never objects
_MAX_DEPTH = 64

PathLike = Union[str, "os.PathLike[str]"]


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded: torn, truncated, corrupt, or of another format version."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"checkpoint {path!r} {problem}")
        self.path = path
        self.problem = problem

    def __reduce__(self) -> tuple:
        # Rebuild from (path, problem), not from the formatted message, so it crosses processes (Ray, multiprocessing).
        return (type(self), (self.path, self.problem))


class Checkpointable(Protocol):
    """What save/load need from a buffer: both StalenessBuffer and ReferenceBuffer provide it."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

    def fail(self, prompt_ids: Any) -> None: ...


# -- writing ----------------------------------------------------------------------------------------------------


def _as_array(value: Any, where: str) -> np.ndarray:
    if _torch.is_tensor(value):
        try:
            array = value.detach().cpu().contiguous().numpy()
        except TypeError as exc:  # e.g. bfloat16, which numpy cannot hold
            raise TypeError(
                f"{where} is a {value.dtype} tensor, which this format cannot store; "
                "convert it to a numpy-compatible dtype before saving"
            ) from exc
    else:
        array = np.ascontiguousarray(value)
    if array.dtype.kind not in _ARRAY_KINDS:
        raise TypeError(f"{where} has dtype {array.dtype}; checkpoints store numeric arrays only")
    return array


def _encode(node: Any, where: str, arrays: list[np.ndarray], depth: int = 0) -> Any:
    """Returns ``node`` as a JSON tree: scalars stay bare, every container and array is a one-key tagged object."""
    if depth > _MAX_DEPTH:
        raise TypeError(f"{where} is nested deeper than {_MAX_DEPTH} levels; a state_dict is a shallow tree")
    if node is None or isinstance(node, (bool, str)):
        return node
    if isinstance(node, (np.bool_,)):
        return bool(node)
    if isinstance(node, (int, np.integer)):
        return int(node)
    if isinstance(node, (float, np.floating)):
        return float(node)
    if isinstance(node, np.ndarray) or _torch.is_tensor(node):
        arrays.append(_as_array(node, where))
        return {"ndarray" if isinstance(node, np.ndarray) else "tensor": len(arrays) - 1}
    if isinstance(node, dict):
        bad = [k for k in node if not isinstance(k, str)]
        if bad:
            raise TypeError(f"{where} has key {bad[0]!r}; checkpoints store dicts with string keys only")
        return {"dict": {k: _encode(v, f"{where}[{k!r}]", arrays, depth + 1) for k, v in node.items()}}
    if isinstance(node, (list, tuple)):
        items = [_encode(v, f"{where}[{i}]", arrays, depth + 1) for i, v in enumerate(node)]
        return {"tuple" if isinstance(node, tuple) else "list": items}
    raise TypeError(
        f"{where} is a {type(node).__name__}; checkpoints store dicts, lists, tuples, tensors, "
        "numpy arrays, ints, floats, strings, bools and None"
    )


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _bytes_of(array: np.ndarray) -> memoryview:
    return array.reshape(-1).view(np.uint8).data


def _serialize(state: Any) -> tuple[bytes, bytes, list[tuple[int, np.ndarray]], int]:
    """Returns (prefix with digest, header, [(payload offset, array)], payload bytes); touches no file."""
    arrays: list[np.ndarray] = []
    tree = _encode(state, "state", arrays)
    specs, layout, end = [], [], 0
    for array in arrays:
        offset = _aligned(end)
        specs.append({"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset, "nbytes": array.nbytes})
        layout.append((offset, array))
        end = offset + array.nbytes
    header = json.dumps({"tree": tree, "arrays": specs}, separators=(",", ":")).encode()
    header += b" " * (_aligned(_FIXED_BYTES + len(header)) - _FIXED_BYTES - len(header))  # payload starts aligned
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header), end)
    digest = hashlib.sha256(prefix)
    digest.update(header)
    for _offset, array, gap in _with_gaps(layout):
        digest.update(gap)
        digest.update(_bytes_of(array))
    return prefix + digest.digest(), header, layout, end


def _with_gaps(layout: list[tuple[int, np.ndarray]]) -> list[tuple[int, np.ndarray, bytes]]:
    """Each array with the zero padding that precedes it in the payload."""
    out, end = [], 0
    for offset, array in layout:
        out.append((offset, array, bytes(offset - end)))
        end = offset + array.nbytes
    return out


# The writer moved to ``durable`` (every save of the package shares it); 0.1.0 documented this name here.
orphaned_temp_files = durable.orphaned_temp_files


def _write_all(f: BinaryIO, head: bytes, header: bytes, layout: list[tuple[int, np.ndarray]]) -> None:
    f.write(head)
    f.write(header)
    for _, array, gap in _with_gaps(layout):
        f.write(gap)
        f.write(_bytes_of(array))


def save_state(state: dict[str, Any], path: PathLike, fsync: bool = True) -> None:
    """Writes ``state`` (a state_dict, or any tree of the supported types) to ``path`` atomically.

    Through ``durable.write_file``: a temporary file in the same directory is written, flushed and fsynced,
    renamed over ``path`` and the directory fsynced: a reader sees the old file or the new one, never a mix. If
    anything fails before the rename, the temporary file is removed and ``path`` is untouched. After a
    successful save, temporary files of ``path`` left by killed saves on this host are removed. Missing parent
    folders are created (each fsynced into its parent); an empty path or one ending in a separator raises
    ValueError before anything is written. ``fsync=False`` skips the fsyncs: the file then survives the death
    of the writing process (the rename is still atomic) but not the machine's, for a caller that rewrites it
    many times a second.
    """
    head, header, layout, _ = _serialize(state)  # a state that cannot be stored fails here, before any file
    durable.write_file(path, lambda f: _write_all(f, head, header, layout), fsync=fsync)


# -- reading ----------------------------------------------------------------------------------------------------


def _read_bytes(path: str) -> np.ndarray:
    """The whole file in a writable, 64-byte aligned array, so loaded tensors are aligned views of it (no copy)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        raw = np.empty(size + _ALIGN, np.uint8)
        start = -raw.ctypes.data % _ALIGN
        data = raw[start : start + size]
        view, done = data.data, 0
        while done < size:
            n = f.readinto(view[done:])
            if not n:
                break
            done += n
    if done != size:
        raise CheckpointError(
            path,
            f"shrank from {size} to {done} bytes while being read; another process "
            "is rewriting it in place: retry once it is done",
        )
    return data


def _check_frame(path: str, data: np.ndarray) -> int:
    """Checks magic, version, length and checksum; returns the header length."""
    size = len(data)
    if size < _FIXED_BYTES:
        raise CheckpointError(
            path,
            f"is {size} bytes, shorter than the {_FIXED_BYTES}-byte checkpoint header: "
            "truncated, or not a pyfast_buffer checkpoint",
        )
    magic, version, header_bytes, payload_bytes = _PREFIX.unpack_from(data.data)
    if magic != MAGIC:
        raise CheckpointError(
            path,
            f"does not start with the pyfast_buffer checkpoint magic (found {magic!r}); "
            "it is not a checkpoint written by save(), or its first bytes are damaged",
        )
    if version != FORMAT_VERSION:
        newer = "a newer pyfast_buffer: upgrade" if version > FORMAT_VERSION else "an older pyfast_buffer"
        raise CheckpointError(
            path,
            f"has format version {version}, this pyfast_buffer reads version "
            f"{FORMAT_VERSION}; it was written by {newer}, or its header is damaged",
        )
    expected = _FIXED_BYTES + header_bytes + payload_bytes
    if size != expected:
        how = "truncated (a torn or incomplete write or copy)" if size < expected else "followed by extra bytes"
        raise CheckpointError(
            path, f"is {size} bytes but its header announces {expected}: {how}, or corrupt; load an older checkpoint"
        )
    digest = hashlib.sha256(data[: _PREFIX.size].data)
    digest.update(data[_FIXED_BYTES:].data)
    if digest.digest() != data[_PREFIX.size : _FIXED_BYTES].tobytes():
        raise CheckpointError(
            path,
            "fails its sha256 checksum: the file is corrupt (damaged storage, a torn "
            "copy or an edit); load an older checkpoint",
        )
    return int(header_bytes)


def _array_from(path: str, data: np.ndarray, base: int, payload_bytes: int, spec: Any) -> np.ndarray:
    malformed = CheckpointError(path, f"has a malformed array entry {spec!r} in its header")
    if not isinstance(spec, dict) or not isinstance(spec.get("dtype"), str):
        raise malformed
    shape, offset, nbytes = spec.get("shape"), spec.get("offset"), spec.get("nbytes")
    if not (
        isinstance(shape, list)
        and all(type(d) is int and d >= 0 for d in shape)
        and type(offset) is int
        and type(nbytes) is int
        and offset >= 0
        and offset + nbytes <= payload_bytes
    ):
        raise malformed
    try:
        dtype = np.dtype(spec["dtype"])
    except TypeError as exc:
        raise malformed from exc
    if dtype.kind not in _ARRAY_KINDS or dtype.itemsize * math.prod(shape) != nbytes:
        raise malformed
    array = data[base + offset : base + offset + nbytes].view(dtype).reshape(shape)
    return array if dtype.isnative else array.astype(dtype.newbyteorder("="))


def _decode(path: str, node: Any, arrays: list[np.ndarray], depth: int = 0) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if depth > _MAX_DEPTH or not isinstance(node, dict) or len(node) != 1:
        raise CheckpointError(path, "has a malformed state tree in its header")
    ((tag, value),) = node.items()
    if tag in ("tensor", "ndarray"):
        if not (type(value) is int and 0 <= value < len(arrays)):
            raise CheckpointError(path, f"refers to array {value!r} but its header lists {len(arrays)} arrays")
        return _torch.require().from_numpy(arrays[value]) if tag == "tensor" else arrays[value]
    if tag == "dict" and isinstance(value, dict):
        return {k: _decode(path, v, arrays, depth + 1) for k, v in value.items()}
    if tag in ("list", "tuple") and isinstance(value, list):
        items = [_decode(path, v, arrays, depth + 1) for v in value]
        return tuple(items) if tag == "tuple" else items
    raise CheckpointError(path, f"has an unknown node {tag!r} in its state tree")


def load_state(path: PathLike) -> Any:
    """Reads a file written by save()/save_state() and returns its state, or raises CheckpointError.

    Every check (magic, version, length, sha256, header structure) runs before anything is returned.
    A missing or unreadable file raises the usual OSError (FileNotFoundError, PermissionError).
    """
    name = os.fspath(path)
    data = _read_bytes(name)
    header_bytes = _check_frame(name, data)
    payload_bytes = len(data) - _FIXED_BYTES - header_bytes
    try:
        header = json.loads(data[_FIXED_BYTES : _FIXED_BYTES + header_bytes].tobytes())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(name, f"has a header that is not valid JSON ({exc})") from exc
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list) or "tree" not in header:
        raise CheckpointError(name, "has a header without 'tree' and 'arrays'")
    base = _FIXED_BYTES + header_bytes
    arrays = [_array_from(name, data, base, payload_bytes, spec) for spec in header["arrays"]]
    return _decode(name, header["tree"], arrays)


def recorded_digest(path: PathLike) -> str:
    """The sha256 (hex) recorded in the frame of the checkpoint file at ``path``, read without checking the file:
    ``load_state`` checks that it is the file's own. A manifest that stores it ties the file to a save (TRL's
    folder does). A file too short to hold one raises CheckpointError."""
    name = os.fspath(path)
    with open(name, "rb") as f:
        frame = f.read(_FIXED_BYTES)
    if len(frame) != _FIXED_BYTES:
        raise CheckpointError(name, f"is shorter than the {_FIXED_BYTES}-byte checkpoint header: truncated")
    return frame[_PREFIX.size :].hex()


# -- the buffer methods -----------------------------------------------------------------------------------------


def save(buffer: Checkpointable, path: PathLike) -> None:
    """Saves ``buffer.state_dict()`` to ``path`` atomically (see save_state)."""
    save_state(buffer.state_dict(), path)


def _check_in_flight(in_flight: str) -> None:
    if not isinstance(in_flight, str) or in_flight not in IN_FLIGHT_CHOICES:
        raise ValueError(
            f"in_flight={in_flight!r} is unknown; use 'fail' (restored in-flight prompts are failed "
            "and counted) or 'keep' (they stay in flight for workers that still run)"
        )


def restore(
    buffer: Checkpointable, state: Any, in_flight: str = DEFAULT_IN_FLIGHT, path: PathLike = ""
) -> torch.Tensor:
    """``load`` for a state_dict already read (one stored inside a larger ``save_state`` tree, as the integrations
    keep theirs): loads it into ``buffer`` and applies ``in_flight``; returns the restored prompts it failed.
    ``path`` only names the file in the error for a tree that holds no state_dict."""
    _check_in_flight(in_flight)
    if not isinstance(state, dict):
        raise CheckpointError(
            os.fspath(path), "holds no state_dict; it was written by save_state() from something else"
        )
    buffer.load_state_dict(state)
    torch = _torch.require()  # load returns the restored prompts as a tensor
    prompts = torch.as_tensor(state["in_flight"]["prompt_id"], dtype=torch.int64)
    if in_flight == "keep" or len(prompts) == 0:
        return prompts[:0]
    buffer.fail(prompts)
    return prompts


def load(buffer: Checkpointable, path: PathLike, in_flight: str = DEFAULT_IN_FLIGHT) -> torch.Tensor:
    """Replaces ``buffer``'s state with the checkpoint at ``path``; returns the restored prompts it failed.

    in_flight: ``"fail"`` (default) fails every restored in-flight prompt right after the load, through
        ``buffer.fail`` (counted in the ledger's ``failed``), since the workers that held them are usually
        gone; dispatch the returned ids again. ``"keep"`` keeps them in flight: under ``wait`` they block
        take until completed, failed, or (with leases) expired.

    A file that fails any check raises CheckpointError; one the buffer refuses (capacity too small,
    max_uses too low) raises load_state_dict's ValueError. Either way the buffer is unchanged.
    """
    _check_in_flight(in_flight)  # before the file is opened
    return restore(buffer, load_state(path), in_flight, path)


class CheckpointMethods:
    """``save``/``load`` methods for a buffer class (both StalenessBuffer and ReferenceBuffer inherit them)."""

    def save(self: Checkpointable, path: PathLike) -> None:
        """Writes the state to ``path`` (str or os.PathLike) atomically: the old file or the new, never a mix."""
        save(self, path)

    def load(self: Checkpointable, path: PathLike, in_flight: str = DEFAULT_IN_FLIGHT) -> torch.Tensor:
        """Replaces the state with a save()d file, or raises CheckpointError changing nothing.

        ``in_flight="fail"`` fails restored in-flight prompts (their workers are usually gone) and returns
        their ids to dispatch again; ``"keep"`` keeps them in flight (under wait they block take).
        """
        return load(self, path, in_flight)
