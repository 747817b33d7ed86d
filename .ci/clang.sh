#!/usr/bin/env bash
# Installs Debian's clang and the matching sanitizer/libFuzzer runtimes (libclang-rt-N-dev), and cmake if
# there is none, quietly and only when missing. CI runs as root; elsewhere run it with sudo or install them.
set -euo pipefail
have_runtimes() {
  command -v cmake >/dev/null && command -v clang++ >/dev/null &&
    [ -f "$(clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a)" ] &&
    [ -f "$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)" ]
}
have_runtimes && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
command -v cmake >/dev/null || apt-get install -y -qq cmake >/dev/null
command -v clang++ >/dev/null || apt-get install -y -qq clang >/dev/null
major=$(clang++ -dumpversion | cut -d. -f1)
apt-get install -y -qq "libclang-rt-$major-dev" >/dev/null
have_runtimes || { echo "clang.sh: clang $major runtimes still missing after install" >&2; exit 1; }
