"""Reading what the sampler needs from a TorchRL storage: its dim-0 size, the slots a write named, and one column
(versions, group ids, lengths) at those slots, for tensor storages (LazyTensorStorage, LazyMemmapStorage) and list
storages (ListStorage, LazyStackStorage) alike. Only the storage object is touched; no torchrl import.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

_NO_SLOTS = np.empty(0, np.int64)


def dim0_capacity(storage: Any) -> int:
    """How many dim-0 slots the storage has (an entry of ours is one dim-0 slot)."""
    size: Any = getattr(storage, "_max_size_along_dim0", None)
    if callable(size):
        size = size()
    if size is None:
        size = storage.max_size
    return int(size)


def dim0_len(storage: Any) -> int:
    """How many dim-0 slots hold data (slots ``[0, len)`` under round-robin writing)."""
    if getattr(storage, "ndim", 1) > 1:
        return int(storage._len_along_dim0)
    return len(storage)


def inner_cells(storage: Any) -> int:
    """Cells per dim-0 slot (1 for a 1-d storage; ``prod(shape[1:])`` for ``ndim > 1``)."""
    ndim = getattr(storage, "ndim", 1)
    if ndim <= 1:
        return 1
    return int(np.prod(tuple(storage.shape)[1:ndim]))


def written_slots(index: Any) -> np.ndarray:
    """The dim-0 slots a writer's index names, in write order, without the ``-1`` a max-value writer reports for
    rows it did not write; an ``ndim > 1`` writer's ``[N, ndim]`` index counts each slot once. A write longer than
    the storage names a slot more than once (``SlotBook.overwritten`` keeps its last write)."""
    if index is None:
        return _NO_SLOTS
    if isinstance(index, tuple):
        index = index[0]
    t = torch.as_tensor(index)
    cells = t.ndim == 2  # an ndim > 1 writer names cells, (slot, inner...) per row: a slot once per cell
    if cells:
        t = t[:, 0]
    slots = t.reshape(-1).to(torch.int64).cpu().numpy()
    slots = slots[slots >= 0]
    if cells and len(slots) > 1:  # each slot's cells, in a row: one per slot
        slots = slots[np.concatenate(([True], slots[1:] != slots[:-1]))]
    return slots


def column_values(storage: Any, key: Any) -> Optional[torch.Tensor]:
    """The whole column ``key`` of a tensor storage (a view), or None (no such key, or a list storage)."""
    backing = getattr(storage, "_storage", None)
    get = getattr(backing, "get", None)
    if get is None or isinstance(backing, (list, torch.Tensor)):
        return None
    try:
        values = get(key, None)
    except (KeyError, TypeError):
        return None
    return values if isinstance(values, torch.Tensor) else None


def column(storage: Any, key: Any, slots: np.ndarray, reduce: str = "min") -> Optional[np.ndarray]:
    """``key`` at ``slots`` as int64 (one value per slot: an ``ndim > 1`` slot's cells reduced by ``reduce``),
    or None when the storage's data has no such key."""
    backing = getattr(storage, "_storage", None)
    if backing is None or not len(slots):
        return None if backing is None else np.empty(0, np.int64)
    if isinstance(backing, list):
        found = []
        for s in slots.tolist():
            item = backing[s]
            get = getattr(item, "get", None)
            value = get(key, None) if get is not None else None
            if value is None:
                return None
            found.append(_reduce(torch.as_tensor(value).reshape(1, -1), reduce)[0])
        return np.asarray(found, np.int64)
    values = column_values(storage, key)
    if values is None:
        return None
    picked = values[torch.from_numpy(slots)]
    return _reduce(picked.reshape(len(slots), -1), reduce)


def _reduce(values: torch.Tensor, reduce: str) -> np.ndarray:
    if values.shape[1] != 1:
        values = values.amin(1, keepdim=True) if reduce == "min" else values.float().mean(1, keepdim=True)
    return values.reshape(-1).to(torch.int64).cpu().numpy()
