#!/usr/bin/env bash
# CI step: build the extension with clang under AddressSanitizer + UndefinedBehaviorSanitizer, with
# Clang's thread-safety analysis as errors, into build/asan (never into the wheel) and run the core test
# files against it with the ASan runtime preloaded into python. Any sanitizer report fails the step.
# Usage: bash .ci/sanitizers.sh [python]   (a venv python with the package's run and test deps)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py="$(realpath -s "$(command -v "${1:-python}")")"   # absolute: some commands below run from /tmp
export CI="${CI:-true}"
bash .ci/clang.sh

build=build/asan
stage=build/asan-pkg   # pyfast_buffer's Python sources plus the sanitized _core
"$py" -c "import pybind11" 2>/dev/null || "$py" -m pip install --quiet "pybind11>=2.12"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
# Clang's thread-safety analysis checks the core's lock annotations (csrc/thread_annotations.hpp) in the
# same compile: a member read without mutex_, or a private helper called without it, fails the build.
flags+=" -Wthread-safety -Werror=thread-safety"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined -shared-libasan" \
  -DSKBUILD_PROJECT_NAME=pyfast_buffer -DSKBUILD_PROJECT_VERSION=0.0.0 \
  -DPython_EXECUTABLE="$py" \
  -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" >/dev/null
# The compiler's messages (a thread-safety error, say) are shown only when the build fails.
cmake --build "$build" >"$build.log" 2>&1 || { cat "$build.log" >&2; exit 1; }
rm -rf "$stage" && mkdir -p "$stage"
cp -r pyfast_buffer "$stage/"
find "$stage" -name '_core*.so' -delete
cp "$build"/_core*.so "$stage/pyfast_buffer/"
# A bare venv that sees the stage first, then the given python's packages as plain paths: their .pth
# files (an editable install's import hook, say) do not run, so the sanitized core cannot be shadowed.
venv=build/asan-venv
rm -rf "$venv" && "$py" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
packages=$("$py" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("-packages")))')
printf '%s\n' "$PWD/$stage" "$root/tests/native" "$packages" > "$site/asan-stage.pth"   # tests/native: the -p plugin
py="$PWD/$venv/bin/python"

asan_rt=$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)
[ -f "$asan_rt" ] || { echo "sanitizers: $asan_rt not found; install libclang-rt-dev" >&2; exit 1; }
# detect_leaks=0: CPython keeps interned objects and arenas alive at exit by design; LeakSanitizer
# reports them as leaks, none of them ours. Leaks in the core are the fuzzer's job (it runs LSan).
# Reports go to files: pytest captures fd 2 per test, and a report printed there dies with the process.
reports="$root/build/asan-reports"
rm -rf "$reports" && mkdir -p "$reports"
# allocator_may_return_null=1: an impossible allocation (test_hostile_input asks for 2**40 entries) returns
# null, as glibc's would, so the core's MemoryError path runs instead of ASan aborting; ASan logs a warning.
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:exitcode=86:strict_init_order=1:allocator_may_return_null=1"
ASAN_OPTIONS+=":log_path=$reports/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87:log_path=$reports/ubsan"
export PYTHONMALLOC=malloc   # route CPython's small objects through ASan so overruns into them are seen
log=build/asan-pytest.log
(cd /tmp && LD_PRELOAD="$asan_rt" "$py" -c "import pyfast_buffer._core as c, sys; \
  assert c.__file__.startswith('$root/$stage'), c.__file__; print('sanitized core:', c.__file__)")
set +e
# From /tmp: `python -m` puts the working directory first on sys.path, and the source tree's package
# (no compiled _core) would shadow the stage.
tests=()
for name in put_take bad_input stateful state_dict evict_stale wait on_full concurrency leases max_age released \
  atomic_calls hostile_input interrupts; do
  tests+=("$root/tests/test_$name.py")
done
# native_only_plugin drops the cases that run only the pure-Python twin: nothing for ASan to see, half the time.
(cd /tmp && LD_PRELOAD="$asan_rt" "$py" -m pytest -q -p no:cacheprovider -p native_only_plugin --rootdir "$root" \
  "${tests[@]}" 2>&1) | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if compgen -G "$reports/*" >/dev/null; then
  cat "$reports"/* >&2   # warnings too (e.g. the refused huge allocation); only errors fail the step
  if grep -qE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: " "$reports"/*; then
    echo "sanitizers: the reports above (kept in $reports) fail this step" >&2
    exit 1
  fi
fi
exit "$rc"
