#!/usr/bin/env bash
# CI step: build tests/native/tsan_driver.cpp with ThreadSanitizer and run a bounded number of rounds
# of threads racing on one ring; a data race, lock-order inversion or failed check fails the step.
# Usage: bash .ci/tsan.sh   (PFB_TSAN_ROUNDS, PFB_TSAN_ROUND_MS, PFB_TSAN_SEED to run it longer or other ways)
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/clang.sh
build=build/tsan
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S tests/native -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ -DPFB_CHECK=tsan >/dev/null
cmake --build "$build" >"$build.log" 2>&1 || { cat "$build.log" >&2; exit 1; }   # messages only on failure
export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:history_size=4"
run=("$build/tsan_driver" "${PFB_TSAN_ROUNDS:-60}" "${PFB_TSAN_ROUND_MS:-40}" "${PFB_TSAN_SEED:-1}")
set +e
out=$("${run[@]}" 2>&1)
rc=$?
set -e
# TSan's shadow memory needs a fixed layout; kernels with large mmap randomisation refuse it at start.
if [ $rc -ne 0 ] && grep -q "unexpected memory mapping" <<<"$out"; then
  out=$(setarch "$(uname -m)" -R "${run[@]}" 2>&1) && rc=0 || rc=$?
fi
echo "$out"
exit $rc
