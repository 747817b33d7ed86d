"""The messages a new user meets first: each names what went wrong and what to do instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

import pyfast_buffer as pfb


def _one_batch(impl):
    buf = impl(capacity=8, max_age=3)
    buf.put([1, 2], 0)
    return buf.take(2, current_step=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch can use CUDA: nothing to refuse")
def test_batch_to_a_device_torch_cannot_use_says_so_and_what_to_pass(impl):
    batch = _one_batch(impl)
    for call in (lambda: batch.to("cuda", non_blocking=True), lambda: batch.to(device=torch.device("cuda:0"))):
        with pytest.raises(RuntimeError, match=r"cannot use cuda.*is_available\(\) else 'cpu'") as caught:
            call()
        assert not isinstance(caught.value, AssertionError)  # not torch's bare "not compiled with CUDA"
    assert batch.columns.device.type == "cpu"  # nothing moved


def test_batch_to_a_string_that_is_no_device_is_a_value_error_naming_it(impl):
    batch = _one_batch(impl)
    with pytest.raises(ValueError, match=r"device='gpu0'.*not a torch device.*'cpu', 'cuda'"):
        batch.to("gpu0")


def test_batch_to_cpu_and_to_a_dtype_still_work(impl):
    batch = _one_batch(impl)
    assert batch.to("cpu").traj_ids.tolist() == batch.traj_ids.tolist()
    assert batch.to(torch.int32).columns.dtype == torch.int32


def test_importing_a_source_tree_without_the_core_says_how_to_build_it(tmp_path):
    installed = os.path.dirname(pfb.__file__)
    tree = tmp_path / "pyfast_buffer"
    shutil.copytree(installed, tree, ignore=shutil.ignore_patterns("_core*.so", "__pycache__"))
    run = subprocess.run(
        [sys.executable, "-c", "import pyfast_buffer"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: ")  # an ImportError that importorskip treats as "absent"
    assert "native core" in last and "not built" in last and "pip install -e ." in last
    assert "circular import" not in run.stderr


def test_a_stamp_ahead_of_the_trainer_is_named_as_the_cause(impl):
    for stamp in (lambda b: b.dispatch([1], 20), lambda b: b.put([7], 20)):
        buf = impl(capacity=8, max_age=3)
        stamp(buf)
        with pytest.raises(ValueError) as caught:
            buf.take(8, current_step=0)
        message = str(caught.value)
        assert "current_step=0 is lower than step 20" in message
        assert "dispatch or put stamped" in message and "ahead of the trainer" in message
        assert "never goes back" not in message  # the trainer did not go back


def test_a_trainer_step_going_back_is_named_as_the_cause(impl):
    buf = impl(capacity=8, max_age=3)
    buf.dispatch([1], 20)
    buf.take(8, current_step=20)  # the trainer reached the stamp: from now on the clock is the trainer's
    for call in (lambda: buf.take(8, current_step=19), lambda: buf.evict_stale(19)):
        with pytest.raises(ValueError, match=r"current_step=19 is lower than step 20 of an earlier take.*never goes"):
            call()
