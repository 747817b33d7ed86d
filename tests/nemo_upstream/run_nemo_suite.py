"""Runs NeMo RL's own sampler-contract tests, unchanged, and ours with NeMo's real classes, against our sampler.

    python tests/nemo_upstream/run_nemo_suite.py --nemo-src /path/to/NVIDIA-NeMo/RL [-- pytest args]

The interpreter running this needs pyfast_buffer and what NeMo's sampler modules import: ``pip install
torch==2.13.0 tensordict numpy ray pydantic transformers datasets pillow requests pytest`` (docs/nemo_rl.md).
It builds a temporary directory with

- ``nemo_import.py``, a pytest plugin that puts the checkout on ``sys.path`` and registers
  ``nemo_rl.algorithms.async_utils`` as a bare package (its path, without running its ``__init__``). That
  ``__init__`` imports NeMo's GRPO trajectory collector, which needs torchdata, vLLM-era dependencies and Python
  3.13; the sampler modules under it (``staleness_sampler``, ``replay_buffer``, ``interfaces``) import on 3.11
  without it. Nothing else of NeMo is skipped or replaced.
- NeMo's ``tests/unit/single_controller/test_sampler_interface.py``, copied unchanged: its 40 tests of the
  ``PromptGroupSampler`` protocol, ``create_sampler`` (a custom target included) and the built-in samplers.
- ``test_pyfast_in_nemo.py`` (``in_nemo_checks.py`` here) with our ``_nemo_fake.py`` beside it: our sampler built
  by NeMo's real ``create_sampler`` from NeMo's real ``CustomSamplerConfig``, checked against NeMo's real
  ``PromptGroupSampler`` protocol, and driven through NeMo's call order (the pumps of ``_nemo_fake.NemoLoop``)
  over NeMo's real ``TQReplayBuffer``, with an in-memory DataPlane client (NeMo's own tests use one the same way).

and runs pytest there. Nothing of NeMo is kept in this repository. Not collected by the project's pytest run.
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
NEMO_TEST = Path("tests/unit/single_controller/test_sampler_interface.py")
ASYNC_UTILS = Path("nemo_rl/algorithms/async_utils")

PLUGIN = '''"""Imports NeMo RL's sampler modules from {src} without nemo_rl.algorithms.async_utils.__init__ (the GRPO
collector it pulls in needs Python 3.13 and torchdata)."""
import sys
import types

sys.path.insert(0, {src!r})
import nemo_rl.algorithms  # noqa: E402  (nemo_rl/__init__ and the empty algorithms/__init__ run as usual)

_package = types.ModuleType("nemo_rl.algorithms.async_utils")
_package.__path__ = [{async_utils!r}]
sys.modules[_package.__name__] = _package
'''


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nemo-src", required=True, type=Path, help="a checkout of NVIDIA-NeMo/RL")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args()
    src = args.nemo_src.resolve()
    for needed in (NEMO_TEST, ASYNC_UTILS / "staleness_sampler.py", ASYNC_UTILS / "replay_buffer.py"):
        if not (src / needed).exists():
            print(f"{src} has no {needed}: pass --nemo-src a checkout of NVIDIA-NeMo/RL", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="pfb-nemo-") as tmp:
        work = Path(tmp)
        (work / "nemo_import.py").write_text(PLUGIN.format(src=str(src), async_utils=str(src / ASYNC_UTILS)))
        shutil.copy(src / NEMO_TEST, work / NEMO_TEST.name)
        shutil.copy(HERE / "in_nemo_checks.py", work / "test_pyfast_in_nemo.py")
        shutil.copy(HERE.parent / "_nemo_fake.py", work / "_nemo_fake.py")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")])}
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "nemo_import",
            "--noconftest",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-q",
            NEMO_TEST.name,
            "test_pyfast_in_nemo.py",
            *args.pytest_args,
        ]
        print("running:", " ".join(command), f"(in {work})", flush=True)
        return subprocess.call(command, cwd=work, env=env)


if __name__ == "__main__":
    sys.exit(main())
