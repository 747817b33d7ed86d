"""Every public module of ``pyfast_buffer.integrations`` imports, star-imports and ``help()``s without its
framework installed, and a name it loads lazily raises an install message only when it is asked for (issue 50).

The walk is generic: a subpackage added later is covered without touching this file. Private modules (a name
starting with ``_``) may import their framework at the top: a public module loads them only on first use. The
rule each integration follows: a name that needs the framework is loaded by the package's ``__getattr__`` and
named in its ``_LAZY``; ``__all__`` and ``__dir__`` list it only where the framework is installed (pydoc and a
star import read every name they list); asked for without the framework, it raises ImportError saying what to
install. The checks run in a fresh interpreter, so whatever this pytest process
already imported cannot hide a missing module.
"""

import json
import subprocess
import sys

_CHILD = r"""
import importlib, io, json, pkgutil, pydoc

import pyfast_buffer.integrations as root

report = {}
names = [root.__name__]
failures = {}
walked = pkgutil.walk_packages(
    root.__path__, root.__name__ + ".", onerror=lambda name: failures.setdefault(name, "walk")
)
names += [info.name for info in walked if not any(part.startswith("_") for part in info.name.split(".")[2:])]
for name in names:
    entry = report.setdefault(name, {})
    try:
        module = importlib.import_module(name)
        namespace = {}
        exec(f"from {name} import *", namespace)
        entry["star"] = sorted(k for k in namespace if k != "__builtins__")
        missing = [n for n in getattr(module, "__all__", ()) if n not in namespace]
        if missing:
            entry["error"] = f"__all__ names {missing} that the star import did not bind"
        out = io.StringIO()
        pydoc.Helper(output=out).help(module)
        text = out.getvalue()  # pydoc prints an error it caught (a lazy name dir() lists failing) instead of help
        entry["help_ok"] = text.startswith("Help on ") and "NAME" in text and name in text
        entry["help_head"] = text[:300]
        lazy = {}
        for attr in sorted(set(dir(module)) | set(getattr(module, "_LAZY", ()))):
            try:
                getattr(module, attr)
            except ImportError as exc:  # a lazily loaded name whose framework is missing: it must say so
                lazy[attr] = str(exc)
        entry["lazy_errors"] = lazy
    except BaseException as exc:  # noqa: BLE001 - reported per module, the test names it
        entry["error"] = f"{type(exc).__name__}: {exc}"
for name, why in failures.items():
    report.setdefault(name, {})["error"] = f"pkgutil could not import it while walking ({why})"
print(json.dumps(report))
"""


def test_every_integration_module_star_imports_and_helps_without_its_framework(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "pyfast_buffer.integrations.verl" in report and "pyfast_buffer.integrations.torchrl" in report, report
    broken = {name: entry["error"] for name, entry in report.items() if "error" in entry}
    assert not broken, broken
    for name, entry in report.items():
        assert entry["help_ok"], (name, entry)  # help() rendered the module: its name and its contents
        for attr, message in entry["lazy_errors"].items():
            # The framework's own "No module named 'verl'" leaves a user guessing: name what to install.
            assert "install" in message.lower() or "pythonpath" in message.lower(), (name, attr, message)
