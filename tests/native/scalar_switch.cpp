// The core decides per evict_stale call by calling simd_compaction_available(). The checks build
// compiles csrc/compact_rows.cpp with that function renamed (see CMakeLists.txt) and defines it here
// in front of the real one, so the fuzzer can run both paths in one process without a hook in csrc.
#include "scalar_switch.hpp"

namespace pyfast_buffer {
bool simd_compaction_available_real();  // csrc/compact_rows.cpp's function, renamed by the build

bool simd_compaction_available();
}  // namespace pyfast_buffer

namespace {
bool g_force_scalar = false;
}  // namespace

bool pyfast_buffer::simd_compaction_available() {
  return !g_force_scalar && simd_compaction_available_real();
}

void pyfast_buffer_checks::force_scalar_compaction(bool force) { g_force_scalar = force; }

bool pyfast_buffer_checks::simd_compaction_on_this_cpu() { return pyfast_buffer::simd_compaction_available_real(); }
