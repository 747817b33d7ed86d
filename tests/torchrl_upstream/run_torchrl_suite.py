"""Runs TorchRL's own replay-buffer tests that apply to any sampler, unchanged, with our StalenessSampler.

    python tests/torchrl_upstream/run_torchrl_suite.py --torchrl-src /path/to/pytorch/rl [-- pytest args]

The interpreter needs pyfast_buffer and torchrl (``pip install "pyfast_buffer[torchrl]"``; the wheel ships no
tests, so they come from a checkout). It copies the checkout's ``test/rb/{_rb_common,conftest,test_composable,
test_samplers,test_ensemble}.py`` into a temporary directory beside ``in_torchrl_checks.py`` (which says what it
re-runs, how, and the two tests it leaves out) and runs pytest on the latter. Nothing of TorchRL is kept in this
repository. Not collected by the project's pytest run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("_rb_common.py", "conftest.py", "test_composable.py", "test_samplers.py", "test_ensemble.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torchrl-src", required=True, type=Path, help="a checkout of pytorch/rl")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args()
    rb_tests = args.torchrl_src.resolve() / "test" / "rb"
    missing = [f for f in FILES if not (rb_tests / f).exists()]
    if missing:
        print(f"{rb_tests} lacks {missing}: pass --torchrl-src a checkout of pytorch/rl", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pfb-torchrl-") as tmp:
        work = Path(tmp)
        for f in FILES:
            shutil.copy(rb_tests / f, work / f)
        shutil.copy(HERE / "in_torchrl_checks.py", work / "test_pyfast_in_torchrl.py")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")])}
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-q",
            "test_pyfast_in_torchrl.py",
            *args.pytest_args,
        ]
        print("running:", " ".join(command), f"(in {work})", flush=True)
        return subprocess.call(command, cwd=work, env=env)


if __name__ == "__main__":
    sys.exit(main())
