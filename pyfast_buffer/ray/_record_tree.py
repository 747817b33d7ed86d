"""The journal record's JSON tree, built fast: the same tree as the checkpoint module's ``_encode``, byte for
byte once dumped, for the types a record holds (one per index call, so its encoding is per-call CPU).

``checkpoint._encode`` formats the location of every node it visits (for its error messages) and tests each
node against every type in turn; a record is ~100 nodes, mostly small arrays and ints, so that is most of
its cost. Here each node's exact type picks its encoding; any other type (a subclass, a numpy scalar, a
tensor) and any error go to ``checkpoint._encode`` itself, which then decides and words the error.
"""

from __future__ import annotations

from typing import Any, List

import numpy as np

from ..checkpoint import _ARRAY_KINDS, _MAX_DEPTH, _encode


def encode_tree(record: Any, arrays: List[np.ndarray]) -> Any:
    """``checkpoint._encode(record, "record", arrays)``: the JSON tree, ``record``'s arrays appended in order."""
    start = len(arrays)
    try:
        return _fast(record, arrays, 0)
    except TypeError:
        del arrays[start:]
        return _encode(record, "record", arrays)  # raises the checkpoint module's own error, or encodes


def _fast(node: Any, arrays: List[np.ndarray], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise TypeError("too deep")  # checkpoint._encode words it
    kind = type(node)
    if node is None or kind is bool or kind is str or kind is int or kind is float:
        return node
    if kind is np.ndarray:
        array = np.ascontiguousarray(node)
        if array.dtype.kind not in _ARRAY_KINDS:
            raise TypeError("not a numeric array")
        arrays.append(array)
        return {"ndarray": len(arrays) - 1}
    if kind is dict:
        out = {}
        for k, v in node.items():
            if type(k) is not str:
                raise TypeError("a key that is not a str")
            out[k] = _fast(v, arrays, depth + 1)
        return {"dict": out}
    if kind is list:
        return {"list": [_fast(v, arrays, depth + 1) for v in node]}
    if kind is tuple:
        return {"tuple": [_fast(v, arrays, depth + 1) for v in node]}
    return _encode(node, "record", arrays, depth)  # any other type: exactly as the checkpoint module does
