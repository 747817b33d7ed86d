# Toolchain file for a wheel that installs on glibc >= 2.28 (RHEL/Rocky 8, Ubuntu 20.04, Debian 10+):
# compile and link with zig's clang against glibc 2.28 symbol stubs and a static libc++.
# Used by .ci/wheel.sh where the manylinux_2_28 container is not available; cibuildwheel uses the
# container's GCC instead. Same OS and CPU as the host, so CMake does not treat this as a cross build.
set(CMAKE_CXX_COMPILER "${CMAKE_CURRENT_LIST_DIR}/zig-cxx" CACHE FILEPATH "zig c++ targeting glibc 2.28")
# zig links libc++, libc++abi and libunwind statically and builds them with hidden visibility, so none of
# their symbols leaves the extension (checked by .ci/wheel.sh: no std:: or __cxa_ symbol is exported).
# Only PyInit__core needs to be exported: hidden by default keeps pybind11's and our inline symbols from
# interposing with another extension's (torch's pybind11 is built against libstdc++).
set(CMAKE_CXX_VISIBILITY_PRESET hidden)
set(CMAKE_VISIBILITY_INLINES_HIDDEN ON)
# pybind11 probes -flto at configure time for its pybind11::lto target, which this project does not use;
# under zig the probe links an LTO build of libc++ (minutes on a cold zig cache). Answer it up front.
set(HAS_FLTO_THIN OFF CACHE BOOL "pybind11's LTO probe, unused")
set(HAS_FLTO_AUTO OFF CACHE BOOL "pybind11's LTO probe, unused")
set(HAS_FLTO OFF CACHE BOOL "pybind11's LTO probe, unused")
