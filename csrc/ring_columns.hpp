// Columnar storage of ring entries: owned aligned memory or borrowed (pinned) buffers.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pyfast_buffer {

/// Raw pointers to the nine columns of `capacity` entries each.
struct ColumnPointers {
  int64_t* traj_id = nullptr;
  int64_t* group_id = nullptr;
  int64_t* sample_step = nullptr;
  int64_t* finish_step = nullptr;  // step of the weights in force when the trajectory finished (policy_version
                                   // is derived at take from sample_step, so it needs no column)
  int64_t* dispatch_ns = nullptr;
  int64_t* complete_ns = nullptr;
  int64_t* meta = nullptr;       // length, source slot and flags (entry_meta.hpp)
  int32_t* uses = nullptr;
  int32_t* group_len = nullptr;  // size of the entry's group; groups are contiguous in the ring

  /// Returns true iff every column pointer is set.
  bool complete() const {
    return traj_id && group_id && sample_step && finish_step && dispatch_ns && complete_ns && meta &&
           uses && group_len;
  }
};

/// Bytes one entry occupies across all columns.
constexpr int64_t kBytesPerEntry = 7 * sizeof(int64_t) + 2 * sizeof(int32_t);

/// Owns or borrows the column memory for a ring of fixed capacity; allocated once, never resized.
class RingColumns {
 public:
  /// Allocates 64-byte aligned columns for `capacity` entries and touches every page once, so the
  /// first lap through the ring costs what later laps cost; throws std::bad_alloc on failure.
  explicit RingColumns(int64_t capacity) {
    const int64_t wide = round_up(capacity * 8), narrow = round_up(capacity * 4);
    const int64_t bytes = 7 * wide + 2 * narrow;
    // Rings of 2 MiB or more sit on 2 MiB boundaries and ask for transparent huge pages: pre-touching
    // them then takes a few hundred page faults instead of one per 4 KiB (a hint; ignored if refused).
    const size_t align = bytes >= kHugePage ? kHugePage : kAlign;
    void* block = std::aligned_alloc(align, static_cast<size_t>((bytes + align - 1) / align * align));
    if (block == nullptr) throw std::bad_alloc();
    owned_.reset(static_cast<char*>(block));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == kHugePage) madvise(block, static_cast<size_t>(bytes), MADV_HUGEPAGE);
#endif
    // The pre-touch: one write per 4 KiB page faults the memory in here, not on the first lap; the
    // kernel hands out zeroed pages, so writing every byte again would only double the cost.
    volatile char* page = static_cast<char*>(block);
    for (int64_t at = 0; at < bytes; at += kPage) page[at] = 0;
    char* at = owned_.get();
    int64_t** wide_cols[] = {&cols_.traj_id,        &cols_.group_id,    &cols_.sample_step,
                             &cols_.finish_step, &cols_.dispatch_ns, &cols_.complete_ns,
                             &cols_.meta};
    for (int64_t** col : wide_cols) *col = reinterpret_cast<int64_t*>(at), at += wide;
    cols_.uses = reinterpret_cast<int32_t*>(at), at += narrow;
    cols_.group_len = reinterpret_cast<int32_t*>(at);
  }

  /// Borrows caller-owned columns; the caller keeps them alive for this object's lifetime.
  explicit RingColumns(const ColumnPointers& borrowed) : cols_(borrowed) {}

  /// Returns the column pointers (owned or borrowed).
  const ColumnPointers& get() const { return cols_; }

  /// Returns true iff the columns were borrowed from the caller.
  bool borrowed() const { return owned_ == nullptr; }

 private:
  static constexpr int64_t kAlign = 64;
  static constexpr int64_t kHugePage = int64_t{2} << 20;
  static constexpr int64_t kPage = 4096;
  static int64_t round_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, FreeDeleter> owned_;
  ColumnPointers cols_;
};

}  // namespace pyfast_buffer
