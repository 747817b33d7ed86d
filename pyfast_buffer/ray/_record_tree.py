"""The journal record's JSON head, written fast: byte for byte what ``json.dumps`` gives for the checkpoint
module's tree (``checkpoint._encode``) and its array specs, for the types a record holds (one record per index
call, so its encoding is per-call CPU).

``checkpoint._encode`` formats the location of every node it visits (for its error messages) and tests each
node against every type in turn, then ``json`` walks the tree it built a second time; a record is ~100 nodes,
mostly small arrays and ints, so those walks are most of its cost. Here one walk writes the JSON text itself,
each node's exact type picking its text, and an array's spec is written once per (dtype, shape) seen. Any
other type (a subclass, a numpy scalar, a tensor) and any error go to ``checkpoint._encode`` itself, which
then decides and words the error.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii as _quoted
from typing import Any, Dict, List, Tuple

import numpy as np

from ..checkpoint import _ARRAY_KINDS, _MAX_DEPTH, _encode

#: ``json.dumps(..., separators=(",", ":"))``, made once (a fresh tree has no cycles to check for).
_JSON = json.JSONEncoder(separators=(",", ":"), check_circular=False)
#: The JSON of an array's spec by (dtype, shape): a record's arrays take a few shapes, over and over.
_SPECS: Dict[Tuple[np.dtype, Tuple[int, ...]], str] = {}
_SPECS_KEPT = 4096  # a bound on the cache (shapes vary with call sizes): past it, specs are written afresh


def record_head(record: Any, arrays: List[np.ndarray]) -> str:
    """``json.dumps({"tree": checkpoint._encode(record), "arrays": specs})`` with ``record``'s arrays appended to
    ``arrays`` in order (C-contiguous), where a spec is ``{"dtype": a.dtype.str, "shape": list(a.shape)}``."""
    start = len(arrays)
    out = ['{"tree":']
    try:
        _text(record, out, arrays, 0)
    except TypeError:
        del arrays[start:]
        tree = _encode(record, "record", arrays)  # raises the checkpoint module's own error, or encodes
        out = ['{"tree":', _JSON.encode(tree)]
    out.append(',"arrays":[')
    for i in range(start, len(arrays)):
        array = arrays[i]
        if not array.flags.c_contiguous:
            array = arrays[i] = np.ascontiguousarray(array)
        key = (array.dtype, array.shape)
        spec = _SPECS.get(key)
        if spec is None:
            spec = _JSON.encode({"dtype": array.dtype.str, "shape": list(array.shape)})
            if len(_SPECS) < _SPECS_KEPT:
                _SPECS[key] = spec
        out.append(spec if i == start else "," + spec)
    out.append("]}")
    return "".join(out)


def _text(node: Any, out: List[str], arrays: List[np.ndarray], depth: int) -> None:
    """Appends ``node``'s tree as JSON text to ``out``; TypeError for anything left to ``checkpoint._encode``."""
    kind = type(node)
    if kind is str:
        out.append(_quoted(node))
    elif kind is int:
        out.append(int.__repr__(node))
    elif kind is np.ndarray:
        if node.dtype.kind not in _ARRAY_KINDS or not node.ndim:
            raise TypeError("not a numeric array, or 0-d (which the checkpoint module stores as 1-d)")
        out.append(f'{{"ndarray":{len(arrays)}}}')
        arrays.append(node)
    elif kind is dict:
        if not node:
            out.append('{"dict":{}}')
            return
        if depth >= _MAX_DEPTH:
            raise TypeError("too deep")  # its items would be deeper than the checkpoint format allows
        sep = '{"dict":{'
        for key, value in node.items():
            if type(key) is not str:
                raise TypeError("a key that is not a str")
            out.append(sep + _quoted(key) + ":")
            _text(value, out, arrays, depth + 1)
            sep = ","
        out.append("}}")
    elif kind is list or kind is tuple:
        tag = '{"list":[' if kind is list else '{"tuple":['
        if not node:
            out.append(tag + "]}")
            return
        if depth >= _MAX_DEPTH:
            raise TypeError("too deep")
        for i, value in enumerate(node):
            out.append(tag if i == 0 else ",")
            _text(value, out, arrays, depth + 1)
        out.append("]}")
    elif node is None:
        out.append("null")
    elif kind is bool:
        out.append("true" if node else "false")
    elif kind is float:
        out.append(_JSON.encode(node))  # json's own spelling, NaN and the infinities included (floats are rare)
    else:
        raise TypeError("a type left to checkpoint._encode")
