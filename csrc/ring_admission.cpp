// StalenessRing: strategy="pace": admission at dispatch and put, the take gate, the stamp order.
// The rule and its proof are in docs/design.md ("pace"); the arithmetic is admission.hpp's.
#include "ring_detail.hpp"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace pyfast_buffer {

int64_t StalenessRing::pace_room(int64_t step) const {
  return admissible_prompts(in_flight_.step_counts(), in_flight_.size(), ready_groups_, step, pace_next_take(),
                            max_age_, {config_.prompts_per_step, config_.lookahead});
}

bool StalenessRing::pace_admits(const StepCounts& groups, int64_t total) const {
  // One stamp (every dispatch): the admissible count decides without building the merged counts.
  if (groups.size() == 1) return pace_room(groups.begin()->first) >= total;
  return admits(in_flight_.step_counts(), in_flight_.size(), ready_groups_, groups, total, pace_next_take(), max_age_,
                {config_.prompts_per_step, config_.lookahead});
}

int64_t StalenessRing::admissible(int64_t step) {
  if (!paced())
    throw InvalidArgument(concat("admissible(): only strategy='pace' admits prompts; this buffer's strategy is '",
                                 strategy_name(config_.strategy), "', which starts every dispatch at once"));
  if (step < 0) throw InvalidArgument(concat("step=", step, " is negative; steps are ints >= 0"));
  MutexLock lock(mutex_);
  expire_due();
  return pace_room(step);
}

void StalenessRing::check_pace_call_size(int64_t groups, const char* call) const {
  const Int128 limit = (static_cast<Int128>(config_.lookahead) + 1) * config_.prompts_per_step;
  if (groups > limit)
    throw InvalidArgument(concat(call == std::string("put") ? "traj_ids: " : "prompt_ids: ", groups,
                                 call == std::string("put") ? " groups" : " prompts", " exceed the admission limit ",
                                 static_cast<int64_t>(limit), " = (lookahead + 1) * prompts_per_step; ", call,
                                 " at most ", static_cast<int64_t>(limit), " per call"));
}

std::string StalenessRing::admission_message(const StepCounts& groups, int64_t total, int64_t first_step) const {
  const Int128 limit = (static_cast<Int128>(config_.lookahead) + 1) * config_.prompts_per_step;
  const int64_t outstanding = in_flight_.size() + ready_groups_.total();
  const int64_t room = pace_room(first_step);
  std::ostringstream out;
  out << total << (groups.size() > 1 ? " groups" : " prompts") << " at step " << first_step
      << " do not fit strategy='pace': limit (lookahead + 1) * prompts_per_step = "
      << static_cast<long long>(std::min<Int128>(limit, INT64_MAX)) << " prompt groups, "
      << outstanding << " outstanding (" << in_flight_.size() << " in flight, " << ready_groups_.total()
      << " ready), " << room << " admissible now";
  if (room < limit - outstanding)
    out << "; prompts stamped " << first_step << " must be trained by step "
        << static_cast<long long>(std::min<Int128>(static_cast<Int128>(first_step) + max_age_, INT64_MAX))
        << " and the trainer's next take is at step " << pace_next_take() << ", so fewer slots remain for them";
  out << "; take (train) to free slots, fail stuck prompts, dispatch with newer weights, or raise lookahead";
  return out.str();
}

namespace {
// Counts one call among the waiters of its kind while it waits; a protected waiter leaving (admitted, timed out,
// interrupted, closed) wakes the others, which may have been held behind it. Runs with the ring's lock held.
class WaitingCall {
 public:
  WaitingCall(int64_t& waiting, MonotonicCondition& cv, bool wake_on_leave)
      : waiting_(++waiting), cv_(cv), wake_on_leave_(wake_on_leave) {}
  WaitingCall(const WaitingCall&) = delete;
  WaitingCall& operator=(const WaitingCall&) = delete;
  ~WaitingCall() {
    --waiting_;
    if (wake_on_leave_) cv_.notify_all();
  }

 private:
  int64_t& waiting_;
  MonotonicCondition& cv_;
  bool wake_on_leave_;
};
}  // namespace

bool StalenessRing::holds_protected_attempt(const int64_t* prompt_ids, int64_t n) const {
  if (config_.max_attempts <= 0) return false;
  for (int64_t i = 0; i < n; ++i)
    if (attempts_.peek_untrained_run(prompt_ids[i]) >= config_.max_attempts) return true;
  return false;
}

std::string StalenessRing::protected_waiting_message() const {
  return concat(protected_waiting_, " protected (max_attempts) dispatch call(s) waiting for admission go first");
}

bool StalenessRing::wait_for_admission(const StepCounts& groups, int64_t total, int64_t first_step,
                                       bool protected_call, std::optional<double> timeout, const char* call,
                                       std::optional<SteadyTime>& deadline, bool& waited) {
  // Protected attempts first: while a protected call waits, no other call is admitted (docs/design.md).
  if ((protected_call || protected_waiting_ == 0) && pace_admits(groups, total)) return true;
  if (first_step < pace_next_take() - max_age_) {  // past its deadline already: no take can make room for it
    ledger_.admission_refused += total;
    throw AdmissionFull(concat(call, ": prompts stamped ", first_step, " would pass max_age=", max_age_,
                               " before the trainer's next take at step ", pace_next_take(),
                               ", so no wait can admit them; dispatch with newer weights (step >= ",
                               pace_next_take() - max_age_, ")"));
  }
  if (is_probe(timeout))
    throw WouldBlock(concat(call, " waits for admission under pace: ", admission_message(groups, total, first_step)));
  if (!timeout) {
    ledger_.admission_refused += total;
    if (!protected_call && protected_waiting_ > 0)
      throw AdmissionFull(concat(call, ": ", total, call == std::string("put") ? " groups" : " prompts",
                                 " not admitted under pace: ",
                                 protected_waiting_message(), " (a prompt at its max_attempts-th untrained attempt "
                                 "is admitted before any other); pass timeout= to wait behind it, or take (train) "
                                 "to free slots"));
    throw AdmissionFull(concat(call, ": ", admission_message(groups, total, first_step),
                               "; or pass timeout= to wait for a slot"));
  }
  if (!deadline) deadline = deadline_after(*timeout);  // one deadline for every wait of the call
  waited = true;
  const WaitingCall waiting(protected_call ? protected_waiting_ : unprotected_waiting_, admit_cv_, protected_call);
  SteadyTime last_check = SteadyClock::now();
  for (;;) {
    admit_cv_.wait_until(mutex_, next_wake(*deadline));
    check_interrupt(last_check);
    check_open();
    expire_due();
    if ((protected_call || protected_waiting_ == 0) && pace_admits(groups, total))
      return false;  // admitted after waiting: the caller re-validates its arguments
    if (SteadyClock::now() >= *deadline) break;
  }
  ledger_.admission_refused += total;
  ++ledger_.admission_waits;
  if (!protected_call && protected_waiting_ > 0 && pace_admits(groups, total))
    throw Timeout(concat(call, " timed out after ", *timeout, " s waiting for admission under pace behind a "
                         "protected dispatch: ", protected_waiting_message(), "; take (train) to free slots for "
                         "them, or wait longer"));
  throw Timeout(concat(call, " timed out after ", *timeout, " s waiting for admission under pace",
                       !protected_call && protected_waiting_ > 0 ? " (behind a protected dispatch too)" : "", ": ",
                       admission_message(groups, total, first_step)));
}

bool StalenessRing::begin_admission_wait(const int64_t* prompt_ids, int64_t n) {
  MutexLock lock(mutex_);
  const bool protected_call = n > 0 && holds_protected_attempt(prompt_ids, n);
  ++(protected_call ? protected_waiting_ : unprotected_waiting_);
  return protected_call;
}

void StalenessRing::end_admission_wait(bool protected_call) {
  MutexLock lock(mutex_);
  int64_t& waiting = protected_call ? protected_waiting_ : unprotected_waiting_;
  if (waiting > 0) --waiting;
  if (protected_call) admit_cv_.notify_all();  // the calls held behind it may go now
}

void StalenessRing::pace_restore_order() {
  if (sorted_) return;
  // Entries out of stamp order arrived (a slow prompt finished after newer ones): a stable sort by age stamp
  // restores oldest first and keeps every group contiguous (its members share a stamp). O(ready), which
  // admission bounds by (lookahead + 1) * prompts_per_step groups.
  const ColumnPointers c = columns_.get();
  const int64_t* ages = age_steps();
  std::vector<int64_t> rows(static_cast<size_t>(size_));  // physical rows in ring order, then in stamp order
  for (int64_t i = 0; i < size_; ++i) rows[i] = phys(i);
  std::stable_sort(rows.begin(), rows.end(), [ages](int64_t a, int64_t b) { return ages[a] < ages[b]; });
  if (marks_.on()) {  // the journal's marks: the new order as runs of rows that stay neighbours
    marks_.begin_edit(RingChangeMarks::run_cap(config_.capacity));
    int64_t first = 0, len = 0;
    for (int64_t i = 0; i < size_; ++i) {
      const int64_t at = rows[i] >= head_ ? rows[i] - head_ : rows[i] + config_.capacity - head_;  // its old place
      if (len > 0 && at == first + len) {
        ++len;
        continue;
      }
      if (len > 0) marks_.keep(first, len);
      first = at, len = 1;
    }
    if (len > 0) marks_.keep(first, len);
    marks_.end_edit();
  }
  std::vector<int64_t> wide(static_cast<size_t>(size_));
  for (int64_t* col :
       {c.traj_id, c.group_id, c.sample_step, c.finish_step, c.dispatch_ns, c.complete_ns, c.meta}) {
    for (int64_t i = 0; i < size_; ++i) wide[i] = col[rows[i]];
    for (int64_t i = 0; i < size_; ++i) col[phys(i)] = wide[i];
  }
  std::vector<int32_t> narrow(static_cast<size_t>(size_));
  for (int32_t* col : {c.uses, c.group_len}) {
    for (int64_t i = 0; i < size_; ++i) narrow[i] = col[rows[i]];
    for (int64_t i = 0; i < size_; ++i) col[phys(i)] = narrow[i];
  }
  sorted_ = true;
  expiry_valid_ = false;  // rows moved: the next per-entry walk rebuilds the stale-before column
}

void StalenessRing::pace_count_ready() {
  ready_groups_.clear();
  const int32_t* group_len = columns_.get().group_len;
  const int64_t* ages = age_steps();
  for (int64_t i = 0; i < size_; i += group_len[phys(i)]) ready_groups_.add(ages[phys(i)]);
}

void StalenessRing::pace_forget_prefix(int64_t count) {
  const int32_t* group_len = columns_.get().group_len;
  const int64_t* ages = age_steps();
  for (int64_t i = 0; i < count; i += group_len[phys(i)]) ready_groups_.remove(ages[phys(i)]);
}

void StalenessRing::pace_forget_retired(int64_t walked) {
  // The walked prefix of a paced take holds only taken groups (nothing is dropped), and under pace every
  // taken group leaves (commit_take: one use per group, whatever max_uses).
  const ColumnPointers& c = columns_.get();
  const int64_t* ages = age_steps();
  for (int64_t i = 0; i < walked; i += c.group_len[phys(i)]) ready_groups_.remove(ages[phys(i)]);
}

std::optional<int64_t> StalenessRing::pace_blocker_for(const TakePlan& plan, int64_t current_step) const {
  if (in_flight_.size() == 0) return std::nullopt;
  int64_t groups = 0;  // the batch is the walked prefix: whole groups, oldest first
  const int32_t* group_len = columns_.get().group_len;
  for (int64_t i = 0; i < plan.walked; i += group_len[phys(i)]) ++groups;
  return pace_blocker(in_flight_.step_counts(), in_flight_.size(), ready_groups_, groups, current_step, max_age_,
                      config_.prompts_per_step);
}

std::string StalenessRing::pace_blocked_message(int64_t stamp, int64_t current_step) const {
  const auto blocking = in_flight_.at_or_before(stamp);
  std::ostringstream out;
  out << blocking.size() << " in-flight prompt(s) stamped <= " << stamp << " (";
  for (size_t i = 0; i < blocking.size() && i < 8; ++i)
    out << (i ? ", " : "") << "prompt " << blocking[i].first << " since step " << blocking[i].second;
  if (blocking.size() > 8) out << ", ...";
  out << ") would pass max_age=" << max_age_ << " if the trainer took newer groups at step " << current_step
      << " (prompts_per_step=" << config_.prompts_per_step
      << " per step); complete or fail them, or increase max_age (max_off_policy_threshold)";
  return out.str();
}

}  // namespace pyfast_buffer
