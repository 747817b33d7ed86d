"""docs/ray.md's runnable example is examples/ray_rollouts.py, word for word, and it keeps what it says on the
session's two-node cluster: pace trains every trajectory and none older than max_age (issue 57: the example once
ran ``wait`` and trained data 17 steps old while its docstring said "fresh")."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from pyfast_buffer.ray import RemoteBuffer  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_namespace", "buffers_ended")

NAMESPACE = "pyfast_buffer_example_tests"
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ray_rollouts.py"


def test_the_docs_example_is_the_script():
    section = (ROOT / "docs" / "ray.md").read_text().split("## A runnable example", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block and block.group(1) == EXAMPLE.read_text()


def test_the_example_trains_everything_within_its_bound():
    spec = importlib.util.spec_from_file_location("ray_rollouts", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules["ray_rollouts"] = example
    spec.loader.exec_module(example)
    ray.cloudpickle.register_pickle_by_value(example)  # the workers cannot import the examples folder
    buf = RemoteBuffer.create(
        capacity=65_536, max_age=example.MAX_AGE, strategy="pace", prompts_per_step=example.PROMPTS_PER_STEP
    )
    ledger = example.train(buf)  # asserts the bound and the identity itself
    total = example.WORKERS * example.CALLS_PER_WORKER * example.PROMPTS_PER_STEP * example.GROUP
    assert (ledger["put_total"], ledger["retired"], ledger["dropped_stale"]) == (total, total, 0), ledger
    metrics = buf.data_metrics()
    assert metrics.get("trained_over_age", 0) == 0, metrics
