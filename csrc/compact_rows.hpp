// Vectorised row compaction for evict_stale, chosen at run time (the wheel is built for baseline x86-64).
#pragma once

#include <cstdint>

#include "ring_columns.hpp"

namespace pyfast_buffer {

/// Returns true iff this CPU runs compact_rows_simd (x86-64 with AVX-512F and AVX-512VL) and the
/// environment does not set PYFAST_BUFFER_NO_SIMD.
bool simd_compaction_available();

/// Compacts rows [read, read + n) onto [write, ...) keeping rows with key >= cutoff (`key` is one of the
/// columns: the age stamps), eight at a time, and the meta column unless `cols.meta` is null (moved, it must be
/// moved by every later row pass too: the rows past the kept ones are left zeroed); requires write <= read,
/// read + n <= capacity and write + n <= capacity (no wrap), n % 8 == 0, and simd_compaction_available().
/// Returns the number of rows kept.
int64_t compact_rows_simd(const ColumnPointers& cols, const int64_t* key, int64_t read, int64_t write, int64_t n,
                          int64_t cutoff);

}  // namespace pyfast_buffer
