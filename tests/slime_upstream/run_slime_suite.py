"""Runs slime's own plugin-contract tests pointed at our classes, and ours against slime's real classes.

    python tests/slime_upstream/run_slime_suite.py --slime-src /path/to/THUDM/slime [-- pytest args]

It needs pyfast_buffer with its compiled core (a wheel: ``pip install dist/pyfast_buffer-*.whl``; in a checkout,
``pip install -e .``), pytest, and what slime's rollout modules import on these paths on a CPU machine::

    pip install pytest ray transformers tqdm httpx aiohttp pillow pylatexenc

(torch and numpy come with pyfast_buffer; a CPU torch is enough.) sglang, which needs CUDA, is not imported on
these paths (slime's contract tests stub ``sglang_router`` themselves). Before running anything the runner checks
each of these modules and exits 6 naming every missing one with the one ``pip install`` line, or 7 when
``pyfast_buffer`` resolves to a tree with no compiled core (a source checkout ahead of the installed package). The
checkout itself is never put on ``sys.path``: only slime's checkout, its ``tests/`` and this ``tests/`` folder (for
``_slime_contract.py``), so the installed pyfast_buffer is the one tested, from the checkout or from a copy of
``tests/``. Nothing of slime is kept in this repository and the checkout is not written to (pytest's cache and
conftest files are off). It runs, each in its own pytest:

- slime's ``tests/plugin_contracts/test_plugin_path_loading_contracts.py`` with ``--data-source-path`` and
  ``--buffer-filter-path`` set to ours, once per strategy its stub args can build (drop, wait: its ``make_args``
  has no ``rollout_batch_size``, which pace needs);
- slime's ``tests/plugin_contracts/test_plugin_rollout_contracts.py`` unchanged (its full check of a rollout path
  calls it with ``args=None`` and a data source of its own, which a fully-async rollout cannot serve: slime's own
  ``fully_async_rollout`` fails it the same way; ``in_slime_checks.py`` runs its signature check on ours);
- ``in_slime_checks.py``: our contract copies against slime's classes, slime's ``load_function`` on our paths,
  and our rollout function over slime's real data source for drop, wait and pace.

Not collected by the project's pytest run (no ``test_`` file here).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
sys.path.insert(0, str(TESTS))  # tests/ only (never the checkout's root): the shared check below
from _upstream_env import ready  # noqa: E402

CONTRACTS = Path("tests/plugin_contracts")
OURS = {
    "SLIME_CONTRACT_DATA_SOURCE_PATH": "pyfast_buffer.integrations.slime.StalenessDataSource",
    "SLIME_CONTRACT_BUFFER_FILTER_PATH": "pyfast_buffer.integrations.slime.buffer_filter",
}
# Each module these runs import (slime's rollout code and our tests), and the pip package that provides it.
REQUIRES: Dict[str, str] = {
    "pytest": "pytest",
    "numpy": "numpy",
    "torch": "torch",
    "ray": "ray",
    "transformers": "transformers",
    "tqdm": "tqdm",
    "httpx": "httpx",
    "aiohttp": "aiohttp",
    "PIL": "pillow",
    "pylatexenc": "pylatexenc",
}


def search_path(src: Path) -> List[str]:
    """What the pytest runs import from, ahead of site-packages: slime, its tests, and this tests/ (never the
    checkout's root, whose source pyfast_buffer/ has no compiled core and would shadow the installed one)."""
    return [str(src), str(src / "tests"), str(TESTS)]


def run(name: str, target: Path, src: Path, env: dict, extra: Sequence[str]) -> int:
    path = os.pathsep.join([*search_path(src), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", "--rootdir", str(HERE)]
    print(f"== {name}", flush=True)
    return subprocess.call([*cmd, "-c", os.devnull, str(target), *extra], env={**env, "PYTHONPATH": path}, cwd=HERE)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--slime-src", required=True, type=Path, help="a checkout of THUDM/slime")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to each pytest run")
    args = parser.parse_args()
    src = args.slime_src.resolve()
    needed = [src / "slime/rollout/data_source.py", src / CONTRACTS / "test_plugin_path_loading_contracts.py"]
    missing = [p for p in needed if not p.exists()]
    if missing:
        print(
            f"{src} has no {missing[0].relative_to(src)}: pass --slime-src a checkout of THUDM/slime", file=sys.stderr
        )
        return 2
    sys.path[:0] = search_path(src)  # as the pytest runs will see them
    code = ready(REQUIRES, Path(__file__).name)
    if code:
        return code
    base = {**os.environ, "PYFAST_BUFFER_MAX_AGE": "1"}
    results = {}
    for strategy in ("drop", "wait"):
        env = {**base, **OURS, "PYFAST_BUFFER_STRATEGY": strategy}
        target = src / CONTRACTS / "test_plugin_path_loading_contracts.py"
        results[f"path loading ({strategy})"] = run(
            f"slime path-loading contracts, ours, {strategy}", target, src, env, args.pytest_args
        )
    target = src / CONTRACTS / "test_plugin_rollout_contracts.py"
    results["rollout contracts"] = run("slime rollout contracts", target, src, base, args.pytest_args)
    results["in-slime checks"] = run("our checks in slime", HERE / "in_slime_checks.py", src, base, args.pytest_args)
    for name, rc in results.items():
        print(f"{name}: {'passed' if rc == 0 else f'FAILED (rc {rc})'}")
    return max(results.values())


if __name__ == "__main__":
    raise SystemExit(main())
