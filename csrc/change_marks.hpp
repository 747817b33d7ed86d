// What changed since the last journal export (ray/_journal.py): the entries as a sequence of changed rows and
// kept runs of the previous export; ids whose record changed in a table keyed by id.
#pragma once

#include <algorithm>
#include <cstdint>
#include <unordered_set>
#include <vector>

namespace pyfast_buffer {

/// The ready entries since the last export, in logical (oldest first) positions: the current ring is, run by
/// run, `changed` new or modified rows then the previous export's rows [from, from + len), and after the last
/// run changed rows to the end. Takes and evictions change the front, appends the back (O(1) amortised, no
/// allocation); a compaction or a re-sort rebuilds the runs through an edit (begin_edit, keep, end_edit),
/// O(runs log runs) beyond the pass over the ring the call makes anyway; a load marks every row. Past `run_cap` runs an edit counts the rest of the ring as changed.
/// Off (every row changed) until the first reset(), so a ring that is never exported pays only a branch.
class RingChangeMarks {
 public:
  /// `changed` changed rows, then the previous export's rows [from, from + len) (len > 0).
  struct Run {
    int64_t changed, from, len;
  };

  /// Returns the most runs an edit keeps on a ring of `capacity` entries (bounds the marks' memory).
  static int64_t run_cap(int64_t capacity) { return std::max<int64_t>(64, capacity / 8); }

  /// Starts a new interval over a ring of `size` entries, all unchanged (and turns the marks on).
  void reset(int64_t size) {
    on_ = true, head_ = 0;
    runs_.clear();
    if (size > 0) runs_.push_back(Run{0, 0, size});
  }

  /// Returns true once reset() was called (the ring has been exported once).
  bool on() const { return on_; }

  /// Notes that the oldest `n` rows left the ring.
  void removed_front(int64_t n) {
    while (n > 0 && head_ < runs_.size()) {
      Run& r = runs_[head_];
      const int64_t c = std::min(n, r.changed);
      r.changed -= c, n -= c;
      const int64_t k = std::min(n, r.len);
      r.from += k, r.len -= k, n -= k;
      if (r.len == 0) ++head_;
    }
  }

  /// Notes that the oldest `n` rows changed in place or moved among themselves (a take's survivors).
  void touched_front(int64_t n) {
    int64_t moved = 0;  // rows of whole runs that now count as changed, before the next run
    while (n > 0 && head_ < runs_.size()) {
      Run& r = runs_[head_];
      if (n <= r.changed) break;
      if (n >= r.changed + r.len) {
        n -= r.changed + r.len, moved += r.changed + r.len;
        ++head_;
        continue;
      }
      const int64_t cut = n - r.changed;
      r.from += cut, r.len -= cut, r.changed += cut;
      break;
    }
    if (head_ < runs_.size()) runs_[head_].changed += moved;  // else they are part of the changed tail
  }

  /// Notes that every row changed (a load).
  void all() { head_ = runs_.size(); }

  /// Begins describing the ring after an edit, in order, by keep() calls over the ring as it is now; rows not
  /// kept are gone, and what follows the last kept row counts as changed. At most `max_runs` runs are kept.
  void begin_edit(int64_t max_runs) {
    next_.clear(), starts_.clear();
    int64_t at = 0;
    for (size_t k = head_; k < runs_.size(); ++k) starts_.push_back(at), at += runs_[k].changed + runs_[k].len;
    covered_ = at, pending_ = 0, max_runs_ = static_cast<size_t>(std::max<int64_t>(max_runs, 1));
  }

  /// Notes that rows [first, first + n) of the ring before the edit come next, unchanged (an edit only).
  void keep(int64_t first, int64_t n) {
    while (n > 0) {
      if (first >= covered_) {  // the changed tail
        pending_ += n;
        return;
      }
      const auto next = std::upper_bound(starts_.begin(), starts_.end(), first);  // the run after first's
      const size_t k = static_cast<size_t>(next - starts_.begin()) - 1;
      const Run& r = runs_[head_ + k];
      const int64_t off = first - starts_[k];
      int64_t c;
      if (off < r.changed) {
        c = std::min(n, r.changed - off);
        pending_ += c;
      } else {
        c = std::min(n, r.len - (off - r.changed));
        kept(r.from + off - r.changed, c);
      }
      first += c, n -= c;
    }
  }

  /// Ends an edit: the runs described replace the old ones.
  void end_edit() {
    runs_.swap(next_);
    head_ = 0;
  }

  /// Returns the live runs, oldest first (run_count() of them).
  const Run* runs() const { return runs_.data() + head_; }
  /// Returns the number of live runs.
  int64_t run_count() const { return static_cast<int64_t>(runs_.size() - head_); }

 private:
  // One kept stretch of the previous export, after the changed rows pending: merged into the last run when
  // it continues it, dropped (counted as changed) once max_runs_ runs exist.
  void kept(int64_t from, int64_t n) {
    if (!next_.empty() && pending_ == 0 && next_.back().from + next_.back().len == from) {
      next_.back().len += n;
    } else if (next_.size() < max_runs_) {
      next_.push_back(Run{pending_, from, n});
      pending_ = 0;
    } else {
      pending_ += n;
    }
  }

  bool on_ = false;
  size_t head_ = 0;                       // runs_[head_:] are live; the front's runs are dropped by moving it
  std::vector<Run> runs_, next_;          // the live runs; the runs an edit builds
  std::vector<int64_t> starts_;           // during an edit: where each live run starts in the ring
  int64_t covered_ = 0, pending_ = 0;     // during an edit: rows the live runs span; changed rows not yet placed
  size_t max_runs_ = 0;
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
