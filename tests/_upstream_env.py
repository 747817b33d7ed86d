"""What both upstream runners (``slime_upstream/run_slime_suite.py``, ``miles_upstream/run_miles_suite.py``) check
before running anything: every module their runs import, named in one message with one ``pip install`` line, and a
pyfast_buffer with its compiled core (not a source tree shadowing the installed wheel). No test here (no ``test_``
name); the runners put this folder on ``sys.path`` to import it, and ``tests/test_upstream_runners.py`` tests it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import List, Mapping, Tuple

MISSING_MODULES = 6  # exit code: modules missing (all named, with the pip line)
NO_CORE = 7  # exit code: pyfast_buffer missing, or a tree without its compiled core


def missing_modules(requires: Mapping[str, str]) -> List[Tuple[str, str]]:
    """(module, pip package) for each module in ``requires`` this interpreter cannot find; nothing is imported."""
    missing = []
    for module, package in requires.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append((module, package))
    return missing


def core_problem() -> str:
    """'' when pyfast_buffer imports with its compiled core, else what is wrong and how to fix it."""
    try:
        spec = importlib.util.find_spec("pyfast_buffer")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return (
            "pyfast_buffer is not installed in this interpreter: install its wheel "
            "(pip install dist/pyfast_buffer-*.whl) or, in a checkout, pip install -e ."
        )
    where = next(iter(spec.submodule_search_locations or [spec.origin]))
    try:
        importlib.import_module("pyfast_buffer._core")
    except ImportError as exc:
        return (
            f"pyfast_buffer resolves to {where}, which has no working compiled core (a source tree?): install the "
            f"wheel (pip install dist/pyfast_buffer-*.whl) or build the checkout (pip install -e .), and run from "
            f"outside a source tree. The import said: {exc}"
        )
    return ""


def check_environment(requires: Mapping[str, str], runner: str) -> Tuple[int, str]:
    """(0, '') when everything the runs import is here; else (exit code, one message naming all that is not)."""
    problems = []
    missing = missing_modules(requires)
    if missing:
        names = ", ".join(module if module == package else f"{module} (pip: {package})" for module, package in missing)
        packages = " ".join(dict.fromkeys(package for _, package in missing))
        problems.append(
            f"this interpreter ({sys.executable}) lacks {len(missing)} module(s) these tests import: {names}. "
            f"Install them all with:\n\n    {sys.executable} -m pip install {packages}\n"
        )
    core = core_problem()
    if core:
        problems.append(core)
    if not problems:
        return 0, ""
    return (NO_CORE if core else MISSING_MODULES), f"{runner} cannot run: " + "\n\n".join(problems)


def ready(requires: Mapping[str, str], runner: str) -> int:
    """Checks the environment once for a runner: prints the one message and returns its exit code, or prints which
    pyfast_buffer is tested (version and folder) and returns 0."""
    code, message = check_environment(requires, runner)
    if code:
        print(message, file=sys.stderr)
        return code
    import pyfast_buffer

    where = Path(pyfast_buffer.__file__).parent
    print(f"pyfast_buffer {pyfast_buffer.__version__} from {where}", flush=True)
    return 0
