// What changed since the last journal export (ray/_journal.py): the entries as a new front, a kept middle
// and a new back; ids whose record changed in a table keyed by id.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_set>
#include <vector>

namespace pyfast_buffer {

/// The ready entries since the last export, in logical (oldest first) positions: the current ring is
/// `front` changed rows, then the previous export's rows [keep_from, keep_from + keep) unchanged, then
/// changed rows to the end. Entries change only at the front (takes, evictions) and the back (appends);
/// anything else (a compaction, a sort, a load) marks everything from its first changed row.
class RingChangeMarks {
 public:
  /// Starts a new interval over a ring of `size` entries, all unchanged.
  void reset(int64_t size) { front_ = 0, keep_from_ = 0, keep_ = size; }

  /// Notes that logical rows [first, last) changed in place or were moved.
  void touched(int64_t first, int64_t last) {
    const int64_t kept_end = front_ + keep_;
    if (last <= front_ || first >= kept_end) return;  // already changed rows, or the back
    if (first <= front_) {
      const int64_t cut = std::min(last, kept_end) - front_;
      keep_from_ += cut, keep_ -= cut, front_ += cut;
    } else {
      keep_ = first - front_;  // one kept run only: rows past `first` count as changed
    }
  }

  /// Notes that the oldest `n` rows left the ring.
  void removed_front(int64_t n) {
    if (n <= front_) {
      front_ -= n;
      return;
    }
    const int64_t cut = std::min(n - front_, keep_);
    keep_from_ += cut, keep_ -= cut, front_ = 0;
  }

  /// Notes that every row changed (a load).
  void all() { front_ = 0, keep_ = 0; }

  /// Returns the number of changed rows before the kept run.
  int64_t front() const { return front_; }
  /// Returns the first row of the kept run in the previous export.
  int64_t keep_from() const { return keep_from_; }
  /// Returns the length of the kept run.
  int64_t keep() const { return keep_; }

 private:
  int64_t front_ = 0, keep_from_ = 0, keep_ = 0;
};

/// The ids whose record changed since the last export, once tracking is on (off, it costs one branch).
class ChangedIds {
 public:
  /// Starts recording (the caller exported the whole table just now).
  void start() { on_ = true, all_ = false, ids_.clear(); }
  /// Returns true once start() was called.
  bool on() const { return on_; }
  /// Notes that `id`'s record changed (inserted, modified or removed).
  void add(int64_t id) {
    if (on_ && !all_) ids_.insert(id);
  }
  /// Notes that `id` no longer counts as changed (its removal is recorded elsewhere).
  void drop(int64_t id) {
    if (on_) ids_.erase(id);
  }
  /// Notes that every record changed (a clear or a load).
  void add_all() { all_ = on_, ids_.clear(); }
  /// Returns true iff every record changed since the last export.
  bool all() const { return all_; }
  /// Returns the changed ids, in no particular order.
  std::vector<int64_t> ids() const { return std::vector<int64_t>(ids_.begin(), ids_.end()); }
  /// Returns the number of changed ids.
  int64_t size() const { return static_cast<int64_t>(ids_.size()); }
  /// Returns true iff `id` is among the changed ids.
  bool contains(int64_t id) const { return ids_.count(id) != 0; }
  /// Begins a new interval with nothing changed.
  void clear() { all_ = false, ids_.clear(); }

 private:
  bool on_ = false, all_ = false;
  std::unordered_set<int64_t> ids_;
};

}  // namespace pyfast_buffer
