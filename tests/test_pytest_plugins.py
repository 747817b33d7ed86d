"""The suite's own pytest configuration under plugins users commonly have installed (issue 55).

pytest-asyncio (Miles needs it; it sits wherever asyncio code is tested) warns at configure time, and the suite's
strict warnings once turned that notice into an INTERNALERROR before any test ran. CI runs the whole suite with the
plugin installed (.ci/run) and without it (.ci/ci-bare.sh); this test says why a run breaks, in one place.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]


def test_the_suite_configures_and_runs_with_pytest_asyncio_loaded(tmp_path):
    if importlib.util.find_spec("pytest_asyncio") is None:
        pytest.skip("pytest-asyncio is not installed (pip install pytest-asyncio); CI's main stage has it")
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import asyncio\n\n\ndef test_an_awaitable_runs(pytestconfig):\n"
        "    assert pytestconfig.pluginmanager.hasplugin('asyncio')  # the plugin is really loaded\n"
        "    assert asyncio.run(asyncio.sleep(0, 7)) == 7\n"
    )
    # Our pyproject's [tool.pytest.ini_options] (strict config, warnings as errors), the plugin autoloaded through
    # its entry point as in a user's environment.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(_ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-q", str(probe)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout
