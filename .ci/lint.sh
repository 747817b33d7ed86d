#!/usr/bin/env bash
# Lint, format and type checks, configured in pyproject.toml:
#   ruff check, ruff format --check, mypy, pyright (basic), and mypy's stubtest of the compiled _core against
#   _core.pyi. Every check runs and reports; the script fails if any failed.
#   bash .ci/lint.sh [PYTHON]   (PYTHON: a venv with the package and its `lint` extra; default `python`)
set -uo pipefail
cd "$(dirname "$0")/.."
py="${1:-python}"
failed=()
check() {
  local name=$1 t=$SECONDS; shift
  if "$@"; then echo "lint.sh: $name ok ($((SECONDS - t)) s)" >&2
  else echo "lint.sh: $name FAILED ($((SECONDS - t)) s)" >&2; failed+=("$name"); fi
}
check "ruff check" "$py" -m ruff check --output-format concise .
check "ruff format" "$py" -m ruff format --check .
check mypy "$py" -m mypy
check pyright "$py" -m pyright -p pyproject.toml --pythonpath "$py"
# stubtest imports the module, so it runs outside the source tree (whose package has no compiled _core):
# it checks the installed wheel's _core against the _core.pyi shipped beside it.
allow="$PWD/.ci/stubtest-allowlist.txt"
check stubtest bash -c "cd /tmp && '$py' -m mypy.stubtest pyfast_buffer._core --allowlist '$allow'"
if [ ${#failed[@]} -gt 0 ]; then echo "lint.sh: failed: ${failed[*]}" >&2; exit 1; fi
