import pathlib
import sys

import pytest

import pyfast_buffer

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


def test_version_is_set_once_in_pyproject():
    pyproject = pathlib.Path(__file__).parents[1] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["version"]
    assert pyfast_buffer.__version__ == declared


def test_extension_is_the_compiled_core():
    from pyfast_buffer import _core

    assert pathlib.Path(_core.__file__).suffix in {".so", ".pyd"}
    assert len(pyfast_buffer.FIELDS) == _core.BATCH_COLUMNS
    assert _core.BYTES_PER_ENTRY <= 64


def test_cli_version_prints_the_package_version(capsys):
    from pyfast_buffer.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"pyfast-buffer {pyfast_buffer.__version__}"


def test_module_entry_point_prints_the_version(tmp_path):
    import subprocess

    # cwd outside the source tree: ``-m`` must find the installed package (CI tests the wheel).
    out = subprocess.run(
        [sys.executable, "-m", "pyfast_buffer", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=tmp_path,
    ).stdout
    assert out.strip() == f"pyfast-buffer {pyfast_buffer.__version__}"
