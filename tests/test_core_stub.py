"""_core.pyi against the compiled binding: parameter names, and positional-only where the binding has no names.

mypy's stubtest (run by .ci/lint.sh) checks names and kinds of module members, but pybind11 methods carry no
inspectable signature, so stubtest cannot see their parameters. pybind11 writes the signature as the first line
of each docstring, with ``argN`` for a parameter bound without ``py::arg``: such a parameter is positional-only,
and the stub must say so, or ``ring.dispatch(prompt_ids=...)`` type-checks and fails at run time.
"""

import ast
import pathlib
import re
from typing import Dict, List, Tuple

import pytest

from pyfast_buffer import _core

STUB = pathlib.Path(__file__).parents[1] / "pyfast_buffer" / "_core.pyi"


def _split_top_level(params: str) -> List[str]:
    """Splits ``a: X[b, c], d: int`` at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(params):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(params[start:i].strip())
            start = i + 1
    if params[start:].strip():
        parts.append(params[start:].strip())
    return parts


def _runtime_params(method: str) -> List[str]:
    first = (getattr(_core.Ring, method).__doc__ or "").splitlines()[0]
    m = re.match(rf"{re.escape(method)}\((.*)\) -> ", first)
    assert m, f"pybind11 docstring of Ring.{method} has no signature line: {first!r}"
    names = [p.split(":")[0].split("=")[0].strip() for p in _split_top_level(m.group(1))]
    assert names[0] == "self"
    return names[1:]


def _is_property(decorator: ast.expr) -> bool:
    """``@property`` or ``@name.setter`` / ``@name.getter`` / ``@name.deleter``: not a method call."""
    if isinstance(decorator, ast.Name):
        return decorator.id == "property"
    return isinstance(decorator, ast.Attribute) and decorator.attr in ("setter", "getter", "deleter")


def _stub_methods() -> Dict[str, Tuple[List[str], List[str]]]:
    """Ring's stub methods: name -> (positional-only parameters, other parameters), self excluded."""
    tree = ast.parse(STUB.read_text())
    ring = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Ring")
    out = {}
    for node in ring.body:
        if isinstance(node, ast.FunctionDef) and not any(_is_property(d) for d in node.decorator_list):
            posonly = [a.arg for a in node.args.posonlyargs]
            named = [a.arg for a in node.args.args]
            if posonly:
                posonly = posonly[1:]
            else:
                named = named[1:]
            out[node.name] = (posonly, named + [a.arg for a in node.args.kwonlyargs])
    return out


@pytest.mark.parametrize("method", sorted(_stub_methods()))
def test_stub_parameters_match_the_binding(method):
    posonly, named = _stub_methods()[method]
    runtime = _runtime_params(method)
    if "/" in runtime:  # named with py::arg and marked py::pos_only(): the names before '/' are positional-only
        cut = runtime.index("/")
        assert posonly == runtime[:cut], f"Ring.{method}: stub positional-only {posonly} vs binding {runtime}"
        assert named == runtime[cut + 1 :], f"Ring.{method}: stub {named} vs binding {runtime}"
        return
    unnamed = [p for p in runtime if re.fullmatch(r"arg\d+", p)]
    assert len(posonly) == len(unnamed), (
        f"Ring.{method}: the binding takes {len(unnamed)} positional-only parameters ({runtime}); the stub marks "
        f"{posonly} positional-only: put '/' after them in _core.pyi (or name them with py::arg in bindings.cpp)"
    )
    assert named == [p for p in runtime if p not in unnamed], f"Ring.{method}: stub {named} vs binding {runtime}"


def test_every_public_method_of_the_binding_is_in_the_stub():
    runtime = {n for n in dir(_core.Ring) if not n.startswith("_") and callable(getattr(_core.Ring, n))}
    assert runtime <= set(_stub_methods()), f"missing from _core.pyi: {sorted(runtime - set(_stub_methods()))}"
