"""Runs Miles's own fully-async rollout tests, unchanged, with our data buffer in place of Miles's default, and our
checks of the paced rollout function inside Miles's real rollout machinery.

    python tests/miles_upstream/run_miles_suite.py --miles-src /path/to/radixark/miles [-- pytest args]

It needs pyfast_buffer with its compiled core (a wheel: ``pip install dist/pyfast_buffer-*.whl``; in a checkout,
``pip install -e .``), pytest, pytest-asyncio (Miles's tests are ``async def``) and what Miles's rollout modules
import on these paths that installs on CPU::

    pip install pytest pytest-asyncio ray transformers huggingface_hub pydantic httpx aiohttp pybase64 pylatexenc

(torch and numpy come with pyfast_buffer; a CPU torch is enough.)
Before running anything the runner checks each of these modules and exits 6 naming every missing one with the one
``pip install`` line, or 7 when ``pyfast_buffer`` resolves to a tree with no compiled core (a source checkout
ahead of the installed package). The checkout itself is never put on ``sys.path`` (only Miles's checkout, this
folder and the temporary directory below), so the installed pyfast_buffer is the one tested, from the checkout or
from a copy of ``tests/``.

sglang cannot install here (it needs CUDA); it is the one package stood in for (``stubs.py``: a module whose every
attribute is a MagicMock, touched only by Miles's module-level imports on the paths these tests run).

It builds a temporary directory with

- ``miles_import.py``, a pytest plugin that puts Miles's checkout and this folder on ``sys.path``, stubs sglang,
  and makes our ``StalenessDataBuffer`` Miles's ``DefaultDataBuffer`` (in ``fully_async_data_buffer`` and where
  ``fully_async_rollout`` imported it), before any test module is imported;
- Miles's ``tests/fast/rollout/test_fully_async_rollout.py``, copied unchanged: every test of the rollout function
  and its data buffer (capacity, the staleness filter, the unused-group handler, aborted and dynamic-filter
  groups, metrics, a custom buffer path) now runs on ours, under ``drop``, Miles's only strategy;
- ``test_pyfast_in_miles.py`` (``in_miles_checks.py`` here): our contract copies (``tests/_miles_contract.py``)
  against Miles's real classes, and ``StalenessRolloutFn`` under pace, wait and drop driven by Miles's real
  scheduler and drain with a generate function of uneven latency, a save and a resume;

and runs pytest there. Nothing of Miles is kept in this repository. Not collected by the project's pytest run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/ only (never the checkout's root): the shared check below
from _upstream_env import ready  # noqa: E402

MILES_TEST = Path("tests/fast/rollout/test_fully_async_rollout.py")
NEEDED = (MILES_TEST, Path("miles/rollout/fully_async_data_buffer.py"), Path("miles/rollout/fully_async_rollout.py"))
# Each module this run imports (Miles's rollout code, its test and ours), and the pip package that provides it.
REQUIRES: Dict[str, str] = {
    "pytest": "pytest",
    "pytest_asyncio": "pytest-asyncio",
    "numpy": "numpy",
    "torch": "torch",
    "ray": "ray",
    "transformers": "transformers",
    "huggingface_hub": "huggingface_hub",
    "pydantic": "pydantic",
    "httpx": "httpx",
    "aiohttp": "aiohttp",
    "pybase64": "pybase64",
    "pylatexenc": "pylatexenc",
}


def search_path(src: Path) -> List[str]:
    """What the pytest run imports from ahead of site-packages, as ``miles_import.py`` puts it: Miles's checkout
    and this folder (never the checkout's root, whose source pyfast_buffer/ has no compiled core)."""
    return [str(src), str(HERE)]


PLUGIN = '''"""Imports Miles from {src}, sglang stood in for, with our data buffer as Miles's default."""
import sys

sys.path.insert(0, {src!r})
sys.path.insert(0, {here!r})
import stubs  # noqa: E402

stubs.install(["sglang"])

import miles.rollout.fully_async_data_buffer as data_buffer  # noqa: E402
import miles.rollout.fully_async_rollout as fully_async  # noqa: E402

from pyfast_buffer.integrations.miles import StalenessDataBuffer  # noqa: E402

data_buffer.DefaultDataBuffer = StalenessDataBuffer
fully_async.DefaultDataBuffer = StalenessDataBuffer
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--miles-src", required=True, type=Path, help="a checkout of radixark/miles")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args()
    src = args.miles_src.resolve()
    for needed in NEEDED:
        if not (src / needed).exists():
            print(f"{src} has no {needed}: pass --miles-src a checkout of radixark/miles", file=sys.stderr)
            return 2
    sys.path[:0] = search_path(src)  # as the pytest run will see them
    code = ready(REQUIRES, Path(__file__).name)
    if code:
        return code
    with tempfile.TemporaryDirectory(prefix="pfb-miles-") as tmp:
        work = Path(tmp)
        (work / "miles_import.py").write_text(PLUGIN.format(src=str(src), here=str(HERE)))
        shutil.copy(src / MILES_TEST, work / MILES_TEST.name)
        shutil.copy(HERE / "in_miles_checks.py", work / "test_pyfast_in_miles.py")
        shutil.copy(HERE.parent / "_miles_contract.py", work / "_miles_contract.py")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")])}
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "miles_import",
            "--noconftest",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-o",
            "asyncio_mode=auto",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
            "-q",
            "-rfE",
            MILES_TEST.name,
            "test_pyfast_in_miles.py",
            *args.pytest_args,
        ]
        return subprocess.run(command, cwd=work, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
