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
    assert _core.BATCH_COLUMNS == len(pyfast_buffer.FIELDS)
    assert _core.BYTES_PER_ENTRY <= 64
