// StalenessRing: evict_stale, a binary search over sorted stamps or one compaction pass.
#include "ring_detail.hpp"

#include "compact_rows.hpp"

namespace pyfast_buffer {

TakeStats StalenessRing::evict_stale(int64_t current_step) {
  MutexLock lock(mutex_);
  check_open();
  expire_due();
  check_clock(current_step);
  clock_ = current_step;
  const int64_t cutoff = current_step - max_age_;
  int64_t removed = 0;
  if (sorted_) {
    const int64_t* steps = columns_.get().sample_step;
    // Stamps are non-decreasing in ring order: the stale entries are a prefix.
    int64_t lo = 0, hi = size_;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (steps[phys(mid)] < cutoff) lo = mid + 1; else hi = mid;
    }
    removed = lo;
    if (leave_hooks()) note_prefix_left(removed, ReleaseReason::kDroppedStale);
    remove_prefix(removed);
  } else {
    // One branch-free pass: every row is copied to the write cursor, which advances only for fresh
    // rows; where neither cursor is near the wrap point, eight rows at a time with AVX-512 if present.
    const ColumnPointers c = columns_.get();  // local copies: column stores cannot alias them
    const int64_t cap = config_.capacity, total = size_;
    if (leave_hooks())  // report the stale ids before the compaction (scalar or SIMD) overwrites them
      for (int64_t i = 0; i < total; ++i)
        if (c.sample_step[phys(i)] < cutoff) note_left(c.traj_id[phys(i)], ReleaseReason::kDroppedStale);
    const bool simd = simd_compaction_available();
    int64_t read = head_, write = head_, kept = 0;
    for (int64_t done = 0; done < total;) {
      if (simd) {
        const int64_t span = std::min({total - done, cap - read, cap - write}) / 8 * 8;
        if (span > 0) {
          const int64_t n_kept = compact_rows_simd(c, read, write, span, cutoff);
          kept += n_kept, done += span, read += span, write += n_kept;
          read -= (read == cap) ? cap : 0;
          write -= (write == cap) ? cap : 0;
          if (span >= 64) continue;  // near the wrap point: fall through to a few scalar rows
        }
      }
      for (const int64_t stop = std::min(total, done + 64); done < stop; ++done) {
        const int64_t step = c.sample_step[read];
        const int64_t keep = step >= cutoff;
        c.traj_id[write] = c.traj_id[read];
        c.group_id[write] = c.group_id[read];
        c.sample_step[write] = step;
        c.policy_version[write] = c.policy_version[read];
        c.dispatch_ns[write] = c.dispatch_ns[read];
        c.complete_ns[write] = c.complete_ns[read];
        c.uses[write] = c.uses[read];
        c.group_len[write] = c.group_len[read];
        kept += keep;
        write += keep;
        write -= (write == cap) ? cap : 0;
        read += 1;
        read -= (read == cap) ? cap : 0;
      }
    }
    // The survivors are sorted iff no kept stamp is below its predecessor; stop at the first descent.
    bool sorted = true;
    for (int64_t i = 1, prev = c.sample_step[head_], p = phys(1); i < kept && sorted; ++i) {
      sorted = c.sample_step[p] >= prev;
      prev = c.sample_step[p];
      p = p + 1 == cap ? 0 : p + 1;
    }
    removed = size_ - kept;
    size_ = kept;
    sorted_ = sorted;
    if (size_ == 0) head_ = 0;
  }
  ledger_.dropped_stale += removed;
  if (removed > 0) room_cv_.notify_all();
  TakeStats stats;
  stats.dropped_stale = removed;
  stats.blocked_by = BlockedBy::kNone;
  fill_state(stats);
  return stats;
}

}  // namespace pyfast_buffer
