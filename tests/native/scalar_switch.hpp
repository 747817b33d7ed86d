// A test-only switch that makes the core's evict_stale take the scalar compaction pass.
#pragma once

namespace pyfast_buffer_checks {

/// While set, simd_compaction_available() answers false, so evict_stale compacts row by row; the
/// fuzzer is single-threaded and flips it around each call on its scalar ring.
void force_scalar_compaction(bool force);

/// Returns true iff this CPU runs the SIMD compaction when the switch is off.
bool simd_compaction_on_this_cpu();

}  // namespace pyfast_buffer_checks
