#!/usr/bin/env bash
# CI: the callgrind perf guard. Instructions per entry of the native core's fixed workloads must stay
# within benchmarks/instruction_budgets.json; a regression fails naming the operation and by how much.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-python}"
if ! command -v valgrind >/dev/null; then
  echo "perf guard: valgrind is not installed; apt-get install valgrind" >&2
  exit 1
fi
"$py" benchmarks/perf_guard.py
