"""The upstream runners' up-front checks (``tests/slime_upstream/run_slime_suite.py``,
``tests/miles_upstream/run_miles_suite.py``), without slime or Miles: every missing module is named in one message
with one ``pip install`` line, a pyfast_buffer without its compiled core is refused, and the checkout's root (whose
source ``pyfast_buffer/`` has no compiled core) is never put ahead of the installed package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import _upstream_env
import pytest

TESTS = Path(__file__).resolve().parent
RUNNERS = {
    "slime": TESTS / "slime_upstream" / "run_slime_suite.py",
    "miles": TESTS / "miles_upstream" / "run_miles_suite.py",
}


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_pfb_runner_{name}", RUNNERS[name])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=sorted(RUNNERS))
def runner(request) -> ModuleType:
    return load(request.param)


def test_every_missing_module_is_named_in_one_message_with_one_pip_line(runner):
    requires = {"json": "json", "pfb_absent_one": "pfb-absent-one", "pfb_absent_two": "pfb-absent-two"}
    code, message = _upstream_env.check_environment(requires, "runner.py")
    assert code == _upstream_env.MISSING_MODULES != 0
    assert "pfb_absent_one (pip: pfb-absent-one)" in message and "pfb_absent_two (pip: pfb-absent-two)" in message
    assert "json" not in message
    pip_lines = [line for line in message.splitlines() if "pip install" in line]
    assert len(pip_lines) == 1 and pip_lines[0].endswith("pip install pfb-absent-one pfb-absent-two")


def test_nothing_missing_passes(runner):
    assert _upstream_env.check_environment({"json": "json"}, "runner.py") == (0, "")


def test_the_listed_requirements_are_checked_by_the_module_name(runner):
    assert runner.REQUIRES["pytest"] == "pytest"
    assert all(module.isidentifier() for module in runner.REQUIRES)
    assert _upstream_env.MISSING_MODULES != _upstream_env.NO_CORE and {
        _upstream_env.MISSING_MODULES,
        _upstream_env.NO_CORE,
    }.isdisjoint({0, 1, 2, 3, 4, 5})


def test_a_pyfast_buffer_without_its_core_is_refused(runner, monkeypatch):
    real = importlib.import_module

    def no_core(name: str, *args):
        if name == "pyfast_buffer._core":
            raise ModuleNotFoundError("pyfast_buffer's native core is not built", name=name)
        return real(name, *args)

    monkeypatch.setattr(_upstream_env.importlib, "import_module", no_core)
    code, message = _upstream_env.check_environment({"json": "json", "pfb_absent_one": "pfb-absent-one"}, "runner.py")
    assert code == _upstream_env.NO_CORE
    assert "install the wheel" in message and "pip install -e ." in message
    assert "pfb_absent_one" in message  # still one message naming everything


def test_the_checkout_root_is_not_put_ahead_of_the_installed_package(runner, tmp_path):
    paths = [Path(entry) for entry in runner.search_path(tmp_path)]
    assert TESTS.parent not in paths
    assert not any((entry / "pyfast_buffer").is_dir() for entry in paths)


def test_ready_prints_the_one_message_and_returns_its_code(capsys):
    assert _upstream_env.ready({"pfb_absent_one": "pfb-absent-one"}, "runner.py") == _upstream_env.MISSING_MODULES
    err = capsys.readouterr().err
    assert err.startswith("runner.py cannot run") and err.count("pip install") == 1
    assert _upstream_env.ready({"json": "json"}, "runner.py") == 0
    assert capsys.readouterr().out.startswith("pyfast_buffer ")  # which one is tested
