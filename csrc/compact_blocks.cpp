#include "compact_blocks.hpp"

#include <algorithm>
#include <type_traits>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define PYFAST_BUFFER_STREAM_STORES 1
#endif

namespace pyfast_buffer {
namespace {

// Copies n values onto a column from row `at`, wrapping at `cap`; streamed, as non-temporal stores: one
// column at a time, so each write-combining buffer fills a whole line before it leaves the core.
template <typename T>
void put_column(T* col, int64_t at, const T* from, int64_t n, int64_t cap, bool streamed) {
  const int64_t first = std::min(n, cap - at);
#ifdef PYFAST_BUFFER_STREAM_STORES
  if (streamed) {
    auto stream = [](T* to, const T* src, int64_t count) {
      for (int64_t i = 0; i < count; ++i) {
        if constexpr (sizeof(T) == 8)
          _mm_stream_si64(reinterpret_cast<long long*>(to + i), static_cast<long long>(src[i]));
        else
          _mm_stream_si32(reinterpret_cast<int*>(to + i), static_cast<int>(src[i]));
      }
    };
    stream(col + at, from, first);
    stream(col, from + first, n - first);
    return;
  }
#endif
  (void)streamed;
  std::copy_n(from, first, col + at);
  std::copy_n(from + first, n - first, col);
}

// Calls f with each flag as std::true_type or std::false_type, so that each combination is its own loop.
template <typename F>
void with_flags(F&& f, bool a, bool b, bool c) {
  auto last = [&](auto x, auto y) { c ? f(x, y, std::true_type{}) : f(x, y, std::false_type{}); };
  auto second = [&](auto x) { b ? last(x, std::true_type{}) : last(x, std::false_type{}); };
  a ? second(std::true_type{}) : second(std::false_type{});
}

}  // namespace

int64_t compact_rows_blocked(const ColumnPointers& c, const int64_t* key, int64_t cutoff, int64_t cap, int64_t read,
                             int64_t write, int64_t total, CompactColumns what, int64_t* scratch) {
  int64_t* const s_traj = scratch;
  int64_t* const s_group = scratch + kCompactBlock;
  int64_t* const s_step = scratch + 2 * kCompactBlock;
  int64_t* const s_finish = scratch + 3 * kCompactBlock;
  int64_t* const s_dispatch = scratch + 4 * kCompactBlock;
  int64_t* const s_complete = scratch + 5 * kCompactBlock;
  int64_t* const s_meta = scratch + 6 * kCompactBlock;
  int32_t* const s_uses = reinterpret_cast<int32_t*>(scratch + 7 * kCompactBlock);
  int32_t* const s_len = s_uses + kCompactBlock;
  int64_t kept = 0;
  for (int64_t done = 0; done < total;) {
    const int64_t n = std::min({kCompactBlock, total - done, cap - read});
    int64_t k = 0;
    // The gather: every row is copied to scratch row k, which advances only for kept rows (no branch).
    auto gather = [&](auto mirrored, auto with_meta, auto with_counts) {
      for (int64_t r = read, end = read + n; r < end; ++r) {
        const int64_t keep = key[r] >= cutoff;
        s_traj[k] = c.traj_id[r], s_step[k] = c.sample_step[r], s_dispatch[k] = c.dispatch_ns[r];
        if constexpr (!decltype(mirrored)::value)
          s_group[k] = c.group_id[r], s_finish[k] = c.finish_step[r], s_complete[k] = c.complete_ns[r];
        if constexpr (decltype(with_meta)::value) s_meta[k] = c.meta[r];
        if constexpr (decltype(with_counts)::value) s_uses[k] = c.uses[r], s_len[k] = c.group_len[r];
        k += keep;
      }
    };
    with_flags(gather, what.mirrored, what.meta, what.counts);
    // The scatter: the kept rows onto the write cursor, column by column; mirrored columns from their sources.
    put_column(c.traj_id, write, s_traj, k, cap, what.streamed);
    put_column(c.sample_step, write, s_step, k, cap, what.streamed);
    put_column(c.dispatch_ns, write, s_dispatch, k, cap, what.streamed);
    put_column(c.group_id, write, what.mirrored ? s_traj : s_group, k, cap, what.streamed);
    put_column(c.finish_step, write, what.mirrored ? s_step : s_finish, k, cap, what.streamed);
    put_column(c.complete_ns, write, what.mirrored ? s_dispatch : s_complete, k, cap, what.streamed);
    if (what.meta) put_column(c.meta, write, s_meta, k, cap, what.streamed);
    if (what.counts) {
      put_column(c.uses, write, s_uses, k, cap, what.streamed);
      put_column(c.group_len, write, s_len, k, cap, what.streamed);
    }
    kept += k, done += n;
    read += n, write += k;
    read -= read >= cap ? cap : 0;
    write -= write >= cap ? cap : 0;
  }
#ifdef PYFAST_BUFFER_STREAM_STORES
  if (what.streamed) _mm_sfence();  // non-temporal stores are weakly ordered: before the caller's unlock
#endif
  return kept;
}

}  // namespace pyfast_buffer
