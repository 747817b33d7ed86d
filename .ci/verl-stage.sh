#!/usr/bin/env bash
# The verl stage: verl 0.9.1 from PyPI with its real dependencies (its verl-core extra; CPU torch first) in a venv
# of its own, the built wheel with [test,verl], then the tests that run verl's own trainer, buffer and rollout-skip
# cache against ours (tests/test_verl091_*.py: about 8 minutes here). A venv of its own because verl pins
# tensordict<=0.10 and transformers, which the main venv's extras must not be held to.
# Nothing is stubbed: verl's GPU-only engines (megatron, torchtitan, ...) are optional imports that verl skips with
# a warning, which the test modules filter by message (VERL_OWN_WARNINGS).
#   bash .ci/verl-stage.sh WHEEL [--keep]    (--keep leaves .ci-venv-verl, e.g. for benchmarks/verl_loop.py)
set -euo pipefail
cd "$(dirname "$0")/.."
wheel="${1:?usage: bash .ci/verl-stage.sh path/to/pyfast_buffer-*.whl [--keep]}"
venv="$PWD/.ci-venv-verl"
rm -rf "$venv"
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet torch==2.13.0   # the CPU build; verl's own extras would pull a CUDA one
"$py" -m pip install --quiet "${wheel}[test,verl]" "verl[verl-core]==0.9.1"
(cd /tmp && "$py" -c "
import pyfast_buffer as p, verl
assert 'site-packages' in p.__file__, p.__file__
assert verl.__version__ == '0.9.1', verl.__version__
print('verl stage:', p.__file__, p.__version__, 'verl', verl.__version__)")
# verl-core brings pytest-asyncio and pytest-rerunfailures; our tests use neither (and the first warns at start).
PATH="$venv/bin:$PATH" pytest -q -rs -p no:asyncio -p no:rerunfailures tests/test_verl091_*.py
if [ "${2:-}" != "--keep" ]; then rm -rf "$venv"; fi
