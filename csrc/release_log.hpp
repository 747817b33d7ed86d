// Ids that left the buffer and why, kept in order until the caller drains them; bounded.
#pragma once

#include <cstdint>
#include <vector>

namespace pyfast_buffer {

/// Why an id left the buffer; the values are the codes of pyfast_buffer.RELEASE_REASONS.
enum class ReleaseReason : int8_t { kRetired = 0, kDroppedStale = 1, kEvicted = 2, kFailed = 3, kExpired = 4 };

/// Records kept by default: room for everything a ring of `capacity` can release twice over, plus slack
/// for failed prompts, so a caller who drains once per take never loses a record.
inline int64_t default_release_bound(int64_t capacity) { return 2 * capacity + 65536; }

/// FIFO of (id, reason) records holding at most `bound`; past it the oldest records are discarded and counted.
class ReleaseLog {
 public:
  /// Builds an empty log that holds at most `bound` (> 0) records.
  explicit ReleaseLog(int64_t bound) : bound_(bound) {}

  /// Appends one record; returns true iff the log was full and discarded its oldest record to make room.
  bool push(int64_t id, ReleaseReason reason) {
    ids_.push_back(id);
    reasons_.push_back(static_cast<int8_t>(reason));
    if (static_cast<int64_t>(ids_.size() - head_) <= bound_) return false;
    ++head_;
    if (head_ * 2 >= ids_.size()) compact();  // amortised O(1) per record
    return true;
  }

  /// Moves every record out, oldest first, into `ids` and `reasons` (replacing their contents); empties the log.
  void drain(std::vector<int64_t>& ids, std::vector<int8_t>& reasons) {
    compact();
    ids.swap(ids_);
    reasons.swap(reasons_);
    ids_.clear();
    reasons_.clear();
  }

  /// Returns the number of records held.
  int64_t size() const { return static_cast<int64_t>(ids_.size() - head_); }

  /// Returns the most records held at once.
  int64_t bound() const { return bound_; }

 private:
  void compact() {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(head_));
    reasons_.erase(reasons_.begin(), reasons_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }

  int64_t bound_;
  size_t head_ = 0;  // records before head_ were discarded and await compaction
  std::vector<int64_t> ids_;
  std::vector<int8_t> reasons_;
};

}  // namespace pyfast_buffer
