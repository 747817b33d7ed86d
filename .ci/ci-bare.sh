#!/usr/bin/env bash
# The README's test command on a bare machine: a fresh venv with only torch's CPU build and the built
# wheel's `test` extra (no verl, ray, TransferQueue, matplotlib, tqdm, omegaconf), then the whole pytest.
# Tests that need an extra must skip with the reason, never fail. Usage: bash .ci/ci-bare.sh WHEEL
set -euo pipefail
cd "$(dirname "$0")/.."
wheel="${1:?usage: bash .ci/ci-bare.sh path/to/pyfast_buffer-*.whl}"
venv="$PWD/.ci-venv-bare"
rm -rf "$venv"
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet torch==2.13.0   # the CPU build; an unpinned torch pulls CUDA
"$py" -m pip install --quiet "${wheel}[test]"
# The point of this stage: none of the optional extras may be present.
"$py" - <<'PY'
import importlib.util
present = [m for m in ("ray", "transfer_queue", "matplotlib", "tqdm", "omegaconf", "tensordict") if importlib.util.find_spec(m)]
assert not present, f"the bare venv has optional packages installed: {present}"
PY
(cd /tmp && "$py" -c "import pyfast_buffer as p; assert 'site-packages' in p.__file__, p.__file__")
# -rs names every skip and its reason in the summary.
PATH="$venv/bin:$PATH" pytest -q -rs  # the command, not python -m pytest: that puts the source tree first
rm -rf "$venv"
