"""torch loads on the first call that makes or reads a tensor, never with ``import pyfast_buffer`` (issue 50).

Each check runs in a fresh interpreter: this pytest process imported torch long ago. A producer that puts ids,
steps and payload bytes from numpy or lists never loads torch; without torch installed (simulated by a
meta-path finder that refuses it) the first tensor raises the error ``import pyfast_buffer`` raised before.
"""

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest
from _torch_race import assert_race_survived, race_first_torch_import

# Refuses torch as an interpreter without it does: ModuleNotFoundError("No module named 'torch'", name='torch').
_NO_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def _run(code, tmp_path, without_torch=False, args=()):
    """Runs ``code`` in a fresh interpreter (outside the checkout) and returns the JSON its last line prints."""
    source = (_NO_TORCH if without_torch else "") + textwrap.dedent(code)
    done = subprocess.run(
        [sys.executable, "-c", source, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_pyfast_buffer_loads_no_torch(tmp_path):
    out = _run(
        """
        import json, sys
        import pyfast_buffer
        from pyfast_buffer import *  # noqa: F403
        print(json.dumps({"torch": "torch" in sys.modules, "version": pyfast_buffer.__version__}))
        """,
        tmp_path,
    )
    assert out["torch"] is False
    assert out["version"]  # __version__ is computed on first access, and the star import reads it


def test_import_pyfast_buffer_ray_loads_no_torch(tmp_path):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'pyfast_buffer[ray]')")
    out = _run(
        """
        import json, sys
        import pyfast_buffer.ray
        from pyfast_buffer.ray import *  # noqa: F403
        print(json.dumps({"torch": "torch" in sys.modules}))
        """,
        tmp_path,
    )
    assert out["torch"] is False


_ROUND_TRIP = """
import json, sys
import numpy as np
import pyfast_buffer
seen = {}
for cls in (getattr(pyfast_buffer, sys.argv[1]),):  # one class a process: the first tensor loads torch for good
    buf = cls(capacity=64, max_age=4, max_uses=1)  # pin_memory=None: decided without importing a CPU torch
    buf.put(np.arange(8, dtype=np.int64), 0, group_ids=np.arange(8, dtype=np.int64) // 2)
    buf.put([100, 101], [1, 1])
    batch = buf.take(6, current_step=2)
    led = buf.ledger()
    seen[cls.__name__] = {
        "taken": len(batch),
        "dropped": batch.metrics["buffer/dropped_stale"],
        "left": led["buffer_left"],
        "pinned": buf.pin_memory,
        "torch_before_rows": "torch" in sys.modules,
    }
    try:
        seen[cls.__name__]["ids"] = batch.traj_ids.tolist()  # the first tensor: torch loads (or is missing) here
    except ModuleNotFoundError as exc:
        seen[cls.__name__]["error"] = [type(exc).__name__, str(exc), exc.name]
    seen[cls.__name__]["torch_after_rows"] = "torch" in sys.modules
print(json.dumps(seen))
"""


@pytest.mark.parametrize("impl", ["StalenessBuffer", "ReferenceBuffer"])
def test_a_numpy_round_trip_loads_torch_only_at_the_first_tensor(tmp_path, impl):
    import torch

    if torch.version.cuda is not None or torch.version.hip is not None:
        pytest.skip("a GPU build of torch: pin_memory=None asks torch whether CUDA is available")
    out = _run(_ROUND_TRIP, tmp_path, args=(impl,))
    for name, seen in out.items():
        assert seen["torch_before_rows"] is False, name
        assert (seen["taken"], seen["dropped"], seen["left"], seen["pinned"]) == (6, 0, 4, False), (name, seen)
        assert seen["ids"] == [0, 1, 2, 3, 4, 5], (name, seen)
        assert seen["torch_after_rows"] is True, name


@pytest.mark.parametrize("impl", ["StalenessBuffer", "ReferenceBuffer"])
def test_without_torch_puts_and_takes_work_and_the_first_tensor_says_what_is_missing(tmp_path, impl):
    out = _run(_ROUND_TRIP, tmp_path, without_torch=True, args=(impl,))
    for name, seen in out.items():
        assert (seen["taken"], seen["left"], seen["pinned"]) == (6, 4, False), (name, seen)
        # The error `import pyfast_buffer` raised before torch became lazy, now raised by the first tensor.
        assert seen["error"] == ["ModuleNotFoundError", "No module named 'torch'", "torch"], (name, seen)
        assert seen["torch_after_rows"] is False, name


def test_without_torch_pin_memory_true_is_refused_with_the_fix(tmp_path):
    out = _run(
        """
        import json
        from pyfast_buffer import StalenessBuffer
        try:
            StalenessBuffer(capacity=8, max_age=2, pin_memory=True)
        except ValueError as exc:
            print(json.dumps({"error": str(exc)}))
        """,
        tmp_path,
        without_torch=True,
    )
    assert "pin_memory=True needs CUDA" in out["error"]


@pytest.mark.parametrize(("how", "seed"), [("batch", 0), ("thread", 1)])
@pytest.mark.parametrize("impl", ["StalenessBuffer", "ReferenceBuffer"])
def test_producers_survive_the_first_torch_import_in_another_thread(tmp_path, impl, how, seed):
    assert_race_survived(race_first_torch_import(tmp_path, impl, how, seed))
