// StalenessRing: in-flight prompts (dispatch, fail, renew, restamp), leases and their expiry.
#include "ring_detail.hpp"

#include <vector>

namespace pyfast_buffer {

int64_t StalenessRing::lease_now() const { return manual_lease_clock_ ? *manual_lease_clock_ : steady_ns(); }

int64_t StalenessRing::expire_due() {
  if (closed_) return 0;  // a closed buffer is frozen
  const int64_t now = lease_now();
  if (in_flight_.earliest_deadline() > now) return 0;
  const std::vector<int64_t> due = in_flight_.due(now);
  expire_prompts(due);
  return static_cast<int64_t>(due.size());
}

void StalenessRing::expire_prompts(const std::vector<int64_t>& prompts) {
  for (const int64_t prompt : prompts) {
    in_flight_.erase(prompt);
    attempts_.on_failed(prompt);
    if (release_log_) note_left(prompt, ReleaseReason::kExpired);
  }
  const auto n = static_cast<int64_t>(prompts.size());
  ledger_.failed += n;
  ledger_.expired += n;
  if (n > 0) ready_cv_.notify_all();  // a waiting take may have been blocked by these prompts
  if (n > 0 && paced()) admit_cv_.notify_all();  // their slots are free
}

void StalenessRing::dispatch(const int64_t* prompt_ids, int64_t n, int64_t sample_step, std::optional<double> lease,
                             std::optional<double> timeout, const int32_t* slots, int64_t n_slots) {
  const int64_t lease_ns = lease ? checked_seconds_ns(*lease, "lease", false) : 0;
  check_timeout(timeout);
  MutexLock lock(mutex_);
  check_open();
  expire_due();
  if (sample_step < 0) throw InvalidArgument(concat("step=", sample_step, " is negative; steps are ints >= 0"));
  check_slots(slots, n_slots, n, "prompts");
  if (auto dup = first_duplicate(prompt_ids, n))
    throw InvalidArgument(concat("prompt_ids: prompt ", *dup, " appears twice; dispatch each prompt once"));
  check_not_in_flight(prompt_ids, n);
  if (paced() && n > 0) {  // all n or none; after a wait, validate again (another thread may have dispatched)
    check_pace_call_size(n, "dispatch");
    const StepCounts asked{{sample_step, n}};
    std::optional<SteadyTime> wait_until;
    bool waited = false;
    // Whether it goes first is decided before admission, without touching the attempts table, and again after
    // a wait (a pending group of one of its prompts may have been trained meanwhile).
    bool protected_call = holds_protected_attempt(prompt_ids, n);
    while (!wait_for_admission(asked, n, sample_step, protected_call, timeout, "dispatch", wait_until, waited)) {
      check_not_in_flight(prompt_ids, n);
      protected_call = holds_protected_attempt(prompt_ids, n);
    }
    ledger_.admitted += n;
    ledger_.admission_waits += waited;
    ledger_.admitted_ahead += protected_call && unprotected_waiting_ > 0;
  }
  const int64_t stamp = now_ns(), since = lease_now();
  const int64_t deadline = lease ? add_saturating(since, lease_ns) : kNoLease;
  if (!bias_ && n > 0) {  // the first dispatch: prompt accounting starts (put-only rings never pay for it)
    bias_ = std::make_unique<BiasMonitor>();
    attempts_.reserve(int64_t{1} << 16);
  }
  int64_t protected_admitted = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t slot = slots ? slots[n_slots == 1 ? 0 : i] : 0;
    const int32_t untrained_run = attempts_.on_dispatch(prompt_ids[i], slot);
    const bool protect = config_.max_attempts > 0 && untrained_run >= config_.max_attempts;
    in_flight_.insert(prompt_ids[i], {sample_step, stamp, since, deadline, make_meta(-1, slot, protect, true)});
    protected_admitted += protect;
    ++source_counts_[static_cast<size_t>(slot)].dispatched;
    tagged_ |= slot != 0;
  }
  ledger_.dispatched += n;
  if (paced()) ledger_.protected_admitted += protected_admitted;
  advance_clock_by_stamp(sample_step);
}

void StalenessRing::check_not_in_flight(const int64_t* prompt_ids, int64_t n) const {
  for (int64_t i = 0; i < n; ++i)
    if (in_flight_.contains(prompt_ids[i]))
      throw InvalidArgument(concat("prompt_ids: prompt ", prompt_ids[i], " is already in flight (dispatched at step ",
                                   in_flight_.at(prompt_ids[i]).sample_step,
                                   "); complete or fail it before dispatching it again"));
}

void StalenessRing::fail(const int64_t* prompt_ids, int64_t n) {
  MutexLock lock(mutex_);
  check_open();
  expire_due();
  if (auto dup = first_duplicate(prompt_ids, n))
    throw InvalidArgument(concat("prompt_ids: prompt ", *dup, " appears twice; fail each prompt once"));
  for (int64_t i = 0; i < n; ++i)
    if (!in_flight_.contains(prompt_ids[i]))
      throw InvalidArgument(concat("prompt_ids: prompt ", prompt_ids[i],
                                   " is not in flight; dispatch it first (it may already be "
                                   "completed, failed or expired)"));
  for (int64_t i = 0; i < n; ++i) in_flight_.erase(prompt_ids[i]), attempts_.on_failed(prompt_ids[i]);
  if (release_log_)
    for (int64_t i = 0; i < n; ++i) note_left(prompt_ids[i], ReleaseReason::kFailed);
  ledger_.failed += n;
  lock.unlock();
  if (n > 0) ready_cv_.notify_all();
  if (n > 0 && paced()) admit_cv_.notify_all();
}

void StalenessRing::renew(const int64_t* prompt_ids, int64_t n, double lease) {
  const int64_t lease_ns = checked_seconds_ns(lease, "lease", false);
  MutexLock lock(mutex_);
  check_open();
  expire_due();
  if (auto dup = first_duplicate(prompt_ids, n))
    throw InvalidArgument(concat("prompt_ids: prompt ", *dup, " appears twice; renew each prompt once"));
  for (int64_t i = 0; i < n; ++i)
    if (!in_flight_.contains(prompt_ids[i]))
      throw InvalidArgument(concat("prompt_ids: prompt ", prompt_ids[i],
                                   " is not in flight; only in-flight prompts can be renewed (it may already be "
                                   "completed, failed or expired)"));
  const int64_t deadline = add_saturating(lease_now(), lease_ns);
  for (int64_t i = 0; i < n; ++i) in_flight_.set_deadline(prompt_ids[i], deadline);
}

int64_t StalenessRing::restamp_in_flight(int64_t step) {
  MutexLock lock(mutex_);
  check_open();
  expire_due();
  if (config_.age_from != AgeFrom::kFinish)
    throw InvalidArgument(
        "restamp_in_flight: this buffer measures age from the dispatch step (age_from='start'), which a weight "
        "update cannot change; construct it with age_from='finish' to age trajectories from the weights that "
        "finished them");
  if (step < 0) throw InvalidArgument(concat("step=", step, " is negative; steps are ints >= 0"));
  // The weights of `step` exist once the trainer has taken step - 1: a restamp past the trainer's next step would
  // move that step (pace's t0) without admission, which the pace proof does not allow.
  const int64_t limit = restamp_limit();
  if (step > limit)
    throw InvalidArgument(concat("restamp_in_flight: step=", step, " is past the trainer's next step ", limit,
                                 "; pass the step of the weights pushed to the engines, which the trainer has "
                                 "already produced (<= ", limit, ")"));
  const int64_t raised = in_flight_.raise_steps(step);
  if (raised == 0) return 0;
  advance_clock_by_stamp(step);
  lock.unlock();
  ready_cv_.notify_all();  // a take held by an in-flight prompt at max_age may pass now
  if (paced()) admit_cv_.notify_all();  // the raised stamps have later deadlines: admission may have room
  return raised;
}

int64_t StalenessRing::expire_in_flight(double older_than) {
  const int64_t older_ns = checked_seconds_ns(older_than, "older_than_s", true);
  MutexLock lock(mutex_);
  check_open();
  const int64_t by_lease = expire_due();
  const std::vector<int64_t> old = in_flight_.dispatched_by(lease_now() - older_ns);
  expire_prompts(old);
  return by_lease + static_cast<int64_t>(old.size());
}

void StalenessRing::set_lease_clock(std::optional<int64_t> now_ns) {
  if (now_ns && *now_ns < 0) throw InvalidArgument(concat("lease clock=", *now_ns, " must be >= 0"));
  {
    MutexLock lock(mutex_);
    manual_lease_clock_ = now_ns;
  }
  ready_cv_.notify_all();  // a waiting take re-checks the leases against the new time
  admit_cv_.notify_all();  // so does a waiting paced dispatch
}

int64_t StalenessRing::next_lease_deadline_ns() {
  MutexLock lock(mutex_);
  const int64_t lease = in_flight_.earliest_deadline();
  return lease == kNoLease || manual_lease_clock_ ? -1 : lease;
}

}  // namespace pyfast_buffer
