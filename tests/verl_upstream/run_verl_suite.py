"""Runs verl's own replay-buffer tests, unchanged, against pyfast_buffer's verl module (or verl's own).

    python tests/verl_upstream/run_verl_suite.py --verl-src /path/to/verl [--against ours|verl] [-- pytest args]

It builds a temporary directory holding a ``verl/trainer/ppo/v1/replay_buffer.py`` that re-exports
``pyfast_buffer.integrations.verl`` (``--against verl``: that loads verl's own file from the checkout,
with a no-op ``verl.utils.skip.SkipManager`` beside it), copies verl's test file there and runs pytest
on it with a local Ray (8 logical CPUs, as TransferQueue's placement groups need). Nothing of verl is
kept in this repository. Not collected by the project's pytest run (no ``test_`` prefix).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TEST_FILE = Path("tests/trainer/ppo/v1/test_replay_buffer_on_cpu.py")
MODULE = Path("verl/trainer/ppo/v1/replay_buffer.py")

OURS = '''"""Shim: verl's replay_buffer module path, served by pyfast_buffer."""
from pyfast_buffer.integrations.verl import (  # noqa: F401
    DAPO_FILTERED_REWARD_COUNTS_KEY,
    FastReplayBuffer,
    ReplayBuffer,
    ReplayBufferAsync,
    _accumulate_eviction_metrics,
)
'''

NO_OP_SKIP = '''"""Stand-in for verl.utils.skip: SkipManager.annotate_tq returns the function unchanged."""


class SkipManager:
    @staticmethod
    def annotate_tq(**_kwargs):
        return lambda fn: fn

    @staticmethod
    def set_step(_step):
        return None
'''

CONFTEST = """import ray
import pytest


def pytest_configure(config):
    if not ray.is_initialized():
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="ERROR")


def pytest_unconfigure(config):
    if ray.is_initialized():
        ray.shutdown()
"""

INI = "[pytest]\naddopts = -p no:cacheprovider\n"


def build(root: Path, verl_src: Path, against: str) -> Path:
    for package in ("verl", "verl/trainer", "verl/trainer/ppo", "verl/trainer/ppo/v1"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    if against == "ours":
        (root / MODULE).write_text(OURS)
    else:
        (root / "verl/utils/skip").mkdir(parents=True)
        (root / "verl/utils/__init__.py").write_text("")
        (root / "verl/utils/skip/__init__.py").write_text(NO_OP_SKIP)
        shutil.copyfile(verl_src / MODULE, root / MODULE)
    (root / "conftest.py").write_text(CONFTEST)
    (root / "pytest.ini").write_text(INI)
    test = root / TEST_FILE.name
    shutil.copyfile(verl_src / TEST_FILE, test)
    return test


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verl-src", required=True, type=Path, help="a checkout of github.com/verl-project/verl")
    parser.add_argument(
        "--against",
        choices=("ours", "verl"),
        default="ours",
        help="ours: pyfast_buffer's module (default); verl: verl's own, as a control",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    if not (args.verl_src / TEST_FILE).is_file():
        parser.error(f"--verl-src {args.verl_src}: no {TEST_FILE} there; pass the root of a verl checkout")
    with tempfile.TemporaryDirectory(prefix="verl-suite-") as tmp:
        root = Path(tmp)
        test = build(root, args.verl_src, args.against)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
        command = [
            sys.executable,
            "-m",
            "pytest",
            str(test),
            "--rootdir",
            str(root),
            "-c",
            str(root / "pytest.ini"),
            *args.pytest_args,
        ]
        return subprocess.call(command, cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main())
