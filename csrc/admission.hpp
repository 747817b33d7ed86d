// Admission control for strategy="pace": how many prompt groups may start now, and whether a take must
// wait for an in-flight prompt. The rule and its proof are in docs/design.md ("pace: the admission rule").
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>

namespace pyfast_buffer {

/// Prompt groups per age stamp (the step an age is measured from): the ready groups of a paced ring.
using StepCounts = std::map<int64_t, int64_t>;

/// The two pace parameters, validated by the ring's constructor.
struct PaceParams {
  int64_t prompts_per_step = 0;  // P: prompt groups one training step consumes (>= 1)
  int64_t lookahead = 0;         // steps generation may run ahead of training (0 <= lookahead <= max_age)
};

/// Ready prompt groups of a paced ring counted by age stamp, kept in step with the ring's entries.
class ReadyGroups {
 public:
  /// Counts `groups` more ready groups stamped `stamp`.
  void add(int64_t stamp, int64_t groups = 1) {
    by_step_[stamp] += groups;
    total_ += groups;
  }

  /// Counts `groups` fewer ready groups stamped `stamp`; the caller added them before.
  void remove(int64_t stamp, int64_t groups = 1) {
    auto it = by_step_.find(stamp);
    if ((it->second -= groups) == 0) by_step_.erase(it);
    total_ -= groups;
  }

  /// Forgets every group.
  void clear() {
    by_step_.clear();
    total_ = 0;
  }

  /// Returns the ready groups per stamp, oldest stamp first.
  const StepCounts& by_step() const { return by_step_; }

  /// Returns the number of ready groups.
  int64_t total() const { return total_; }

 private:
  StepCounts by_step_;
  int64_t total_ = 0;
};

namespace admission_detail {
/// Signed 128-bit arithmetic: (step + max_age + 1) * prompts_per_step can pass 2**63.
__extension__ typedef __int128 Wide;

/// Returns the slots a trainer taking `per_step` groups at steps next_take, next_take + 1, ... has before the
/// group stamped `stamp` passes max_age: (stamp + max_age - next_take + 1) * per_step, possibly <= 0.
inline Wide slots_until_due(int64_t stamp, int64_t max_age, int64_t next_take, int64_t per_step) {
  return (static_cast<Wide>(stamp) + max_age - next_take + 1) * per_step;
}

/// Calls visit(stamp, outstanding groups stamped <= stamp) for every stamp of either map, in increasing order.
template <class Visit>
void for_each_prefix(const StepCounts& in_flight, const StepCounts& ready, Visit visit) {
  auto a = in_flight.begin(), b = ready.begin();
  int64_t running = 0;
  while (a != in_flight.end() || b != ready.end()) {
    const int64_t stamp = b == ready.end() || (a != in_flight.end() && a->first < b->first) ? a->first : b->first;
    if (a != in_flight.end() && a->first == stamp) running += (a++)->second;
    if (b != ready.end() && b->first == stamp) running += (b++)->second;
    if (!visit(stamp, running)) return;
  }
}
}  // namespace admission_detail

/// Returns how many prompts stamped `step` may be dispatched now without breaking the pace rule: the
/// outstanding groups (in flight plus ready) stay within (lookahead + 1) * prompts_per_step, and for every stamp
/// y >= step the groups stamped <= y fit the slots the trainer has before they pass max_age (docs/design.md).
/// `next_take` is the step of the trainer's next take. O(stamps outstanding), independent of the prompts asked for.
inline int64_t admissible_prompts(const StepCounts& in_flight, int64_t in_flight_total, const ReadyGroups& ready,
                                  int64_t step, int64_t next_take, int64_t max_age, const PaceParams& pace) {
  using admission_detail::Wide;
  const Wide limit = (static_cast<Wide>(pace.lookahead) + 1) * pace.prompts_per_step;
  Wide room = limit - in_flight_total - ready.total();
  // Adding prompts stamped `step` raises the prefix count of every stamp y >= step by the same amount, so the
  // tightest deadline constraint is at y == step or at an outstanding stamp above it.
  int64_t at_step = 0;
  admission_detail::for_each_prefix(in_flight, ready.by_step(), [&](int64_t stamp, int64_t prefix) {
    if (stamp <= step) {
      at_step = prefix;
      return true;
    }
    room = std::min(room, admission_detail::slots_until_due(stamp, max_age, next_take, pace.prompts_per_step) - prefix);
    return room > 0;
  });
  room = std::min(room, admission_detail::slots_until_due(step, max_age, next_take, pace.prompts_per_step) - at_step);
  if (room <= 0) return 0;
  return room > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(room);
}

/// Returns true iff `added_total` more groups, counted per stamp in `added`, keep the pace rule that
/// admissible_prompts checks for one stamp (put adds groups of several stamps in one call).
inline bool admits(const StepCounts& in_flight, int64_t in_flight_total, const ReadyGroups& ready,
                   const StepCounts& added, int64_t added_total, int64_t next_take, int64_t max_age,
                   const PaceParams& pace) {
  using admission_detail::Wide;
  if (added.empty()) return true;
  const Wide limit = (static_cast<Wide>(pace.lookahead) + 1) * pace.prompts_per_step;
  if (static_cast<Wide>(in_flight_total) + ready.total() + added_total > limit) return false;
  StepCounts outstanding = in_flight;
  for (const auto& [stamp, groups] : ready.by_step()) outstanding[stamp] += groups;
  const int64_t first_added = added.begin()->first;
  bool fits = true;
  // Each stamp y >= the oldest added one: the old and the added groups stamped <= y fit y's slots.
  admission_detail::for_each_prefix(outstanding, added, [&](int64_t stamp, int64_t prefix) {
    if (stamp < first_added) return true;
    fits = prefix <= admission_detail::slots_until_due(stamp, max_age, next_take, pace.prompts_per_step);
    return fits;
  });
  return fits;
}

/// Returns the smallest stamp of an in-flight prompt that a take at `current_step` of the `taken_groups` oldest
/// ready groups would leave unable to be trained by the time it reaches max_age (with prompts_per_step groups per
/// later step, oldest first), or nullopt when the take may proceed. Under this rule a prompt stamped
/// current_step - max_age always blocks, as under strategy="wait".
inline std::optional<int64_t> pace_blocker(const StepCounts& in_flight, int64_t in_flight_total,
                                           const ReadyGroups& ready, int64_t taken_groups, int64_t current_step,
                                           int64_t max_age, int64_t prompts_per_step) {
  using admission_detail::Wide;
  if (in_flight.empty()) return std::nullopt;
  const int64_t left = in_flight_total + ready.total() - taken_groups;  // outstanding after the take
  int64_t in_flight_prefix = 0, ready_prefix = 0;
  auto a = in_flight.begin();
  auto b = ready.by_step().begin();
  for (; a != in_flight.end(); ++a) {
    for (; b != ready.by_step().end() && b->first <= a->first; ++b) ready_prefix += b->second;
    in_flight_prefix += a->second;
    // After the take, one step later: the slots before stamp a->first passes max_age.
    const Wide slots =
        admission_detail::slots_until_due(a->first, max_age, current_step, prompts_per_step) - prompts_per_step;
    const int64_t behind = in_flight_prefix + std::max<int64_t>(ready_prefix - taken_groups, 0);
    if (behind > slots) return a->first;
    if (slots >= left) break;  // every later stamp has at least as many slots as there are groups left
  }
  return std::nullopt;
}

}  // namespace pyfast_buffer
