// Prompts dispatched to rollout workers and not yet completed or failed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "change_marks.hpp"
#include "flat_id_map.hpp"

namespace pyfast_buffer {

/// The deadline of a prompt dispatched without a lease: never.
constexpr int64_t kNoLease = std::numeric_limits<int64_t>::max();

/// What the buffer remembers of one in-flight prompt.
struct InFlightPrompt {
  int64_t sample_step;
  int64_t dispatch_ns;             // wall clock at dispatch (ns since the epoch), for the record
  int64_t since_ns = 0;            // lease clock at dispatch: expire_in_flight measures from it
  int64_t deadline_ns = kNoLease;  // lease clock at which the lease passes
  int64_t meta = 0xFFFFFFFFll;     // source slot and protected flag for its entries (entry_meta.hpp), no length
};

/// Hash table of in-flight prompts (a FlatIdMap: no node per prompt) plus an ordered count of their steps, so the oldest is O(1), and the
/// leased prompts ordered by deadline, so the earliest is O(1) and prompts without a lease cost nothing.
class InFlightTable {
 public:
  /// Returns true iff `prompt_id` is in flight.
  bool contains(int64_t prompt_id) const { return prompts_.contains(prompt_id); }

  /// Returns the record of `prompt_id`; the caller has checked that it is in flight.
  const InFlightPrompt& at(int64_t prompt_id) const { return *prompts_.find(prompt_id); }

  /// Records `prompt_id` as in flight; the caller has checked that it is not yet.
  void insert(int64_t prompt_id, InFlightPrompt record) {
    prompts_.insert(prompt_id, record);
    changes_.add(prompt_id);
    ++step_counts_[record.sample_step];
    if (record.deadline_ns != kNoLease) leases_.emplace(record.deadline_ns, prompt_id);
  }

  /// Removes `prompt_id`; the caller has checked that it is in flight.
  void erase(int64_t prompt_id) {
    const InFlightPrompt& rec = *prompts_.find(prompt_id);
    auto count = step_counts_.find(rec.sample_step);
    if (--count->second == 0) step_counts_.erase(count);
    if (rec.deadline_ns != kNoLease) leases_.erase({rec.deadline_ns, prompt_id});
    prompts_.erase(prompt_id);
    changes_.add(prompt_id);
  }

  /// Sets the lease deadline of `prompt_id` (kNoLease: none); the caller has checked that it is in flight.
  void set_deadline(int64_t prompt_id, int64_t deadline_ns) {
    InFlightPrompt& rec = *prompts_.find(prompt_id);
    if (rec.deadline_ns != kNoLease) leases_.erase({rec.deadline_ns, prompt_id});
    rec.deadline_ns = deadline_ns;
    changes_.add(prompt_id);
    if (deadline_ns != kNoLease) leases_.emplace(deadline_ns, prompt_id);
  }

  /// Raises the sample_step of every prompt stamped below `step` to `step`; returns how many it raised.
  int64_t raise_steps(int64_t step) {
    int64_t raised = 0;
    for (auto it = step_counts_.begin(); it != step_counts_.end() && it->first < step;) {
      raised += it->second;
      it = step_counts_.erase(it);
    }
    if (raised == 0) return 0;
    step_counts_[step] += raised;
    prompts_.for_each_mutable([&](int64_t id, InFlightPrompt& rec) {
      if (rec.sample_step < step) rec.sample_step = step, changes_.add(id);
    });
    return raised;
  }

  /// Returns the earliest lease deadline, or kNoLease when no in-flight prompt has a lease.
  int64_t earliest_deadline() const { return leases_.empty() ? kNoLease : leases_.begin()->first; }

  /// Returns the prompts whose lease deadline is <= `now_ns`, by deadline then prompt id.
  std::vector<int64_t> due(int64_t now_ns) const {
    std::vector<int64_t> found;
    for (auto it = leases_.begin(); it != leases_.end() && it->first <= now_ns; ++it) found.push_back(it->second);
    return found;
  }

  /// Returns the prompts dispatched at lease-clock time <= `since_ns`, by dispatch time then prompt id.
  std::vector<int64_t> dispatched_by(int64_t since_ns) const {
    std::vector<std::pair<int64_t, int64_t>> found;
    prompts_.for_each([&](int64_t id, const InFlightPrompt& rec) {
      if (rec.since_ns <= since_ns) found.emplace_back(rec.since_ns, id);
    });
    std::sort(found.begin(), found.end());
    std::vector<int64_t> ids;
    ids.reserve(found.size());
    for (const auto& entry : found) ids.push_back(entry.second);
    return ids;
  }

  /// Removes every prompt.
  void clear() {
    prompts_.clear();
    step_counts_.clear();
    leases_.clear();
    changes_.add_all();
  }

  /// Returns the prompts inserted, removed or re-leased since the journal's last export.
  ChangedIds& changes() { return changes_; }

  /// Returns the smallest sample_step in flight, or INT64_MAX when nothing is in flight.
  int64_t oldest_step() const {
    return step_counts_.empty() ? std::numeric_limits<int64_t>::max() : step_counts_.begin()->first;
  }

  /// Returns true iff `pred(sample_step, meta)` holds for some in-flight prompt (one pass over them all).
  template <class Pred>
  bool any_of(Pred pred) const {
    bool found = false;
    prompts_.for_each([&](int64_t, const InFlightPrompt& rec) { found = found || pred(rec.sample_step, rec.meta); });
    return found;
  }

  /// Returns how many prompts are in flight per sample_step, oldest step first.
  const std::map<int64_t, int64_t>& step_counts() const { return step_counts_; }

  /// Returns the number of prompts in flight.
  int64_t size() const { return static_cast<int64_t>(prompts_.size()); }

  /// Returns (prompt_id, sample_step) of every prompt with sample_step <= `step`, oldest first.
  std::vector<std::pair<int64_t, int64_t>> at_or_before(int64_t step) const {
    std::vector<std::pair<int64_t, int64_t>> found;
    prompts_.for_each([&](int64_t id, const InFlightPrompt& rec) {
      if (rec.sample_step <= step) found.emplace_back(id, rec.sample_step);
    });
    std::sort(found.begin(), found.end(),
              [](const auto& a, const auto& b) { return std::tie(a.second, a.first) < std::tie(b.second, b.first); });
    return found;
  }

  /// Returns every in-flight prompt as (prompt_id, record), sorted by prompt id.
  std::vector<std::pair<int64_t, InFlightPrompt>> sorted_items() const {
    std::vector<std::pair<int64_t, InFlightPrompt>> items;
    items.reserve(prompts_.size());
    prompts_.for_each([&](int64_t id, const InFlightPrompt& rec) { items.emplace_back(id, rec); });
    std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return items;
  }

 private:
  FlatIdMap<InFlightPrompt> prompts_;
  std::map<int64_t, int64_t> step_counts_;
  std::set<std::pair<int64_t, int64_t>> leases_;  // (deadline_ns, prompt_id) of leased prompts
  ChangedIds changes_;
};

}  // namespace pyfast_buffer
