#!/usr/bin/env bash
# CI step: build the libFuzzer target tests/native/fuzz_ops.cpp (ASan + UBSan) and fuzz for 60 s from
# the committed seed corpus; a crash, sanitizer report, leak or failed check fails the step and leaves
# the input in build/fuzz-artifacts/. New corpus entries go to build/fuzz-corpus, never the repository.
# Usage: bash .ci/fuzz.sh   (PFB_FUZZ_SECONDS=3600 PFB_FUZZ_JOBS=4 to fuzz longer; docs/reliability-ci.md)
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/clang.sh
build=build/fuzz
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S tests/native -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++ -DPFB_CHECK=fuzz >/dev/null
cmake --build "$build" >"$build.log" 2>&1 || { cat "$build.log" >&2; exit 1; }   # messages only on failure
mkdir -p build/fuzz-corpus build/fuzz-artifacts
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
unset PYFAST_BUFFER_NO_SIMD   # ring A must take the SIMD compaction where the CPU has it
parallel=()   # -jobs runs each job in a child writing fuzz-N.log; only when asked for
[ "${PFB_FUZZ_JOBS:-1}" -gt 1 ] && parallel=(-jobs="$PFB_FUZZ_JOBS" -workers="$PFB_FUZZ_JOBS")
log=build/fuzz.log
set +e
"$build/fuzz_ops" -max_total_time="${PFB_FUZZ_SECONDS:-60}" -max_len=2048 -timeout=20 -rss_limit_mb=2048 \
  -print_final_stats=1 "${parallel[@]}" -artifact_prefix=build/fuzz-artifacts/ \
  build/fuzz-corpus tests/native/corpus >"$log" 2>&1
rc=$?
set -e
# The progress lines (one per new input) are noise in CI; the summary and any report are kept.
grep -v -E "^#[0-9]+.*(NEW|REDUCE|pulse)|NEW_FUNC|# Uses: [0-9]+$" "$log" | tail -n 60
exit $rc
