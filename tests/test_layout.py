"""The package's layout rules, read from its source with ``ast``: no import circle, the library apart from
the wings, files of one screenful of jobs.

Every ``import`` and ``from ... import`` counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``), relative ones resolved against the importing module; ``from pkg import name`` is an
arrow to ``pkg.name`` when that is a module, else to ``pkg`` itself. Strings handed to importlib (how
``cli.py`` registers the commands) are not imports.

The library is the root modules (``buffer``, ``reference``, ``config``, ...) with ``ray/`` and
``integrations/``; the wings are ``workflow/``, ``experiment/`` and ``bench/``, with the entry points
``cli`` and ``__main__``, which dispatch to all three wings. The wings may import the library; the
library imports no wing, and no framework integration (``integrations/<framework>/``), which import only the
library and their shared ``integrations/_common``.
"""

import ast
import os
from typing import Dict, List, Optional, Set

import pytest

import pyfast_buffer

PACKAGE = "pyfast_buffer"
ROOT = os.path.dirname(os.path.abspath(pyfast_buffer.__file__))
WINGS = ("workflow", "experiment", "bench")
ENTRY_POINTS = ("cli", "__main__")
#: Longest module, in lines; the pure-Python twin may pass it because its sections mirror the core's files.
MAX_LINES = 600
LONG_ALLOWED = {f"{PACKAGE}.reference"}


def _modules() -> Dict[str, str]:
    """Returns {dotted module name: file path} of every .py file of the installed package."""
    found = {}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            parts = [PACKAGE, *os.path.relpath(os.path.join(folder, name), ROOT)[:-3].split(os.sep)]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = os.path.join(folder, name)
    return found


MODULES = _modules()
#: Compiled modules (the core): imported by the Python ones, importing none of them.
EXTENSIONS = {f"{PACKAGE}._core"}


def _is_package(module: str) -> bool:
    return MODULES[module].endswith("__init__.py")


def _imports(module: str) -> Set[str]:
    """Returns the package's modules that ``module`` imports anywhere in its source."""
    with open(MODULES[module], encoding="utf-8") as f:
        tree = ast.parse(f.read(), MODULES[module])
    here = module if _is_package(module) else module.rpartition(".")[0]
    targets: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in MODULES or sub in EXTENSIONS else base)
    return {t for t in targets if (t in MODULES or t in EXTENSIONS) and t != module}


GRAPH = {module: _imports(module) for module in MODULES}
GRAPH.update({extension: set() for extension in EXTENSIONS})


def _wing(module: str) -> Optional[str]:
    """Returns the wing (or entry point) ``module`` belongs to, or None for a library module."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in WINGS + ENTRY_POINTS:
        return parts[1]
    return None


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Returns one cycle (a list of modules, first repeated last) for every strongly connected component
    with more than one module, found with Tarjan's algorithm."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(sorted(c), graph) for c in components]


def _cycle_in(component: List[str], graph: Dict[str, Set[str]]) -> List[str]:
    """Returns a path from the component's first module back to itself, staying inside the component."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way round
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & members):
                if succ == start:
                    return [*paths[node], start]
                if succ not in paths:
                    paths[succ] = [*paths[node], succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")  # a component always has one


def test_the_walk_sees_the_package():
    # The walker finds relative, absolute and function-level imports (a broken walker passes everything).
    assert f"{PACKAGE}._buffer_base" in GRAPH[f"{PACKAGE}.reference"]  # from ._buffer_base import
    assert PACKAGE in GRAPH[f"{PACKAGE}.cli"]  # `from . import __version__`, inside a function
    assert f"{PACKAGE}.workflow.output" in GRAPH[f"{PACKAGE}.workflow.audit"]  # from .output import
    assert f"{PACKAGE}.integrations.verl._options" in GRAPH[f"{PACKAGE}.integrations.verl._sampler"]  # absolute
    assert f"{PACKAGE}.verl_mapping" in GRAPH[f"{PACKAGE}.config"]
    assert {f"{PACKAGE}.buffer", f"{PACKAGE}.reference"} <= GRAPH[f"{PACKAGE}.bench.peers"]
    assert _wing(f"{PACKAGE}.workflow.rhythm") == "workflow" and _wing(f"{PACKAGE}.ray.client") is None


def test_the_cycle_finder_names_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]


def test_no_import_circle():
    cycles = _cycles(GRAPH)
    assert not cycles, "import circles in pyfast_buffer/: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_library_imports_no_wing():
    arrows = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _wing(module) is None
        for target in targets
        if _wing(target) is not None
    )
    assert not arrows, "library modules importing the workflow/experiment/bench wings: " + "; ".join(arrows)


def _integration(module: str) -> Optional[str]:
    """Returns the framework subpackage of ``integrations/`` that ``module`` belongs to, or None."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "integrations" and not parts[2].startswith("_"):
        return parts[2]
    return None


def test_the_library_imports_no_integration_and_no_integration_another():
    # An integration imports its framework; the library (and the shared integrations._common) must import none,
    # so that `import pyfast_buffer` never pulls a framework in, and one framework's adapter never another's.
    arrows = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _wing(module) is None
        for target in targets
        if _integration(target) is not None and _integration(target) != _integration(module)
    )
    assert not arrows, "library modules importing a framework integration: " + "; ".join(arrows)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_short(module):
    with open(MODULES[module], encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    if module in LONG_ALLOWED:
        return
    assert lines <= MAX_LINES, f"{MODULES[module]} has {lines} lines (> {MAX_LINES}): split it by job"
