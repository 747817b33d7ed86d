#!/usr/bin/env bash
# The TRL stage: TRL 1.16.0 from PyPI (with transformers, accelerate, datasets) in a venv of its own, the built wheel
# with [test,trl], then the tests that run TRL's real AsyncGRPOTrainer on our worker (tests/test_trl_worker.py:
# each strategy, a resume, failures, Ctrl-C, the example; about 2 minutes here). A venv of its own so that TRL's
# transformers does not move under the main venv's extras. On CPU only two things of TRL's are replaced, by
# pyfast_buffer.integrations.trl.cpu.use_cpu_kernels: its FlashAttention-3 kernel and its CUDA peak-FLOPs query.
#   bash .ci/trl-stage.sh WHEEL [--keep]    (--keep leaves .ci-venv-trl, e.g. for benchmarks/trl_goodput.py)
set -euo pipefail
cd "$(dirname "$0")/.."
wheel="${1:?usage: bash .ci/trl-stage.sh path/to/pyfast_buffer-*.whl [--keep]}"
venv="$PWD/.ci-venv-trl"
rm -rf "$venv"
python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet torch==2.13.0   # the CPU build; an unpinned torch pulls CUDA
"$py" -m pip install --quiet "${wheel}[test,trl]"
(cd /tmp && "$py" -c "
import pyfast_buffer as p, trl
assert 'site-packages' in p.__file__, p.__file__
assert trl.__version__ == '1.16.0', trl.__version__
print('trl stage:', p.__file__, p.__version__, 'trl', trl.__version__)")
PATH="$venv/bin:$PATH" TRL_EXPERIMENTAL_SILENCE=1 pytest -q -rs tests/test_trl_worker.py
if [ "${2:-}" != "--keep" ]; then rm -rf "$venv"; fi
