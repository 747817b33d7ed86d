// The scalar compaction of evict_stale, block by block through a small scratch (CPUs without AVX-512).
#pragma once

#include <cstdint>

#include "ring_columns.hpp"

namespace pyfast_buffer {

/// Rows gathered per block: the scratch (kCompactScratchWords words) stays in the L2 cache.
constexpr int64_t kCompactBlock = 2048;

/// Words of scratch compact_rows_blocked needs: seven wide columns and two narrow ones of kCompactBlock rows.
constexpr int64_t kCompactScratchWords = 8 * kCompactBlock;

/// What a compaction may leave out, because the ring's flags prove it changes nothing (ring_evict.cpp).
struct CompactColumns {
  bool meta = true;        // move the meta column (false: every live entry's meta is the same)
  bool counts = true;      // move uses and group_len (false: every live entry is an untaken group of one)
  bool mirrored = false;   // group_id, finish_step, complete_ns equal traj_id, sample_step, dispatch_ns
  bool streamed = false;   // write with non-temporal stores (a ring far larger than the caches)
};

/// Compacts the `total` ring rows from physical row `read` onto physical row `write` (write trails read
/// in ring order; both wrap at `cap`), keeping rows whose `key` is >= cutoff in order: each block's kept rows
/// are gathered into `scratch` (at least kCompactScratchWords words), then written column by column, so the
/// lines at the write cursor are written whole and never read first. Returns the number of rows kept.
int64_t compact_rows_blocked(const ColumnPointers& c, const int64_t* key, int64_t cutoff, int64_t cap, int64_t read,
                             int64_t write, int64_t total, CompactColumns what, int64_t* scratch);

}  // namespace pyfast_buffer
