"""Runs slime's own plugin-contract tests pointed at our classes, and ours against slime's real classes.

    python tests/slime_upstream/run_slime_suite.py --slime-src /path/to/THUDM/slime [-- pytest args]

The interpreter needs pyfast_buffer and what slime's rollout modules import on a CPU machine; with the dev venv
(torch, ray, transformers, pytest) only ``pip install pillow`` was missing. sglang, which cannot install here, is
not imported on these paths (slime's contract tests stub ``sglang_router`` themselves). Nothing of slime is kept
in this repository and the checkout is not written to (pytest's cache is off). It runs, each in its own pytest:

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

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REPO = TESTS.parent
CONTRACTS = Path("tests/plugin_contracts")
OURS = {
    "SLIME_CONTRACT_DATA_SOURCE_PATH": "pyfast_buffer.integrations.slime.StalenessDataSource",
    "SLIME_CONTRACT_BUFFER_FILTER_PATH": "pyfast_buffer.integrations.slime.buffer_filter",
}


def run(name: str, target: Path, src: Path, env: dict, extra: list) -> int:
    path = os.pathsep.join([str(src), str(src / "tests"), str(TESTS), str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(HERE), "-c", os.devnull]
    print(f"== {name}", flush=True)
    return subprocess.call([*cmd, str(target), *extra], env={**env, "PYTHONPATH": path}, cwd=str(HERE))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
