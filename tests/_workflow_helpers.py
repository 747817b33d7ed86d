"""Helpers for the workflow-command tests (rhythm, audit, perturb): fixture paths and a CLI runner."""

import os

from pyfast_buffer import cli

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def fixture(*parts):
    """Returns the absolute path of a file under tests/fixtures."""
    return os.path.join(FIXTURES, *parts)


def run_cli(capsys, *argv):
    """Runs ``pyfast-buffer ARGV...`` in-process and returns (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err
