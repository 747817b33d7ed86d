#include "staleness_ring.hpp"

#include "compact_rows.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace pyfast_buffer {
namespace {

using SteadyClock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch()).count();
}

SteadyClock::time_point deadline_after(double seconds) {
  // Callers validated `seconds`; the clamp keeps NaN, negatives and huge values away from chrono regardless.
  const double clamped = seconds >= 0 ? std::min(seconds, kMaxSeconds) : 0.0;
  return SteadyClock::now() +
         std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(clamped));
}

// Returns a + b for b >= 0, saturating below kNoLease so that a deadline never reads as "no lease".
int64_t add_saturating(int64_t a, int64_t b) {
  return a > kNoLease - 1 - b ? kNoLease - 1 : a + b;
}

const char* strategy_name(Strategy s) { return s == Strategy::kDrop ? "drop" : "wait"; }

const char* on_full_name(OnFull f) {
  switch (f) {
    case OnFull::kEvictOldest: return "evict_oldest";
    case OnFull::kBlock: return "block";
    default: return "error";
  }
}

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Returns `seconds` in whole nanoseconds, or throws InvalidArgument naming `name` unless it is finite,
// > 0 (>= 0 with allow_zero) and <= kMaxSeconds.
int64_t checked_seconds_ns(double seconds, const char* name, bool allow_zero) {
  const bool ok = std::isfinite(seconds) && (allow_zero ? seconds >= 0 : seconds > 0) && seconds <= kMaxSeconds;
  if (!ok)
    throw InvalidArgument(concat(name, "=", seconds, " must be a finite number of seconds ",
                                 allow_zero ? ">= 0" : "> 0", " and <= ", kMaxSeconds));
  return static_cast<int64_t>(seconds * 1e9);
}

void check_timeout(std::optional<double> timeout) {
  if (timeout) checked_seconds_ns(*timeout, "timeout", true);
}

// Returns the first id (in call order) that occurs twice in ids[0..n), if any. An open-addressing table
// of one flat array: no allocation per id, so the check costs a few ns per id on every put and dispatch.
std::optional<int64_t> first_duplicate(const int64_t* ids, int64_t n) {
  if (n < 2) return std::nullopt;
  if (n <= 16) {  // small calls: a quadratic scan beats building a table
    for (int64_t i = 1; i < n; ++i)
      for (int64_t j = 0; j < i; ++j)
        if (ids[j] == ids[i]) return ids[i];
    return std::nullopt;
  }
  constexpr int64_t kEmpty = std::numeric_limits<int64_t>::min();  // the id kEmpty itself is tracked apart
  size_t slots = 32;
  while (slots < 2 * static_cast<size_t>(n)) slots <<= 1;  // load factor <= 1/2
  std::vector<int64_t> table(slots, kEmpty);
  const size_t mask = slots - 1;
  const int shift = 64 - __builtin_ctzll(slots);
  bool seen_empty_id = false;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    if (id == kEmpty) {
      if (seen_empty_id) return id;
      seen_empty_id = true;
      continue;
    }
    size_t at = static_cast<size_t>((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> shift);
    for (;; at = (at + 1) & mask) {
      if (table[at] == kEmpty) {
        table[at] = id;
        break;
      }
      if (table[at] == id) return id;
    }
  }
  return std::nullopt;
}

}  // namespace

namespace {
// Returns `config` unchanged, or throws InvalidArgument; runs before any column is allocated.
const RingConfig& validated(const RingConfig& config, const ColumnPointers* borrowed) {
  if (config.capacity <= 0 || config.capacity > kMaxCapacity)
    throw InvalidArgument(concat("capacity=", config.capacity, " must be in [1, ", kMaxCapacity, "]"));
  if (config.max_age < 0) throw InvalidArgument(concat("max_age=", config.max_age, " must be >= 0"));
  if (config.max_uses < 1 || config.max_uses > std::numeric_limits<int32_t>::max())
    throw InvalidArgument(concat("max_uses=", config.max_uses, " must be in [1, 2**31 - 1]"));
  if (config.parameter_sync_step < 0)
    throw InvalidArgument(concat("parameter_sync_step=", config.parameter_sync_step, " must be > 0"));
  if (borrowed && !borrowed->complete()) throw InvalidArgument("borrowed columns: every column must be set");
  if (config.release_bound < 0)
    throw InvalidArgument(concat("release_bound=", config.release_bound, " must be > 0 (or 0 for the default)"));
  return config;
}

// Returns the ring's columns: the borrowed ones, or freshly allocated; throws OutOfMemory naming the bytes.
RingColumns make_columns(int64_t capacity, const ColumnPointers* borrowed) {
  if (borrowed) return RingColumns(*borrowed);
  try {
    return RingColumns(capacity);
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(concat("capacity=", capacity, " needs ", capacity * kBytesPerEntry,
                             " bytes of ring memory, which could not be allocated; lower capacity"));
  }
}
}  // namespace

StalenessRing::StalenessRing(const RingConfig& config, const ColumnPointers* borrowed)
    : config_(validated(config, borrowed)),
      columns_(make_columns(config.capacity, borrowed)),
      max_age_(config.max_age) {
  if (config_.track_released)
    release_log_ = std::make_unique<ReleaseLog>(config_.release_bound > 0 ? config_.release_bound
                                                                          : default_release_bound(config_.capacity));
}

void StalenessRing::note_left(int64_t id, ReleaseReason reason) {
  if (release_log_ && release_log_->push(id, reason)) ++ledger_.released_overflow;
  if (config_.unique_ids && reason <= ReleaseReason::kEvicted) live_ids_.erase(id);  // trajectories only
}

void StalenessRing::note_prefix_left(int64_t count, ReleaseReason reason) {
  const int64_t* traj_id = columns_.get().traj_id;
  for (int64_t i = 0; i < count; ++i) note_left(traj_id[phys(i)], reason);
}

void StalenessRing::note_walked(int64_t walked, int64_t current_step) {
  // The walked prefix after a take's writes: stale entries were dropped, the rest taken; those at max_uses retire.
  const int64_t cutoff = config_.strategy == Strategy::kDrop ? current_step - max_age_
                                                              : std::numeric_limits<int64_t>::min();
  const ColumnPointers& c = columns_.get();
  for (int64_t i = 0; i < walked; ++i) {
    const int64_t p = phys(i);
    if (c.sample_step[p] < cutoff)
      note_left(c.traj_id[p], ReleaseReason::kDroppedStale);
    else if (c.uses[p] >= config_.max_uses)
      note_left(c.traj_id[p], ReleaseReason::kRetired);
  }
}

void StalenessRing::check_not_live(const int64_t* traj_ids, int64_t n) const {
  if (!config_.unique_ids) return;
  for (int64_t i = 0; i < n; ++i)
    if (live_ids_.count(traj_ids[i]))
      throw InvalidArgument(concat("traj_ids: trajectory ", traj_ids[i],
                                   " is already in the buffer and unique_ids=True",
                                   "; give every trajectory a fresh id (or pass unique_ids=False)"));
}

Released StalenessRing::take_released() {
  Lock lock(mutex_);
  if (!release_log_)
    throw InvalidArgument("released(): this buffer does not track released ids; construct it with track_released=True");
  Released out;
  release_log_->drain(out.ids, out.reasons);
  return out;
}

void StalenessRing::check_open() const {
  if (closed_) throw Closed("the buffer is closed; create a new buffer (or load its state_dict) to continue");
}

void StalenessRing::check_clock(int64_t current_step) const {
  if (current_step < 0)
    throw InvalidArgument(concat("current_step=", current_step, " is negative; steps are ints >= 0"));
  if (current_step < clock_)
    throw InvalidArgument(concat("current_step=", current_step, " is lower than step ", clock_,
                                 " already seen; the trainer's step never goes back, pass the current global step"));
}

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
    if (release_log_) note_left(prompt, ReleaseReason::kExpired);
  }
  const auto n = static_cast<int64_t>(prompts.size());
  ledger_.failed += n;
  ledger_.expired += n;
  if (n > 0) ready_cv_.notify_all();  // a waiting take may have been blocked by these prompts
}

void StalenessRing::check_interrupt(Lock& lock, SteadyTime& last_check) {
  if (!interrupt_check_) return;
  const SteadyTime now = SteadyClock::now();
  if (now - last_check < std::chrono::milliseconds(kInterruptCheckMs)) return;
  last_check = now;
  lock.unlock();  // the check may take the GIL: never hold our lock while waiting for it
  interrupt_check_();  // throws to abort the call; nothing has been changed yet
  lock.lock();
}

StalenessRing::SteadyTime StalenessRing::next_wake(SteadyTime deadline) const {
  SteadyTime wake = deadline;
  if (interrupt_check_) wake = std::min(wake, SteadyClock::now() + std::chrono::milliseconds(kInterruptCheckMs));
  const int64_t lease = in_flight_.earliest_deadline();
  if (lease != kNoLease && !manual_lease_clock_)  // the real lease clock is the steady clock
    wake = std::min(wake, SteadyTime(std::chrono::duration_cast<SteadyClock::duration>(
                              std::chrono::nanoseconds(lease))));
  return wake;
}

bool StalenessRing::wait_blocked(int64_t current_step) const {
  return in_flight_.size() > 0 && current_step - in_flight_.oldest_step() >= max_age_;
}

std::string StalenessRing::wait_blocked_message(int64_t current_step) const {
  const auto blocking = in_flight_.at_or_before(current_step - max_age_);
  std::ostringstream out;
  out << blocking.size() << " in-flight prompt(s) at max_age=" << max_age_ << " (";
  for (size_t i = 0; i < blocking.size() && i < 8; ++i)
    out << (i ? ", " : "") << "prompt " << blocking[i].first << " since step " << blocking[i].second;
  if (blocking.size() > 8) out << ", ...";
  out << "); complete or fail them, or increase max_age (max_off_policy_threshold)";
  return out.str();
}

void StalenessRing::dispatch(const int64_t* prompt_ids, int64_t n, int64_t sample_step, std::optional<double> lease) {
  const int64_t lease_ns = lease ? checked_seconds_ns(*lease, "lease", false) : 0;
  Lock lock(mutex_);
  check_open();
  expire_due();
  if (sample_step < 0) throw InvalidArgument(concat("step=", sample_step, " is negative; steps are ints >= 0"));
  if (auto dup = first_duplicate(prompt_ids, n))
    throw InvalidArgument(concat("prompt_ids: prompt ", *dup, " appears twice; dispatch each prompt once"));
  for (int64_t i = 0; i < n; ++i)
    if (in_flight_.contains(prompt_ids[i]))
      throw InvalidArgument(concat("prompt_ids: prompt ", prompt_ids[i], " is already in flight (dispatched at step ",
                                   in_flight_.at(prompt_ids[i]).sample_step,
                                   "); complete or fail it before dispatching it again"));
  const int64_t stamp = now_ns(), since = lease_now();
  const int64_t deadline = lease ? add_saturating(since, lease_ns) : kNoLease;
  for (int64_t i = 0; i < n; ++i) in_flight_.insert(prompt_ids[i], {sample_step, stamp, since, deadline});
  ledger_.dispatched += n;
  clock_ = std::max(clock_, sample_step);
}

void StalenessRing::fail(const int64_t* prompt_ids, int64_t n) {
  Lock lock(mutex_);
  check_open();
  expire_due();
  if (auto dup = first_duplicate(prompt_ids, n))
    throw InvalidArgument(concat("prompt_ids: prompt ", *dup, " appears twice; fail each prompt once"));
  for (int64_t i = 0; i < n; ++i)
    if (!in_flight_.contains(prompt_ids[i]))
      throw InvalidArgument(concat("prompt_ids: prompt ", prompt_ids[i],
                                   " is not in flight; dispatch it first (it may already be "
                                   "completed, failed or expired)"));
  for (int64_t i = 0; i < n; ++i) in_flight_.erase(prompt_ids[i]);
  if (release_log_)
    for (int64_t i = 0; i < n; ++i) note_left(prompt_ids[i], ReleaseReason::kFailed);
  ledger_.failed += n;
  lock.unlock();
  if (n > 0) ready_cv_.notify_all();
}

void StalenessRing::renew(const int64_t* prompt_ids, int64_t n, double lease) {
  const int64_t lease_ns = checked_seconds_ns(lease, "lease", false);
  Lock lock(mutex_);
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

int64_t StalenessRing::expire_in_flight(double older_than) {
  const int64_t older_ns = checked_seconds_ns(older_than, "older_than_s", true);
  Lock lock(mutex_);
  check_open();
  const int64_t by_lease = expire_due();
  const std::vector<int64_t> old = in_flight_.dispatched_by(lease_now() - older_ns);
  expire_prompts(old);
  return by_lease + static_cast<int64_t>(old.size());
}

void StalenessRing::set_lease_clock(std::optional<int64_t> now_ns) {
  if (now_ns && *now_ns < 0) throw InvalidArgument(concat("lease clock=", *now_ns, " must be >= 0"));
  {
    Lock lock(mutex_);
    manual_lease_clock_ = now_ns;
  }
  ready_cv_.notify_all();  // a waiting take re-checks the leases against the new time
}

namespace {
// Groups indices 0..n) by key, groups in order of first appearance, members in call order.
void group_stably(const int64_t* keys, int64_t n, std::vector<int64_t>& order, std::vector<int64_t>& bounds) {
  std::unordered_map<int64_t, int64_t> group_of_key;
  group_of_key.reserve(static_cast<size_t>(n));
  std::vector<int64_t> group(static_cast<size_t>(n)), counts;
  for (int64_t i = 0; i < n; ++i) {
    auto [it, fresh] = group_of_key.emplace(keys[i], static_cast<int64_t>(counts.size()));
    if (fresh) counts.push_back(0);
    group[i] = it->second;
    ++counts[it->second];
  }
  bounds.assign(counts.size() + 1, 0);
  for (size_t g = 0; g < counts.size(); ++g) bounds[g + 1] = bounds[g] + counts[g];
  std::vector<int64_t> next(bounds.begin(), bounds.end() - 1);
  order.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[next[group[i]]++] = i;
}
}  // namespace

bool StalenessRing::wait_for_room(Lock& lock, int64_t n, std::optional<double> timeout, const char* call,
                                  std::optional<SteadyTime>& deadline) {
  if (size_ + n <= config_.capacity || config_.on_full == OnFull::kEvictOldest) return true;
  if (config_.on_full == OnFull::kError || !timeout)
    throw Full(concat("ring full: ", n, " entries do not fit, ", size_, " of capacity=", config_.capacity,
                      " are ready; take more often, raise capacity, use on_full='evict_oldest'",
                      config_.on_full == OnFull::kBlock ? ", or pass timeout= to wait for room" : " or 'block'"));
  if (!deadline) deadline = deadline_after(*timeout);  // one deadline for every wait of the call
  SteadyTime last_check = SteadyClock::now();
  for (;;) {
    room_cv_.wait_until(lock, next_wake(*deadline));
    check_interrupt(lock, last_check);
    check_open();
    if (size_ + n <= config_.capacity) return false;  // room after waiting: the caller re-validates its arguments
    if (SteadyClock::now() >= *deadline) break;
  }
  throw Timeout(concat(call, " timed out after ", *timeout, " s waiting for room: ", n, " entries need room, ",
                       size_, " of capacity=", config_.capacity,
                       " are ready; take more often, raise capacity or use on_full='evict_oldest'"));
}

void StalenessRing::append_group(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* order,
                                 int64_t len, int64_t group_id, int64_t sample_step, int64_t dispatch_ns,
                                 int64_t complete_ns) {
  const ColumnPointers& c = columns_.get();
  if (size_ > 0 && sample_step < c.sample_step[phys(size_ - 1)]) sorted_ = false;
  const int64_t version = config_.parameter_sync_step > 0 ? sample_step / config_.parameter_sync_step : -1;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t src = order ? order[j] : j;
    const int64_t p = phys(size_++);
    c.traj_id[p] = traj_ids[src];
    c.group_id[p] = group_ids ? group_ids[src] : group_id;
    c.sample_step[p] = sample_step;
    c.policy_version[p] = version;
    c.dispatch_ns[p] = dispatch_ns;
    c.complete_ns[p] = complete_ns;
    c.uses[p] = 0;
    c.group_len[p] = static_cast<int32_t>(len);
  }
  if (config_.unique_ids)
    for (int64_t j = 0; j < len; ++j) live_ids_.insert(traj_ids[order ? order[j] : j]);
}

void StalenessRing::remove_prefix(int64_t n) {
  head_ = phys(n);
  size_ -= n;
  if (size_ == 0) head_ = 0, sorted_ = true;
}

void StalenessRing::evict_oldest_groups(int64_t need) {
  int64_t evicted = 0;
  while (size_ + need > config_.capacity) {
    const int64_t len = columns_.get().group_len[head_];
    evicted += len;
    if (leave_hooks()) note_prefix_left(len, ReleaseReason::kEvicted);
    remove_prefix(len);
  }
  ledger_.evicted += evicted;
  evicted_unreported_ += evicted;
}

void StalenessRing::complete(const int64_t* traj_ids, const int64_t* prompt_ids, int64_t n,
                             std::optional<double> timeout) {
  check_timeout(timeout);
  Lock lock(mutex_);
  check_open();
  expire_due();
  if (n == 0) return;
  if (n > config_.capacity)
    throw InvalidArgument(concat("traj_ids: ", n, " trajectories exceed capacity=", config_.capacity,
                                 "; raise capacity or complete fewer prompts per call"));
  if (auto dup = first_duplicate(traj_ids, n))
    throw InvalidArgument(concat("traj_ids: trajectory ", *dup, " appears twice; complete each trajectory once"));
  Groups groups;
  group_stably(prompt_ids, n, groups.order, groups.bounds);
  const size_t n_groups = groups.bounds.size() - 1;
  std::optional<SteadyTime> deadline;
  for (;;) {  // validate, then wait for room; after a wait, validate again (another thread may have failed a prompt)
    expire_due();
    for (size_t g = 0; g < n_groups; ++g) {
      const int64_t prompt = prompt_ids[groups.order[groups.bounds[g]]];
      if (!in_flight_.contains(prompt))
        throw InvalidArgument(concat("prompt_ids: prompt ", prompt,
                                     " is not in flight; dispatch it first (it may already be "
                                     "completed, failed or expired)"));
    }
    check_not_live(traj_ids, n);
    if (wait_for_room(lock, n, timeout, "complete", deadline)) break;
  }
  if (size_ + n > config_.capacity) evict_oldest_groups(n);
  const int64_t stamp = now_ns();
  for (size_t g = 0; g < n_groups; ++g) {
    const int64_t* members = groups.order.data() + groups.bounds[g];
    const int64_t len = groups.bounds[g + 1] - groups.bounds[g];
    const int64_t prompt = prompt_ids[members[0]];
    const InFlightPrompt rec = in_flight_.at(prompt);
    append_group(traj_ids, nullptr, members, len, prompt, rec.sample_step, rec.dispatch_ns, stamp);
    in_flight_.erase(prompt);
  }
  ledger_.completed += static_cast<int64_t>(n_groups);
  ledger_.put_total += n;
  lock.unlock();  // wake consumers after the lock is free, so they do not wake only to block on it
  ready_cv_.notify_all();
}

void StalenessRing::put(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* sample_steps,
                        int64_t n_steps, int64_t n, std::optional<double> timeout) {
  check_timeout(timeout);
  Lock lock(mutex_);
  check_open();
  if (n == 0) return;
  if (n_steps != 1 && n_steps != n)
    throw InvalidArgument(concat("sample_step: ", n_steps, " stamps for ", n,
                                 " trajectories; pass one stamp or one per trajectory"));
  if (n > config_.capacity)
    throw InvalidArgument(concat("traj_ids: ", n, " trajectories exceed capacity=", config_.capacity,
                                 "; raise capacity or put fewer per call"));
  if (auto dup = first_duplicate(traj_ids, n))
    throw InvalidArgument(concat("traj_ids: trajectory ", *dup, " appears twice; put each trajectory once"));
  int64_t max_step = -1;
  for (int64_t i = 0; i < n_steps; ++i) {
    if (sample_steps[i] < 0)
      throw InvalidArgument(concat("sample_step=", sample_steps[i], " is negative; steps are ints >= 0"));
    max_step = std::max(max_step, sample_steps[i]);
  }
  Groups groups;
  if (group_ids) {
    group_stably(group_ids, n, groups.order, groups.bounds);
    for (size_t g = 0; g + 1 < groups.bounds.size() && n_steps > 1; ++g) {
      const int64_t first = groups.order[groups.bounds[g]];
      for (int64_t k = groups.bounds[g] + 1; k < groups.bounds[g + 1]; ++k)
        if (sample_steps[groups.order[k]] != sample_steps[first])
          throw InvalidArgument(concat("sample_step: group ", group_ids[first], " has entries stamped ",
                                       sample_steps[first], " and ", sample_steps[groups.order[k]],
                                       "; a group shares one sample_step"));
    }
  }
  std::optional<SteadyTime> deadline;
  do {  // after a wait, validate again: another thread may have put one of these ids
    check_not_live(traj_ids, n);
  } while (!wait_for_room(lock, n, timeout, "put", deadline));
  if (size_ + n > config_.capacity) evict_oldest_groups(n);
  const int64_t stamp = now_ns();
  int64_t n_groups = n;
  if (group_ids) {
    n_groups = static_cast<int64_t>(groups.bounds.size()) - 1;
    for (int64_t g = 0; g < n_groups; ++g) {
      const int64_t* members = groups.order.data() + groups.bounds[g];
      const int64_t step = sample_steps[n_steps > 1 ? members[0] : 0];
      append_group(traj_ids, group_ids, members, groups.bounds[g + 1] - groups.bounds[g], 0, step, stamp, stamp);
    }
  } else {
    for (int64_t i = 0; i < n; ++i)
      append_group(traj_ids + i, nullptr, nullptr, 1, traj_ids[i], sample_steps[n_steps > 1 ? i : 0], stamp, stamp);
  }
  ledger_.dispatched += n_groups;
  ledger_.completed += n_groups;
  ledger_.put_total += n;
  clock_ = std::max(clock_, max_step);
  lock.unlock();
  ready_cv_.notify_all();
}

int64_t StalenessRing::skip_stale(int64_t i, int64_t cutoff) const {
  // Scans contiguous physical runs without per-entry index arithmetic or dependent loads.
  const int64_t* steps = columns_.get().sample_step;
  while (i < size_) {
    const int64_t p = phys(i);
    const int64_t run = std::min(size_ - i, config_.capacity - p);
    const int64_t* s = steps + p;
    int64_t k = 0;
    while (k < run && s[k] < cutoff) ++k;
    i += k;
    if (k < run) break;
  }
  return i;
}

void StalenessRing::plan_take(int64_t batch_size, int64_t current_step, TakePlan& plan) const {
  plan.walked = plan.taken = plan.dropped = 0;
  plan.full = false;
  plan.spans.clear();
  if (config_.strategy == Strategy::kWait && wait_blocked(current_step)) {
    plan.blocked_by = BlockedBy::kInFlightAtMaxAge;
    return;
  }
  // Under drop, stale entries are skipped one by one: a group shares one stamp, so a stale group
  // is skipped whole and every fresh entry reached starts a group.
  const int64_t cutoff = config_.strategy == Strategy::kDrop ? current_step - max_age_
                                                              : std::numeric_limits<int64_t>::min();
  const int32_t* group_len = columns_.get().group_len;
  const int64_t* group_id = columns_.get().group_id;
  int64_t i = 0;
  while (i < size_) {
    const int64_t fresh = skip_stale(i, cutoff);
    plan.dropped += fresh - i;
    i = fresh;
    if (i == size_) break;
    const int64_t p = phys(i);
    const int64_t len = group_len[p];
    if (len > batch_size)
      throw InvalidArgument(concat("batch_size=", batch_size, " is smaller than group ", group_id[p], " of ", len,
                                   " trajectories; raise batch_size to at least ", len,
                                   " (a batch never splits a group)"));
    if (plan.taken + len > batch_size) {
      plan.full = true;
      break;
    }
    if (!plan.spans.empty() && plan.spans.back().start + plan.spans.back().count == i)
      plan.spans.back().count += len;
    else
      plan.spans.push_back({i, len});
    plan.taken += len;
    i += len;
    if (plan.taken == batch_size) {
      plan.full = true;
      break;
    }
  }
  plan.walked = i;
  plan.blocked_by = plan.full ? BlockedBy::kNone : BlockedBy::kTooFewReady;
}

void StalenessRing::commit_take(const TakePlan& plan, int64_t current_step, int64_t* base, TakeStats& stats) {
  const int64_t k_all = plan.taken;
  int64_t* const o_traj = base;
  int64_t* const o_group = base + k_all;
  int64_t* const o_step = base + 2 * k_all;
  int64_t* const o_age = base + 3 * k_all;
  int64_t* const o_uses = base + 4 * k_all;
  int64_t* const o_version = base + 5 * k_all;
  int64_t* const o_dispatch = base + 6 * k_all;
  int64_t* const o_complete = base + 7 * k_all;
  const int32_t max_uses = static_cast<int32_t>(config_.max_uses);
  const ColumnPointers c = columns_.get();  // a local copy: the output writes cannot alias it
  int64_t k = 0, survivors = 0, age_max = 0;
  Int128 age_sum = 0;  // 2**40 ages near 2**63 overflow int64
  for (const Span& span : plan.spans) {
    for (int64_t i = span.start, end = span.start + span.count; i < end;) {
      const int64_t p0 = phys(i);
      const int64_t run = std::min(end - i, config_.capacity - p0);
      for (int64_t p = p0; p < p0 + run; ++p, ++k) {
        const int64_t age = current_step - c.sample_step[p];
        const int32_t uses = ++c.uses[p];
        o_traj[k] = c.traj_id[p];
        o_group[k] = c.group_id[p];
        o_step[k] = c.sample_step[p];
        o_age[k] = age;
        o_uses[k] = uses;
        o_version[k] = c.policy_version[p];
        o_dispatch[k] = c.dispatch_ns[p];
        o_complete[k] = c.complete_ns[p];
        age_sum += age;
        age_max = std::max(age_max, age);
        ++stats.age_hist[age_bucket(age)];
        survivors += uses < max_uses;
      }
      i += run;
    }
  }
  if (leave_hooks()) note_walked(plan.walked, current_step);  // before survivors move: ring order intact
  stats.age_sum = age_sum;
  stats.age_max = age_max;
  if (survivors > 0) {
    // Reused entries keep their place: move them, in order, to the end of the walked prefix.
    const int64_t cutoff = config_.strategy == Strategy::kDrop ? current_step - max_age_
                                                                : std::numeric_limits<int64_t>::min();
    int64_t write = plan.walked - 1;
    for (int64_t i = plan.walked - 1; i >= 0; --i) {
      const int64_t p = phys(i);
      if (c.sample_step[p] < cutoff || c.uses[p] >= max_uses) continue;
      const int64_t q = phys(write--);
      if (p == q) continue;
      c.traj_id[q] = c.traj_id[p], c.group_id[q] = c.group_id[p], c.sample_step[q] = c.sample_step[p];
      c.policy_version[q] = c.policy_version[p], c.dispatch_ns[q] = c.dispatch_ns[p];
      c.complete_ns[q] = c.complete_ns[p], c.uses[q] = c.uses[p], c.group_len[q] = c.group_len[p];
    }
  }
  remove_prefix(plan.walked - survivors);
  stats.taken = plan.taken;
  stats.dropped_stale = plan.dropped;
  stats.retired = plan.taken - survivors;
  stats.blocked_by = plan.blocked_by;
  ledger_.taken += plan.taken;
  ledger_.retired += stats.retired;
  ledger_.dropped_stale += plan.dropped;
  if (plan.walked > 0) room_cv_.notify_all();
}

void StalenessRing::fill_state(TakeStats& stats) {
  stats.evicted = evicted_unreported_;
  evicted_unreported_ = 0;
  stats.buffer_left = size_;
  stats.in_flight = in_flight_.size();
  stats.sampled_total = ledger_.put_total;
  stats.max_age = max_age_;
  stats.expired = ledger_.expired;
}

TakeStats StalenessRing::take(int64_t batch_size, int64_t current_step, std::optional<double> timeout,
                              int64_t* out) {
  check_timeout(timeout);
  Lock lock(mutex_);
  check_open();
  expire_due();
  if (batch_size <= 0) throw InvalidArgument(concat("batch_size=", batch_size, " must be > 0"));
  check_clock(current_step);
  TakeStats stats;
  TakePlan plan;
  plan_take(batch_size, current_step, plan);
  if (timeout && !plan.full) {
    const auto deadline = deadline_after(*timeout);
    SteadyTime last_check = SteadyClock::now();
    // Every change that could complete the batch notifies ready_cv_; re-plan on each wake-up. The wait
    // also wakes for the interrupt check and at the earliest lease deadline, which may unblock `wait`.
    while (!plan.full) {
      ready_cv_.wait_until(lock, next_wake(deadline));
      check_interrupt(lock, last_check);
      check_open();
      expire_due();
      if (SteadyClock::now() >= deadline) {
        plan_take(batch_size, current_step, plan);
        if (plan.full) break;
        std::string cause = plan.blocked_by == BlockedBy::kInFlightAtMaxAge
                                ? wait_blocked_message(current_step)
                                : concat("only ", plan.taken, " fresh entries are ready for batch_size=", batch_size,
                                         " (", size_, " ready in all, ", in_flight_.size(),
                                         " prompts in flight); produce faster, lower batch_size or raise the timeout");
        throw Timeout(concat("take timed out after ", *timeout, " s under ", strategy_name(config_.strategy),
                             ": ", cause));
      }
      check_clock(current_step);  // a producer may have stamped a later step while we waited
      plan_take(batch_size, current_step, plan);
    }
  }
  clock_ = std::max(clock_, current_step);
  commit_take(plan, current_step, out, stats);
  fill_state(stats);
  return stats;
}

TakeStats StalenessRing::evict_stale(int64_t current_step) {
  Lock lock(mutex_);
  check_open();
  expire_due();
  check_clock(current_step);
  clock_ = current_step;
  const int64_t cutoff = current_step - max_age_;
  int64_t removed = 0;
  if (sorted_) {
    const int64_t* steps = columns_.get().sample_step;
    // Stamps are non-decreasing in ring order: the stale entries are a prefix.
    int64_t lo = 0, hi = size_;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (steps[phys(mid)] < cutoff) lo = mid + 1; else hi = mid;
    }
    removed = lo;
    if (leave_hooks()) note_prefix_left(removed, ReleaseReason::kDroppedStale);
    remove_prefix(removed);
  } else {
    // One branch-free pass: every row is copied to the write cursor, which advances only for fresh
    // rows; where neither cursor is near the wrap point, eight rows at a time with AVX-512 if present.
    const ColumnPointers c = columns_.get();  // local copies: column stores cannot alias them
    const int64_t cap = config_.capacity, total = size_;
    if (leave_hooks())  // report the stale ids before the compaction (scalar or SIMD) overwrites them
      for (int64_t i = 0; i < total; ++i)
        if (c.sample_step[phys(i)] < cutoff) note_left(c.traj_id[phys(i)], ReleaseReason::kDroppedStale);
    const bool simd = simd_compaction_available();
    int64_t read = head_, write = head_, kept = 0;
    for (int64_t done = 0; done < total;) {
      if (simd) {
        const int64_t span = std::min({total - done, cap - read, cap - write}) / 8 * 8;
        if (span > 0) {
          const int64_t n_kept = compact_rows_simd(c, read, write, span, cutoff);
          kept += n_kept, done += span, read += span, write += n_kept;
          read -= (read == cap) ? cap : 0;
          write -= (write == cap) ? cap : 0;
          if (span >= 64) continue;  // near the wrap point: fall through to a few scalar rows
        }
      }
      for (const int64_t stop = std::min(total, done + 64); done < stop; ++done) {
        const int64_t step = c.sample_step[read];
        const int64_t keep = step >= cutoff;
        c.traj_id[write] = c.traj_id[read];
        c.group_id[write] = c.group_id[read];
        c.sample_step[write] = step;
        c.policy_version[write] = c.policy_version[read];
        c.dispatch_ns[write] = c.dispatch_ns[read];
        c.complete_ns[write] = c.complete_ns[read];
        c.uses[write] = c.uses[read];
        c.group_len[write] = c.group_len[read];
        kept += keep;
        write += keep;
        write -= (write == cap) ? cap : 0;
        read += 1;
        read -= (read == cap) ? cap : 0;
      }
    }
    // The survivors are sorted iff no kept stamp is below its predecessor; stop at the first descent.
    bool sorted = true;
    for (int64_t i = 1, prev = c.sample_step[head_], p = phys(1); i < kept && sorted; ++i) {
      sorted = c.sample_step[p] >= prev;
      prev = c.sample_step[p];
      p = p + 1 == cap ? 0 : p + 1;
    }
    removed = size_ - kept;
    size_ = kept;
    sorted_ = sorted;
    if (size_ == 0) head_ = 0;
  }
  ledger_.dropped_stale += removed;
  if (removed > 0) room_cv_.notify_all();
  TakeStats stats;
  stats.dropped_stale = removed;
  stats.blocked_by = BlockedBy::kNone;
  fill_state(stats);
  return stats;
}

Ledger StalenessRing::ledger() {
  Lock lock(mutex_);
  expire_due();
  Ledger copy = ledger_;
  copy.in_flight = in_flight_.size();
  copy.buffer_left = size_;
  return copy;
}

int64_t StalenessRing::max_age() const {
  Lock lock(mutex_);
  return max_age_;
}

void StalenessRing::set_max_age(int64_t max_age) {
  if (max_age < 0) throw InvalidArgument(concat("max_age=", max_age, " must be >= 0"));
  Lock lock(mutex_);
  if (max_age == max_age_) return;
  max_age_ = max_age;
  ++ledger_.max_age_changes;
  lock.unlock();
  ready_cv_.notify_all();  // under wait, a raised bound may unblock a waiting take
}

int64_t StalenessRing::size() const {
  Lock lock(mutex_);
  return size_;
}

int64_t StalenessRing::in_flight() {
  Lock lock(mutex_);
  expire_due();
  return in_flight_.size();
}

bool StalenessRing::closed() const {
  Lock lock(mutex_);
  return closed_;
}

void StalenessRing::close() {
  {
    Lock lock(mutex_);
    closed_ = true;
  }
  ready_cv_.notify_all();
  room_cv_.notify_all();
}

RingState StalenessRing::export_state() {
  Lock lock(mutex_);
  expire_due();
  RingState s;
  const ColumnPointers& c = columns_.get();
  auto copy64 = [&](std::vector<int64_t>& dst, const int64_t* col) {
    dst.resize(static_cast<size_t>(size_));
    for (int64_t i = 0; i < size_; ++i) dst[i] = col[phys(i)];
  };
  auto copy32 = [&](std::vector<int32_t>& dst, const int32_t* col) {
    dst.resize(static_cast<size_t>(size_));
    for (int64_t i = 0; i < size_; ++i) dst[i] = col[phys(i)];
  };
  copy64(s.traj_id, c.traj_id), copy64(s.group_id, c.group_id), copy64(s.sample_step, c.sample_step);
  copy64(s.policy_version, c.policy_version), copy64(s.dispatch_ns, c.dispatch_ns);
  copy64(s.complete_ns, c.complete_ns), copy32(s.uses, c.uses), copy32(s.group_len, c.group_len);
  const int64_t now = lease_now();
  for (const auto& [prompt, rec] : in_flight_.sorted_items()) {
    s.in_flight_prompt.push_back(prompt);
    s.in_flight_step.push_back(rec.sample_step);
    s.in_flight_dispatch_ns.push_back(rec.dispatch_ns);
    s.in_flight_lease_left_ns.push_back(rec.deadline_ns == kNoLease ? -1 : std::max<int64_t>(rec.deadline_ns - now, 0));
    s.in_flight_held_ns.push_back(std::max<int64_t>(now - rec.since_ns, 0));
  }
  s.ledger = ledger_;
  s.ledger.in_flight = in_flight_.size();
  s.ledger.buffer_left = size_;
  s.clock = clock_;
  s.evicted_unreported = evicted_unreported_;
  return s;
}

void StalenessRing::import_state(const RingState& s) {
  const int64_t n = static_cast<int64_t>(s.traj_id.size());
  const size_t un = s.traj_id.size();
  if (s.group_id.size() != un || s.sample_step.size() != un || s.policy_version.size() != un ||
      s.dispatch_ns.size() != un || s.complete_ns.size() != un || s.uses.size() != un || s.group_len.size() != un)
    throw InvalidArgument("state_dict: the ready columns have different lengths; pass a state_dict made by state_dict()");
  if (n > config_.capacity)
    throw InvalidArgument(concat("state_dict: ", n, " ready entries exceed capacity=", config_.capacity,
                                 "; load it into a buffer with capacity >= ", n));
  for (int64_t i = 0; i < n;) {
    const int64_t len = s.group_len[i];
    if (len < 1 || i + len > n)
      throw InvalidArgument(concat("state_dict: entry ", i, " has group_len=", len, " that does not fit the ring"));
    for (int64_t j = i; j < i + len; ++j) {
      if (s.group_len[j] != len || s.sample_step[j] != s.sample_step[i] || s.group_id[j] != s.group_id[i] ||
          s.uses[j] != s.uses[i])
        throw InvalidArgument(concat("state_dict: group at entry ", i, " is not contiguous and uniform"));
      if (s.sample_step[j] < 0 || s.sample_step[j] > s.clock)
        throw InvalidArgument(concat("state_dict: entry ", j, " has sample_step=", s.sample_step[j],
                                     " outside [0, clock=", s.clock, "]"));
      if (s.uses[j] < 0 || s.uses[j] >= config_.max_uses)
        throw InvalidArgument(concat("state_dict: entry ", j, " has uses=", s.uses[j], ", not below max_uses=",
                                     config_.max_uses, "; load it into a buffer with a larger max_uses"));
    }
    i += len;
  }
  const size_t m = s.in_flight_prompt.size();
  if (s.in_flight_step.size() != m || s.in_flight_dispatch_ns.size() != m || s.in_flight_lease_left_ns.size() != m ||
      s.in_flight_held_ns.size() != m)
    throw InvalidArgument("state_dict: the in-flight columns have different lengths");
  for (size_t i = 0; i < m; ++i)
    if (s.in_flight_lease_left_ns[i] < -1 || s.in_flight_held_ns[i] < 0)
      throw InvalidArgument(concat("state_dict: in-flight prompt ", s.in_flight_prompt[i], " has lease_left_ns=",
                                   s.in_flight_lease_left_ns[i], " and held_ns=", s.in_flight_held_ns[i],
                                   "; expected -1 (no lease) or >= 0, and >= 0"));
  if (auto dup = first_duplicate(s.in_flight_prompt.data(), static_cast<int64_t>(m)))
    throw InvalidArgument(concat("state_dict: prompt ", *dup, " is in flight twice"));
  for (size_t i = 0; i < m; ++i)
    if (s.in_flight_step[i] < 0 || s.in_flight_step[i] > s.clock)
      throw InvalidArgument(concat("state_dict: in-flight prompt ", s.in_flight_prompt[i], " has step ",
                                   s.in_flight_step[i], " outside [0, clock=", s.clock, "]"));
  std::unordered_set<int64_t> live;
  if (config_.unique_ids) {
    live.reserve(un);
    for (int64_t i = 0; i < n; ++i)
      if (!live.insert(s.traj_id[i]).second)
        throw InvalidArgument(concat("state_dict: trajectory ", s.traj_id[i],
                                     " is ready twice, which unique_ids=True forbids; load it into a buffer without "
                                     "unique_ids"));
  }
  Ledger ledger = s.ledger;
  ledger.in_flight = static_cast<int64_t>(m);
  ledger.buffer_left = n;
  if (!ledger.balanced() || s.evicted_unreported < 0 || s.evicted_unreported > ledger.evicted)
    throw InvalidArgument("state_dict: the ledger does not balance with the entries it holds; it was edited or is corrupt");

  Lock lock(mutex_);
  check_open();
  const ColumnPointers& c = columns_.get();
  bool sorted = true;
  for (int64_t i = 0; i < n; ++i) {
    c.traj_id[i] = s.traj_id[i], c.group_id[i] = s.group_id[i], c.sample_step[i] = s.sample_step[i];
    c.policy_version[i] = s.policy_version[i], c.dispatch_ns[i] = s.dispatch_ns[i];
    c.complete_ns[i] = s.complete_ns[i], c.uses[i] = s.uses[i], c.group_len[i] = s.group_len[i];
    if (i > 0 && s.sample_step[i] < s.sample_step[i - 1]) sorted = false;
  }
  head_ = 0;
  size_ = n;
  sorted_ = sorted;
  in_flight_.clear();
  const int64_t now = lease_now();
  for (size_t i = 0; i < m; ++i) {
    // A restored lease keeps the time it had left when exported; the time since dispatch likewise.
    const int64_t left = s.in_flight_lease_left_ns[i];
    const int64_t held = std::min(s.in_flight_held_ns[i], now);
    in_flight_.insert(s.in_flight_prompt[i], {s.in_flight_step[i], s.in_flight_dispatch_ns[i], now - held,
                                              left < 0 ? kNoLease : add_saturating(now, left)});
  }
  ledger.released_overflow = ledger_.released_overflow;  // about this object's release log, not the state
  ledger_ = ledger;
  live_ids_.swap(live);
  clock_ = s.clock;
  evicted_unreported_ = s.evicted_unreported;
  ready_cv_.notify_all();
  room_cv_.notify_all();
}

std::string StalenessRing::debug_string() const {
  Lock lock(mutex_);
  return concat("StalenessBuffer(capacity=", config_.capacity, ", max_age=", max_age_, ", strategy='",
                strategy_name(config_.strategy), "', max_uses=", config_.max_uses, ", on_full='",
                on_full_name(config_.on_full), "', ready=", size_, ", in_flight=", in_flight_.size(),
                ", clock=", clock_, ", pinned=", columns_.borrowed() ? "True" : "False",
                closed_ ? ", closed=True" : "", ")");
}

}  // namespace pyfast_buffer
