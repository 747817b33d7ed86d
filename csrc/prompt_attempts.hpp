// Per-prompt attempt accounting: how often each prompt was dispatched and trained, in bounded memory.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

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
/// Not thread-safe: the ring calls it under its lock.
class PromptAttempts {
 public:
  /// Builds an empty table keeping at most `bound` (> 0) records.
  explicit PromptAttempts(int64_t bound) : bound_(bound) {}
  PromptAttempts(const PromptAttempts&) = delete;  // the recency list points into the map's nodes
  PromptAttempts& operator=(const PromptAttempts&) = delete;

  /// Records a dispatch of `prompt_id` from source slot `slot`; counts a retry when its latest finished
  /// attempt left untrained; returns the number of dispatches since it was last trained, this one included
  /// (1 for a first attempt, and for the first after a training: max_attempts caps regenerations, not epochs).
  int32_t on_dispatch(int64_t prompt_id, int32_t slot) {
    Entry& e = touch(prompt_id, slot);
    AttemptRecord& r = e.rec;
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

  /// Returns what on_dispatch(prompt_id, ...) would return now, changing nothing: the dispatches since
  /// `prompt_id` was last trained, counting one more (1 for a prompt without a record).
  int32_t peek_untrained_run(int64_t prompt_id) const {
    auto it = map_.find(prompt_id);
    if (it == map_.end()) return 1;
    const int32_t run = it->second.rec.since_trained;
    return run < INT32_MAX ? run + 1 : run;
  }

  /// Records that a group of `prompt_id` entered the ring (complete).
  void on_complete(int64_t prompt_id) {
    auto it = map_.find(prompt_id);
    if (it == map_.end()) return;  // forgotten while in flight: nothing to attribute
    ++it->second.rec.pending;
    move_to_back(&it->second);
  }

  /// Records that an in-flight attempt of `prompt_id` failed or expired (it produced nothing).
  void on_failed(int64_t prompt_id) {
    auto it = map_.find(prompt_id);
    if (it != map_.end()) it->second.rec.last_lost = true;
  }

  /// Records that a completed group of `prompt_id` was taken for the first time.
  void on_trained(int64_t prompt_id) {
    auto it = map_.find(prompt_id);
    if (it == map_.end() || it->second.rec.pending == 0) return;
    AttemptRecord& r = it->second.rec;
    const bool was_starved = starved(r);
    --r.pending;
    if (r.trained < INT32_MAX) ++r.trained;
    r.since_trained = 0;
    r.last_lost = false;
    if (was_starved) add_starved(r.slot, -1);
  }

  /// Records that a completed group of `prompt_id` with `trajs` entries left untrained (dropped, evicted).
  void on_lost(int64_t prompt_id, int64_t trajs) {
    auto it = map_.find(prompt_id);
    if (it == map_.end() || it->second.rec.pending == 0) return;
    AttemptRecord& r = it->second.rec;
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
    for (const auto& [id, e] : map_)
      if (e.rec.attempts >= min_attempts && e.rec.trained == 0) out.emplace_back(id, e.rec.attempts);
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
  bool empty() const { return map_.empty() && counters_.forgotten == 0; }

  /// Returns every record, least recently touched first.
  std::vector<AttemptRecord> export_records() const {
    std::vector<AttemptRecord> out;
    out.reserve(map_.size());
    for (const Entry* e = oldest_; e != nullptr; e = e->newer) out.push_back(e->rec);
    return out;
  }

  /// Replaces the table with `records` (least recently touched first; the last `bound` are kept) and the
  /// cumulative counters with `counters` (the starved gauges are recomputed).
  void import_records(const std::vector<AttemptRecord>& records, const AttemptCounters& counters) {
    map_.clear();
    oldest_ = newest_ = nullptr;
    counters_ = counters;
    counters_.starved = 0;
    counters_.starved_by_slot.fill(0);
    const size_t skip = records.size() > static_cast<size_t>(bound_) ? records.size() - bound_ : 0;
    for (size_t i = skip; i < records.size(); ++i) {
      const AttemptRecord& r = records[i];
      auto [it, fresh] = map_.try_emplace(r.prompt_id);
      it->second.rec = r;
      if (fresh)
        link_back(&it->second);
      else
        move_to_back(&it->second);
    }
    for (const auto& [id, e] : map_)
      if (starved(e.rec)) add_starved(e.rec.slot, +1);
  }

  /// Reserves room for min(bound, `records`) records, so a growing table does not rehash on the hot path.
  void reserve(int64_t records) { map_.reserve(static_cast<size_t>(std::min(bound_, records))); }

  /// Returns the bound on kept records.
  int64_t bound() const { return bound_; }

 private:
  // The recency order is a list threaded through the map's own nodes (unordered_map never moves them), so
  // a record costs one allocation, not two.
  struct Entry {
    AttemptRecord rec;
    Entry* older = nullptr;
    Entry* newer = nullptr;
  };
  void link_back(Entry* e) {
    e->older = newest_, e->newer = nullptr;
    (newest_ ? newest_->newer : oldest_) = e;
    newest_ = e;
  }
  void unlink(Entry* e) {
    (e->older ? e->older->newer : oldest_) = e->newer;
    (e->newer ? e->newer->older : newest_) = e->older;
  }
  void move_to_back(Entry* e) {
    if (e == newest_) return;
    unlink(e);
    link_back(e);
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
  Entry& touch(int64_t prompt_id, int32_t slot) {
    auto [it, fresh] = map_.try_emplace(prompt_id);
    Entry* e = &it->second;
    if (!fresh) {
      move_to_back(e);
      return *e;
    }
    e->rec.prompt_id = prompt_id;
    e->rec.slot = slot;
    link_back(e);
    if (static_cast<int64_t>(map_.size()) > bound_) {  // forget the least recently touched
      Entry* old = oldest_;
      if (starved(old->rec)) add_starved(old->rec.slot, -1);
      unlink(old);
      map_.erase(old->rec.prompt_id);
      ++counters_.forgotten;
    }
    return *e;
  }

  int64_t bound_;
  std::unordered_map<int64_t, Entry> map_;
  Entry* oldest_ = nullptr;  // the recency list, least recently touched first
  Entry* newest_ = nullptr;
  AttemptCounters counters_;
};

}  // namespace pyfast_buffer
