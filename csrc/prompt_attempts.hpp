// Per-prompt attempt accounting: how often each prompt was dispatched and trained, in bounded memory.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "change_marks.hpp"
#include "flat_id_map.hpp"

namespace pyfast_buffer {

/// Largest source tag accepted (tags are small ints: a dataset or task family).
constexpr int64_t kMaxSource = 63;

/// Source slots: slot 0 holds untagged prompts and trajectories, slot s + 1 holds source s.
constexpr int kSourceSlots = static_cast<int>(kMaxSource) + 2;

/// Default number of prompt records PromptAttempts keeps for a ring of `capacity` entries.
inline int64_t default_attempts_bound(int64_t capacity) { return std::max<int64_t>(2 * capacity, int64_t{1} << 16); }

/// Cumulative attempt counters (the `starved` ones are gauges over the records kept now).
struct AttemptCounters {
  int64_t retries = 0;          // dispatches of a prompt whose previous attempt left untrained
  int64_t prompts_retried = 0;  // prompts retried at least once (each counted once while its record is kept)
  int64_t regenerations = 0;    // trajectories of lost attempts whose prompt was dispatched again
  int64_t protected_groups = 0;  // groups completed from a protected (max_attempts) attempt
  int64_t forgotten = 0;        // records dropped because the table was at its bound
  int64_t starved = 0;          // kept prompts with >= 2 attempts and nothing trained
  std::array<int64_t, kSourceSlots> starved_by_slot{};  // `starved`, split by source slot
};

/// One prompt's record, as exported (oldest touched first) and imported.
struct AttemptRecord {
  int64_t prompt_id = 0;
  int32_t attempts = 0;    // dispatches seen
  int32_t trained = 0;     // groups of it taken at least once
  int32_t pending = 0;     // groups of it completed and not yet taken, dropped or evicted
  int32_t slot = 0;        // source slot of its latest dispatch
  int32_t since_trained = 0;  // dispatches since a group of it was last trained (max_attempts counts these)
  int64_t lost_trajs = 0;  // trajectories of its attempts lost since its latest dispatch
  bool last_lost = false;  // its latest finished attempt left untrained
  bool retried = false;    // counted in prompts_retried
};

/// Records per prompt id, least recently touched first; past `bound` records the least recently touched
/// is forgotten (counted in AttemptCounters::forgotten): a forgotten prompt starts again at attempt 1.
/// Storage is flat: the records sit in one array (a slab, never more than `bound` long) threaded by an
/// index-linked recency list, and a FlatIdMap (open addressing, backward-shift deletion) maps a prompt id
/// to its position in the slab. A record leaves only when the
/// table is at its bound and a new prompt arrives, and the newcomer takes the leaver's slab slot, so the
/// table allocates only while it grows towards the bound. Not thread-safe: the ring calls it under its lock.
class PromptAttempts {
 public:
  /// Builds an empty table keeping at most `bound` (> 0) records.
  explicit PromptAttempts(int64_t bound) : bound_(bound) {}

  /// Records a dispatch of `prompt_id` from source slot `slot`; counts a retry when its latest finished
  /// attempt left untrained; returns the number of dispatches since it was last trained, this one included
  /// (1 for a first attempt, and for the first after a training: max_attempts caps regenerations, not epochs).
  int32_t on_dispatch(int64_t prompt_id, int32_t slot) {
    AttemptRecord& r = touch(prompt_id, slot);
    if (r.attempts > 0 && r.last_lost) {
      ++counters_.retries;
      counters_.regenerations += r.lost_trajs;
      if (!r.retried) r.retried = true, ++counters_.prompts_retried;
    }
    const bool was_starved = starved(r);
    if (r.slot != slot && was_starved) move_starved(r.slot, slot);
    r.slot = slot;
    r.lost_trajs = 0;
    r.last_lost = false;
    if (r.attempts < INT32_MAX) ++r.attempts;
    if (r.since_trained < INT32_MAX) ++r.since_trained;
    if (!was_starved && starved(r)) add_starved(r.slot, +1);
    return r.since_trained;
  }

  /// Returns what on_dispatch(`prompt_id`, any slot) would return now, changing nothing: the number of
  /// dispatches since the prompt was last trained, counting that dispatch (1 for a prompt not kept).
  int32_t peek_untrained_run(int64_t prompt_id) const {
    const int64_t at = find(prompt_id);
    if (at < 0) return 1;
    const int32_t run = nodes_[static_cast<size_t>(at)].rec.since_trained;
    return run < INT32_MAX ? run + 1 : run;
  }

  /// Records that a group of `prompt_id` entered the ring (complete).
  void on_complete(int64_t prompt_id) {
    const int64_t at = find(prompt_id);
    if (at < 0) return;  // forgotten while in flight: nothing to attribute
    ++nodes_[static_cast<size_t>(at)].rec.pending;
    move_to_back(at);
    moved_.add(prompt_id);
  }

  /// Records that an in-flight attempt of `prompt_id` failed or expired (it produced nothing).
  void on_failed(int64_t prompt_id) {
    const int64_t at = find(prompt_id);
    if (at >= 0) nodes_[static_cast<size_t>(at)].rec.last_lost = true, updated_.add(prompt_id);
  }

  /// Records that a completed group of `prompt_id` was taken for the first time.
  void on_trained(int64_t prompt_id) {
    const int64_t at = find(prompt_id);
    if (at < 0 || nodes_[static_cast<size_t>(at)].rec.pending == 0) return;
    AttemptRecord& r = nodes_[static_cast<size_t>(at)].rec;
    updated_.add(prompt_id);
    const bool was_starved = starved(r);
    --r.pending;
    if (r.trained < INT32_MAX) ++r.trained;
    r.since_trained = 0;
    r.last_lost = false;
    if (was_starved) add_starved(r.slot, -1);
  }

  /// Records that a completed group of `prompt_id` with `trajs` entries left untrained (dropped, evicted).
  void on_lost(int64_t prompt_id, int64_t trajs) {
    const int64_t at = find(prompt_id);
    if (at < 0 || nodes_[static_cast<size_t>(at)].rec.pending == 0) return;
    AttemptRecord& r = nodes_[static_cast<size_t>(at)].rec;
    updated_.add(prompt_id);
    --r.pending;
    r.last_lost = true;
    r.lost_trajs += trajs;
  }

  /// Counts one group completed from a protected attempt.
  void count_protected() { ++counters_.protected_groups; }

  /// Returns (prompt_id, attempts) of every kept prompt with >= `min_attempts` attempts and nothing
  /// trained, by prompt id.
  std::vector<std::pair<int64_t, int64_t>> starved_prompts(int64_t min_attempts) const {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const Node& n : nodes_)  // every slab slot holds a kept record
      if (n.rec.attempts >= min_attempts && n.rec.trained == 0) out.emplace_back(n.rec.prompt_id, n.rec.attempts);
    std::sort(out.begin(), out.end());
    return out;
  }

  /// Returns the counters.
  const AttemptCounters& counters() const { return counters_; }

  /// Returns retries, prompts_retried, regenerations, protected_groups, starved and forgotten, in that order.
  std::array<int64_t, 6> totals() const {
    const AttemptCounters& c = counters_;
    return {c.retries, c.prompts_retried, c.regenerations, c.protected_groups, c.starved, c.forgotten};
  }

  /// Returns true iff no prompt was ever recorded.
  bool empty() const { return nodes_.empty() && counters_.forgotten == 0; }

  /// Returns every record, least recently touched first.
  std::vector<AttemptRecord> export_records() const {
    std::vector<AttemptRecord> out;
    out.reserve(nodes_.size());
    for (int64_t at = oldest_; at >= 0; at = nodes_[static_cast<size_t>(at)].newer)
      out.push_back(nodes_[static_cast<size_t>(at)].rec);
    return out;
  }

  /// Replaces the table with `records` (least recently touched first; the last `bound` are kept) and the
  /// cumulative counters with `counters` (the starved gauges are recomputed).
  void import_records(const std::vector<AttemptRecord>& records, const AttemptCounters& counters) {
    nodes_.clear();
    index_.clear();
    oldest_ = newest_ = -1;
    counters_ = counters;
    counters_.starved = 0;
    counters_.starved_by_slot.fill(0);
    const size_t skip = records.size() > static_cast<size_t>(bound_) ? records.size() - bound_ : 0;
    for (size_t i = skip; i < records.size(); ++i) {
      const AttemptRecord& r = records[i];
      int64_t at = find(r.prompt_id);
      if (at >= 0) {  // a repeated id (an edited state): the later record wins, as the latest touch
        move_to_back(at);
      } else {
        at = append_node(r.prompt_id);
        link_back(at);
      }
      nodes_[static_cast<size_t>(at)].rec = r;
    }
    for (const Node& n : nodes_)
      if (starved(n.rec)) add_starved(n.rec.slot, +1);
    moved_.add_all();
  }

  /// What changed since the journal's last export (the first call starts tracking and says `all`).
  struct Changes {
    bool all = false;                    // every record: `moved` holds the whole table, oldest first
    std::vector<AttemptRecord> moved;    // the records touched (moved to the back), oldest first: the table's tail
    std::vector<AttemptRecord> updated;  // other records changed in place
    std::vector<int64_t> gone;           // prompts whose record was dropped at the bound
  };

  /// Makes the next take_changes() return the whole table.
  void mark_all() { moved_.add_all(); }

  /// Returns the changes since the last call and begins a new interval.
  Changes take_changes() {
    Changes out;
    if (!moved_.on() || moved_.all()) {
      out.all = true;
      out.moved = export_records();
      moved_.start(), updated_.start(), gone_.start();
      return out;
    }
    std::vector<AttemptRecord> tail;
    for (int64_t at = newest_; at >= 0 && static_cast<int64_t>(tail.size()) < moved_.size();
         at = nodes_[static_cast<size_t>(at)].older)
      tail.push_back(nodes_[static_cast<size_t>(at)].rec);
    out.moved.assign(tail.rbegin(), tail.rend());
    for (int64_t id : updated_.ids()) {
      const int64_t at = find(id);
      if (at >= 0 && !moved_.contains(id)) out.updated.push_back(nodes_[static_cast<size_t>(at)].rec);
    }
    out.gone = gone_.ids();
    moved_.clear(), updated_.clear(), gone_.clear();
    return out;
  }

  /// Reserves room for min(bound, `records`) records, so a growing table does not reallocate on the hot path.
  void reserve(int64_t records) {
    const int64_t n = std::min(bound_, records);
    nodes_.reserve(static_cast<size_t>(n));
    index_.reserve(static_cast<size_t>(n));
  }

  /// Returns the bound on kept records.
  int64_t bound() const { return bound_; }

 private:
  struct Node {
    AttemptRecord rec;
    int64_t older = -1;  // slab positions in the recency list; -1 at either end
    int64_t newer = -1;
  };
  int64_t find(int64_t key) const {
    const int64_t* at = index_.find(key);
    return at ? *at : -1;
  }
  int64_t append_node(int64_t key) {
    const int64_t at = static_cast<int64_t>(nodes_.size());
    nodes_.emplace_back();
    index_.insert(key, at);
    return at;
  }
  Node& node(int64_t at) { return nodes_[static_cast<size_t>(at)]; }
  void link_back(int64_t at) {
    node(at).older = newest_, node(at).newer = -1;
    (newest_ >= 0 ? node(newest_).newer : oldest_) = at;
    newest_ = at;
  }
  void unlink(int64_t at) {
    const int64_t older = node(at).older, newer = node(at).newer;
    (older >= 0 ? node(older).newer : oldest_) = newer;
    (newer >= 0 ? node(newer).older : newest_) = older;
  }
  void move_to_back(int64_t at) {
    if (at == newest_) return;
    unlink(at);
    link_back(at);
  }
  static bool starved(const AttemptRecord& r) { return r.attempts >= 2 && r.trained == 0; }
  void add_starved(int32_t slot, int64_t delta) {
    counters_.starved += delta;
    counters_.starved_by_slot[static_cast<size_t>(slot)] += delta;
  }
  void move_starved(int32_t from, int32_t to) {
    counters_.starved_by_slot[static_cast<size_t>(from)] -= 1;
    counters_.starved_by_slot[static_cast<size_t>(to)] += 1;
  }
  AttemptRecord& touch(int64_t prompt_id, int32_t slot) {
    moved_.add(prompt_id);
    int64_t at = find(prompt_id);
    if (at >= 0) {
      move_to_back(at);
      return node(at).rec;
    }
    if (static_cast<int64_t>(nodes_.size()) >= bound_) {
      // At the bound: forget the least recently touched, and the newcomer takes its slab slot.
      at = oldest_;
      const AttemptRecord& old = node(at).rec;
      if (starved(old)) add_starved(old.slot, -1);
      unlink(at);
      moved_.drop(old.prompt_id), updated_.drop(old.prompt_id), gone_.add(old.prompt_id);
      index_.erase(old.prompt_id);
      index_.insert(prompt_id, at);
      ++counters_.forgotten;
    } else {
      at = append_node(prompt_id);
    }
    AttemptRecord& r = node(at).rec;
    r = AttemptRecord{};
    r.prompt_id = prompt_id;
    r.slot = slot;
    link_back(at);
    return r;
  }

  int64_t bound_;
  std::vector<Node> nodes_;   // the slab: every element a kept record
  FlatIdMap<int64_t> index_;  // prompt id -> its position in the slab
  int64_t oldest_ = -1;       // the recency list, least recently touched first
  int64_t newest_ = -1;
  ChangedIds moved_, updated_, gone_;  // since the journal's last export (take_changes)
  AttemptCounters counters_;
};

}  // namespace pyfast_buffer
