"""Every script in examples/ runs, and the README's minimal loop is examples/minimal_loop.py's, word for word."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_readme_minimal_loop_is_the_example():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A minimal training loop", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "README's minimal loop has no python block"
    example = (EXAMPLES / "minimal_loop.py").read_text()
    loop = re.search(r"# --- README: the minimal loop\n(.*?)    # --- README: end", example, re.S)
    assert loop, "examples/minimal_loop.py lost its README markers"
    imports = "import torch\nfrom pyfast_buffer import StalenessBuffer\n\n"
    assert block.group(1) == imports + textwrap.dedent(loop.group(1))
    assert 'device = "cuda" if torch.cuda.is_available() else "cpu"' in block.group(1)


def test_minimal_loop_runs_on_this_machine(tmp_path):
    run = _run("minimal_loop.py", "--steps", "12", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert re.search(r"12 trainer steps on (cpu|cuda): 6144 trajectories trained on", run.stdout), run.stdout


@pytest.mark.parametrize("strategy", ["drop", "wait", "pace"])
def test_training_with_producers_logs_to_a_file_recycles_rows_and_audits(tmp_path, strategy):
    log = tmp_path / "train.log"
    run = _run("train_with_producers.py", "--strategy", strategy, "--steps", "15", "--log", str(log), cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 15 and all(" pyfast_buffer dropped_stale=" in line for line in lines)
    assert "verdict: balanced in every segment (exit 0)" in run.stdout
    recycled = int(re.search(r"(\d+) payload rows recycled through released\(\)", run.stdout).group(1))
    assert recycled >= 15 * 64  # every taken row came back (and every dropped one)


def _slot_pool():
    spec = importlib.util.spec_from_file_location("slot_pool_example", EXAMPLES / "slot_pool.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_slot_pool_gives_back_trajectory_rows_exactly_once_and_never_prompt_ids(impl):
    pool = _slot_pool().SlotPool(8)
    buf = impl(capacity=4, max_age=1, track_released=True)
    first = pool.acquire(4, timeout=1.0)
    buf.dispatch([100], 0)
    buf.complete(first, [100] * 4)
    reserved = pool.acquire(4, timeout=1.0)
    buf.dispatch([101], 0)
    buf.fail([101])  # reported as a prompt id, not a row
    pool.give_back(reserved)  # the failed prompt's rows, given back by its producer
    second = pool.acquire(2, timeout=1.0)
    buf.put(second, 0)  # the ring is full: evicts the oldest group, the first four rows
    assert pool.free() == 2
    assert pool.recycle(buf.released()) == 4 and pool.free() == 6  # the evicted rows, not prompt 101
    taken = buf.take(2, current_step=1)
    assert sorted(taken.traj_ids.tolist()) == sorted(second)
    assert pool.recycle(buf.released()) == 2 and pool.free() == 8  # retired by the take
    assert pool.recycle(buf.released()) == 0  # reported once only
    with pytest.raises(TimeoutError, match="no 9 free payload rows"):
        pool.acquire(9, timeout=0.01)


def test_the_examples_readme_names_every_example_and_every_strategy():
    """examples/README.md is where a newcomer looks first: every script in the folder has its row, and no line
    says a strategy the examples use is missing (it once said pace was 'not here yet', issue 55)."""
    readme = (EXAMPLES / "README.md").read_text()
    for script in sorted(p.name for p in EXAMPLES.glob("*.py")):
        assert f"`{script}`" in readme, f"examples/README.md has no row for {script}"
    assert "not here yet" not in readme
    for strategy in ("drop", "wait", "pace"):
        assert f"--strategy {strategy}" in readme or f"`{strategy}`" in readme, strategy


def test_the_integrations_package_docstring_names_every_integration():
    import pyfast_buffer.integrations as integrations

    doc = integrations.__doc__ or ""
    for sub in sorted(p.name for p in (ROOT / "pyfast_buffer" / "integrations").iterdir() if p.is_dir()):
        if sub.startswith("_"):
            continue
        assert f"``integrations.{sub}``" in doc, f"pyfast_buffer/integrations/__init__.py does not name {sub}"
        assert hasattr(integrations, f"_has_{sub}"), f"no availability flag for {sub}"
