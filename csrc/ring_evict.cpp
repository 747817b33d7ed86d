// StalenessRing: evict_stale, a binary search over sorted stamps or one compaction pass.
#include "ring_detail.hpp"

#include "compact_blocks.hpp"
#include "compact_rows.hpp"

#include <type_traits>

namespace pyfast_buffer {
namespace {
constexpr int64_t kStreamFromBytes = int64_t{128} << 20;  // a ring this large is past any cache we run on
}  // namespace

TakeStats StalenessRing::evict_stale(int64_t current_step) {
  MutexLock lock(mutex_);
  check_open();
  expire_due();
  check_clock(current_step);
  advance_clock_by_trainer(current_step);
  // Per-source bounds or protected entries: stale entries are not a prefix, and the key is the stale-before
  // column against current_step (evict_stale applies the bounds under either strategy); the compaction below
  // keeps groups whole because a group shares one key.
  const bool per_entry = per_entry_cutoffs();
  if (per_entry) fill_cutoffs(current_step, true);
  const int64_t* const ages = age_steps();
  const int64_t* const keys = per_entry ? expiry_.data() : ages;
  const int64_t cutoff = per_entry ? current_step : current_step - max_age_;
  int64_t removed = 0;
  const bool observe = bias_ || tagged_;
  if (!per_entry && sorted_) {
    // Stamps are non-decreasing in ring order: the stale entries are a prefix. The geometry is in locals, so
    // the search reloads nothing per probe.
    const int64_t* const steps = ages;
    const int64_t head = head_, cap = config_.capacity;
    int64_t lo = 0, hi = size_;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      const int64_t p = head + mid >= cap ? head + mid - cap : head + mid;
      if (steps[p] < cutoff) lo = mid + 1; else hi = mid;
    }
    removed = lo;
    if (observe) observe_lost(removed, false);
    if (leave_hooks()) note_prefix_left(removed, ReleaseReason::kDroppedStale);
    if (paced()) pace_forget_prefix(removed);
    remove_prefix(removed);
  } else {
    // One branch-free compaction pass, in blocks through a scratch or with AVX-512 if present.
    const ColumnPointers c = columns_.get();  // local copies: column stores cannot alias them
    const int64_t cap = config_.capacity, total = size_;
    if (marks_.on()) {  // the journal's marks: the fresh rows, as runs of the ring before the compaction
      marks_.begin_edit(RingChangeMarks::run_cap(cap));
      int64_t run = -1;  // the first row of the current run of fresh groups, or -1
      for (int64_t i = 0; i < total; i += c.group_len[phys(i)]) {  // a group shares one key
        const bool fresh = keys[phys(i)] >= cutoff;
        if (fresh && run < 0) run = i;
        if (!fresh && run >= 0) marks_.keep(run, i - run), run = -1;
      }
      if (run >= 0) marks_.keep(run, total - run);
      marks_.end_edit();
    }
    if (leave_hooks())  // report the stale ids before the compaction (scalar or SIMD) overwrites them
      for (int64_t i = 0; i < total; ++i)
        if (keys[phys(i)] < cutoff) note_left(c.traj_id[phys(i)], ReleaseReason::kDroppedStale);
    if (observe)  // likewise the data accounting, group by group
      for (int64_t i = 0; i < total; i += c.group_len[phys(i)])
        if (keys[phys(i)] < cutoff) observe_lost_group(phys(i), false);
    // A ring far larger than the caches is compacted in blocks and written past the caches, with or without
    // AVX-512 (measured faster than the vector pass there: no line at the write cursor is read first).
    const bool streamed = total * kBytesPerEntry >= kStreamFromBytes;
    const bool simd = !streamed && simd_compaction_available();
    const bool move_meta = !plain_meta_;
    int64_t kept = 0;
    if (!simd) {
      // Block by block through a scratch in cache, leaving out what the flags prove unchanged: the meta
      // column while every entry's meta is the same (put-only rings), uses and group_len while every entry is
      // an untaken group of one, and the reads of group_id, finish_step and complete_ns while they mirror
      // traj_id, sample_step and dispatch_ns.
      if (compact_scratch_.empty()) compact_scratch_.resize(kCompactScratchWords);
      CompactColumns what;
      what.meta = move_meta, what.counts = !lone_unused_, what.mirrored = mirrored_, what.streamed = streamed;
      kept = compact_rows_blocked(c, keys, cutoff, cap, head_, head_, total, what, compact_scratch_.data());
    } else {
      // Eight rows at a time with AVX-512 where neither cursor is near the wrap point, every row copied to the
      // write cursor, which advances only for fresh rows. Both passes move the meta column or both skip it
      // (every entry's meta the same): the vector pass's full-width store zeroes the lanes past its kept rows,
      // which only a later pass that moves meta overwrites.
      ColumnPointers simd_cols = c;
      if (!move_meta) simd_cols.meta = nullptr;
      int64_t read = head_, write = head_;
      for (int64_t done = 0; done < total;) {
        const int64_t span = std::min({total - done, cap - read, cap - write}) / 8 * 8;
        if (span > 0) {
          const int64_t n_kept = compact_rows_simd(simd_cols, keys, read, write, span, cutoff);
          kept += n_kept, done += span, read += span, write += n_kept;
          read -= (read == cap) ? cap : 0;
          write -= (write == cap) ? cap : 0;
          if (span >= 64) continue;  // near the wrap point: fall through to a few scalar rows
        }
        for (const int64_t stop = std::min(total, done + 64); done < stop; ++done) {
          const int64_t keep = keys[read] >= cutoff;
          c.traj_id[write] = c.traj_id[read];
          c.group_id[write] = c.group_id[read];
          c.sample_step[write] = c.sample_step[read];
          c.finish_step[write] = c.finish_step[read];
          c.dispatch_ns[write] = c.dispatch_ns[read];
          c.complete_ns[write] = c.complete_ns[read];
          if (move_meta) c.meta[write] = c.meta[read];
          c.uses[write] = c.uses[read];
          c.group_len[write] = c.group_len[read];
          kept += keep;
          write += keep;
          write -= (write == cap) ? cap : 0;
          read += 1;
          read -= (read == cap) ? cap : 0;
        }
      }
    }
    // The survivors are sorted iff no kept stamp is below its predecessor; stop at the first descent.
    bool sorted = true;
    for (int64_t i = 1, prev = ages[head_], p = phys(1); i < kept && sorted; ++i) {
      sorted = ages[p] >= prev;
      prev = ages[p];
      p = p + 1 == cap ? 0 : p + 1;
    }
    removed = size_ - kept;
    if (removed > 0) expiry_valid_ = false;  // rows moved, the column did not: the next per-entry walk rebuilds it
    size_ = kept;
    sorted_ = sorted;
    if (size_ == 0) head_ = 0, spans_ = false, plain_meta_ = !tagged_, lone_unused_ = true,
                    mirrored_ = true;
    if (paced()) pace_count_ready();
  }
  ledger_.dropped_stale += removed;
  if (removed > 0) room_cv_.notify_all();
  if (removed > 0 && paced()) admit_cv_.notify_all();
  TakeStats stats;
  stats.dropped_stale = removed;
  stats.blocked_by = BlockedBy::kNone;
  fill_state(stats);
  return stats;
}

}  // namespace pyfast_buffer
