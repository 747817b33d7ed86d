#include "staleness_ring.hpp"

#include "compact_rows.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
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

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kDrop: return "drop";
    case Strategy::kWait: return "wait";
    default: return "pace";
  }
}

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
  // Ids in strictly increasing order (how producers usually number trajectories) cannot repeat: one
  // branch-free pass decides, and the table below is built only for other orders.
  bool increasing = true;
  for (int64_t i = 1; i < n; ++i) increasing &= ids[i] > ids[i - 1];
  if (increasing) return std::nullopt;
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
  if (config.strategy == Strategy::kPace) {
    if (config.prompts_per_step < 1 || config.prompts_per_step > kMaxPromptsPerStep)
      throw InvalidArgument(concat("prompts_per_step=", config.prompts_per_step, " must be in [1, ", kMaxPromptsPerStep,
                                   "]: the prompt groups one training step takes"));
    if (config.lookahead < 0 || config.lookahead > config.max_age)
      throw InvalidArgument(concat("lookahead=", config.lookahead, " must be in [0, max_age=", config.max_age, "]"));
  } else if (config.prompts_per_step != 0 || config.lookahead != 0) {
    throw InvalidArgument("prompts_per_step and lookahead are used only by strategy='pace'; leave them unset");
  }
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
  const int64_t* ages = age_steps();
  for (int64_t i = 0; i < walked; ++i) {
    const int64_t p = phys(i);
    if (ages[p] < cutoff)
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
  if (n > 0 && paced()) admit_cv_.notify_all();  // their slots are free
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

void StalenessRing::dispatch(const int64_t* prompt_ids, int64_t n, int64_t sample_step, std::optional<double> lease,
                             std::optional<double> timeout) {
  const int64_t lease_ns = lease ? checked_seconds_ns(*lease, "lease", false) : 0;
  check_timeout(timeout);
  Lock lock(mutex_);
  check_open();
  expire_due();
  if (sample_step < 0) throw InvalidArgument(concat("step=", sample_step, " is negative; steps are ints >= 0"));
  if (auto dup = first_duplicate(prompt_ids, n))
    throw InvalidArgument(concat("prompt_ids: prompt ", *dup, " appears twice; dispatch each prompt once"));
  if (paced() && n > 0) check_pace_call_size(n, "dispatch");
  const StepCounts asked = paced() && n > 0 ? StepCounts{{sample_step, n}} : StepCounts{};
  std::optional<SteadyTime> wait_until;
  bool waited = false;
  for (;;) {  // validate, then wait for admission; after a wait, validate again (another thread may have dispatched)
    for (int64_t i = 0; i < n; ++i)
      if (in_flight_.contains(prompt_ids[i]))
        throw InvalidArgument(concat("prompt_ids: prompt ", prompt_ids[i], " is already in flight (dispatched at step ",
                                     in_flight_.at(prompt_ids[i]).sample_step,
                                     "); complete or fail it before dispatching it again"));
    if (asked.empty() || wait_for_admission(lock, asked, n, sample_step, timeout, "dispatch", wait_until, waited))
      break;
  }
  if (paced()) {
    ledger_.admitted += n;
    ledger_.admission_waits += waited;
  }
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
  if (n > 0 && paced()) admit_cv_.notify_all();
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
  admit_cv_.notify_all();  // so does a waiting paced dispatch
}

namespace {
// Groups indices 0..n) by key, groups in order of first appearance, members in call order; returns
// true iff every group is a contiguous run of the call (then `order` is 0..n).
bool group_stably(const int64_t* keys, int64_t n, std::vector<int64_t>& order, std::vector<int64_t>& bounds) {
  // GRPO groups arrive contiguous with increasing (or decreasing) ids: then runs of equal keys are
  // the groups, and no hash map is needed. A key seen in two runs breaks the monotony: the map decides.
  bounds.reserve(static_cast<size_t>(n) + 1);  // no regrowth: at most one group per entry
  bounds.assign(1, 0);
  int64_t ups = 0, downs = 0, prev = keys[0];
  for (int64_t i = 1; i < n; ++i) {
    const int64_t key = keys[i];
    if (key == prev) continue;
    ups += key > prev, downs += key < prev;
    bounds.push_back(i);
    prev = key;
  }
  if (ups == 0 || downs == 0) {
    bounds.push_back(n);
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
    return true;
  }
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
  return false;
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

namespace {
// Writes the `n` entries of one group at physical rows [p, p + n) (no wrap). Member j is the call's
// entry order[j], or j when `order` is null (then the ids are copied as blocks); restrict pointers
// tell the compiler the column stores cannot change the inputs, so nothing is reloaded per entry.
inline void write_group(const ColumnPointers& c, int64_t p, int64_t n, const int64_t* __restrict traj_ids,
                        const int64_t* __restrict group_ids, const int64_t* __restrict order, int64_t group_id,
                        int64_t step, int64_t finish, int64_t dispatch_ns, int64_t complete_ns, int32_t group_len) {
  int64_t* __restrict traj = c.traj_id + p;
  int64_t* __restrict group = c.group_id + p;
  if (n < 16) {  // a GRPO-sized group: one fused pass beats eight short column loops
    int64_t *__restrict step_col = c.sample_step + p, *__restrict finish_col = c.finish_step + p;
    int64_t *__restrict dispatch_col = c.dispatch_ns + p, *__restrict complete_col = c.complete_ns + p;
    int32_t *__restrict uses_col = c.uses + p, *__restrict len_col = c.group_len + p;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t src = order ? order[j] : j;
      traj[j] = traj_ids[src];
      group[j] = group_ids ? group_ids[src] : group_id;
      step_col[j] = step, finish_col[j] = finish, dispatch_col[j] = dispatch_ns, complete_col[j] = complete_ns;
      uses_col[j] = 0, len_col[j] = group_len;
    }
    return;
  }
  if (order) {
    for (int64_t j = 0; j < n; ++j) traj[j] = traj_ids[order[j]];
    if (group_ids)
      for (int64_t j = 0; j < n; ++j) group[j] = group_ids[order[j]];
    else
      std::fill_n(group, n, group_id);
  } else {
    std::copy_n(traj_ids, n, traj);
    if (group_ids)
      std::copy_n(group_ids, n, group);
    else
      std::fill_n(group, n, group_id);
  }
  std::fill_n(c.sample_step + p, n, step);
  std::fill_n(c.finish_step + p, n, finish);
  std::fill_n(c.dispatch_ns + p, n, dispatch_ns);
  std::fill_n(c.complete_ns + p, n, complete_ns);
  std::fill_n(c.uses + p, n, 0);
  std::fill_n(c.group_len + p, n, group_len);
}
}  // namespace

void StalenessRing::append_group(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* order,
                                 int64_t len, int64_t group_id, int64_t sample_step, int64_t dispatch_ns,
                                 int64_t complete_ns, const int64_t* finish_steps, int64_t n_finish) {
  const ColumnPointers c = columns_.get();  // local copies: the column stores cannot alias them
  const int64_t cap = config_.capacity;
  int64_t p = head_ + size_;
  p -= p >= cap ? cap : 0;
  const int64_t* const members = order;  // the call's indices of the members, before the fast path below drops them
  // One finish step for the whole group, or the dispatch step; one per trajectory is written below.
  const int64_t finish = n_finish == 1 ? finish_steps[0] : sample_step;
  const int64_t age_stamp = config_.age_from == AgeFrom::kFinish && n_finish > 1
                                ? finish_steps[members ? members[0] : 0]
                                : (config_.age_from == AgeFrom::kFinish ? finish : sample_step);
  if (size_ > 0 && age_stamp < age_steps()[p == 0 ? cap - 1 : p - 1]) sorted_ = false;
  // Members are in increasing call order; if the last is len - 1 past the first they are consecutive.
  if (order && order[len - 1] - order[0] == len - 1) {
    traj_ids += order[0];
    group_ids = group_ids ? group_ids + order[0] : nullptr;
    order = nullptr;
  }
  // At most two contiguous runs: up to the end of the columns, then from row 0.
  const int64_t first = std::min(len, cap - p);
  write_group(c, p, first, traj_ids, group_ids, order, group_id, sample_step, finish, dispatch_ns, complete_ns,
              static_cast<int32_t>(len));
  if (first < len) {
    const int64_t rest = len - first;
    write_group(c, 0, rest, order ? traj_ids : traj_ids + first, group_ids && !order ? group_ids + first : group_ids,
                order ? order + first : nullptr, group_id, sample_step, finish, dispatch_ns, complete_ns,
                static_cast<int32_t>(len));
  }
  if (n_finish > 1) {
    for (int64_t j = 0; j < len; ++j) c.finish_step[phys(size_ + j)] = finish_steps[members ? members[j] : j];
  }
  if (n_finish > 0 || config_.age_from == AgeFrom::kFinish) note_spans(size_, len);
  size_ += len;
  if (config_.unique_ids)
    for (int64_t j = 0; j < len; ++j) live_ids_.insert(traj_ids[order ? order[j] : j]);
}

void StalenessRing::append_runs(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* bounds,
                                int64_t n_groups, const int64_t* sample_steps, int64_t n_steps, int64_t n,
                                int64_t stamp, const int64_t* finish_steps, int64_t n_finish) {
  const ColumnPointers c = columns_.get();  // local copies: the column stores cannot alias them
  const int64_t cap = config_.capacity;
  const int64_t start = head_ + size_ >= cap ? head_ + size_ - cap : head_ + size_;
  // Sorted stays true iff the age stamps continue the ring's last one without a descent.
  const bool by_finish = config_.age_from == AgeFrom::kFinish && n_finish > 0;
  const int64_t* keys = by_finish ? finish_steps : sample_steps;
  const int64_t n_keys = by_finish ? n_finish : n_steps;
  int64_t prev = size_ > 0 ? age_steps()[start == 0 ? cap - 1 : start - 1] : std::numeric_limits<int64_t>::min();
  bool descends = false;
  for (int64_t i = 0; i < n_keys; ++i) descends |= keys[i] < prev, prev = keys[i];
  if (descends) sorted_ = false;
  for (int64_t done = 0, p = start; done < n; p = 0) {  // at most two contiguous runs
    const int64_t run = std::min(n - done, cap - p);
    std::copy_n(traj_ids + done, run, c.traj_id + p);
    std::copy_n((group_ids ? group_ids : traj_ids) + done, run, c.group_id + p);  // ungrouped: its own group
    if (n_steps == 1) {
      std::fill_n(c.sample_step + p, run, sample_steps[0]);
    } else {
      std::copy_n(sample_steps + done, run, c.sample_step + p);
    }
    if (n_finish == 0) {  // each trajectory finished with the weights it started with
      if (n_steps == 1)
        std::fill_n(c.finish_step + p, run, sample_steps[0]);
      else
        std::copy_n(sample_steps + done, run, c.finish_step + p);
    } else if (n_finish == 1) {
      std::fill_n(c.finish_step + p, run, finish_steps[0]);
    } else {
      std::copy_n(finish_steps + done, run, c.finish_step + p);
    }
    std::fill_n(c.dispatch_ns + p, run, stamp);
    std::fill_n(c.complete_ns + p, run, stamp);
    std::fill_n(c.uses + p, run, 0);
    if (!bounds) std::fill_n(c.group_len + p, run, 1);
    done += run;
  }
  if (bounds) {
    int32_t* group_len = c.group_len;
    for (int64_t g = 0, p = start; g < n_groups; ++g) {
      const int32_t len = static_cast<int32_t>(bounds[g + 1] - bounds[g]);
      if (p + len <= cap) {  // GRPO-sized groups: a plain loop, no call per group
        for (int32_t j = 0; j < len; ++j) group_len[p + j] = len;
        p = p + len == cap ? 0 : p + len;
      } else {
        for (int32_t j = 0; j < len; ++j, p = p + 1 == cap ? 0 : p + 1) group_len[p] = len;
      }
    }
  }
  if (n_finish > 0) note_spans(size_, n);
  size_ += n;
  if (config_.unique_ids)
    for (int64_t j = 0; j < n; ++j) live_ids_.insert(traj_ids[j]);
}

void StalenessRing::note_spans(int64_t first, int64_t count) {
  if (spans_) return;
  const ColumnPointers& c = columns_.get();
  for (int64_t i = first; i < first + count && !spans_; ++i) spans_ = c.finish_step[phys(i)] != c.sample_step[phys(i)];
}

void StalenessRing::remove_prefix(int64_t n) {
  head_ = phys(n);
  size_ -= n;
  if (size_ == 0) head_ = 0, sorted_ = true, spans_ = false;
}

void StalenessRing::evict_oldest_groups(int64_t need) {
  // Walks whole groups from the head with local cursors (the loads cannot alias them).
  const int32_t* group_len = columns_.get().group_len;
  const int64_t cap = config_.capacity, excess = size_ + need - cap;
  int64_t evicted = 0, head = head_;
  while (evicted < excess) {
    if (group_len[head] == 1 && excess - evicted >= 8 && cap - head >= 8) {  // eight singletons at once
      uint32_t not_one = 0;
      for (int j = 0; j < 8; ++j) not_one |= static_cast<uint32_t>(group_len[head + j] ^ 1);
      if (not_one == 0) {
        evicted += 8;
        head += 8;
        head -= head == cap ? cap : 0;
        continue;
      }
    }
    const int64_t len = group_len[head];
    evicted += len;
    head += len;
    head -= head >= cap ? cap : 0;
  }
  if (leave_hooks()) note_prefix_left(evicted, ReleaseReason::kEvicted);
  if (paced()) pace_forget_prefix(evicted);
  remove_prefix(evicted);
  ledger_.evicted += evicted;
  evicted_unreported_ += evicted;
}

void StalenessRing::complete(const int64_t* traj_ids, const int64_t* prompt_ids, int64_t n,
                             std::optional<double> timeout, const int64_t* finish_steps, int64_t n_finish) {
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
  if (n_finish != 0 && n_finish != 1 && n_finish != n)
    throw InvalidArgument(concat("finish_step: ", n_finish, " steps for ", n,
                                 " trajectories; pass one step or one per trajectory"));
  Groups groups;
  group_stably(prompt_ids, n, groups.order, groups.bounds);
  const size_t n_groups = groups.bounds.size() - 1;
  if (n_finish > 1 && config_.age_from == AgeFrom::kFinish)  // one age stamp per group
    for (size_t g = 0; g < n_groups; ++g) {
      const int64_t first = groups.order[groups.bounds[g]];
      for (int64_t k = groups.bounds[g] + 1; k < groups.bounds[g + 1]; ++k)
        if (finish_steps[groups.order[k]] != finish_steps[first])
          throw InvalidArgument(concat("finish_step: under age_from='finish' a group shares one finish step; group ",
                                       prompt_ids[first], " has finish_step ", finish_steps[first], " and ",
                                       finish_steps[groups.order[k]]));
    }
  std::optional<SteadyTime> deadline;
  for (;;) {  // validate, then wait for room; after a wait, validate again (another thread may have failed a prompt)
    expire_due();
    for (size_t g = 0; g < n_groups; ++g) {
      const int64_t prompt = prompt_ids[groups.order[groups.bounds[g]]];
      if (!in_flight_.contains(prompt))
        throw InvalidArgument(concat("prompt_ids: prompt ", prompt,
                                     " is not in flight; dispatch it first (it may already be "
                                     "completed, failed or expired)"));
      const int64_t started = in_flight_.at(prompt).sample_step;
      for (int64_t k = groups.bounds[g]; k < groups.bounds[g + 1] && n_finish > 0; ++k) {
        const int64_t finish = finish_steps[n_finish == 1 ? 0 : groups.order[k]];
        if (finish < started)
          throw InvalidArgument(concat("finish_step=", finish, " of trajectory ", traj_ids[groups.order[k]],
                                       " is before prompt ", prompt, " was dispatched at step ", started,
                                       "; pass the step of the weights in force when it finished (>= ", started, ")"));
      }
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
    append_group(traj_ids, nullptr, members, len, prompt, rec.sample_step, rec.dispatch_ns, stamp, finish_steps,
                 n_finish);
    if (paced()) ready_groups_.add(age_steps()[phys(size_ - 1)]);
    in_flight_.erase(prompt);
  }
  if (paced()) pace_restore_order();
  for (int64_t i = 0; i < n_finish; ++i) clock_ = std::max(clock_, finish_steps[i]);  // weights that existed
  ledger_.completed += static_cast<int64_t>(n_groups);
  ledger_.put_total += n;
  lock.unlock();  // wake consumers after the lock is free, so they do not wake only to block on it
  ready_cv_.notify_all();
  if (paced()) admit_cv_.notify_all();  // under age_from='finish' a completion can move a group's stamp forward
}

void StalenessRing::put(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* sample_steps,
                        int64_t n_steps, int64_t n, std::optional<double> timeout, const int64_t* finish_steps,
                        int64_t n_finish) {
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
  if (n_finish != 0 && n_finish != 1 && n_finish != n)
    throw InvalidArgument(concat("finish_step: ", n_finish, " steps for ", n,
                                 " trajectories; pass one step or one per trajectory"));
  for (int64_t i = 0; i < std::max(n_finish, n_finish > 0 ? n_steps : 0); ++i) {
    const int64_t finish = finish_steps[n_finish == 1 ? 0 : i], started = sample_steps[n_steps == 1 ? 0 : i];
    if (finish < started)
      throw InvalidArgument(concat("finish_step=", finish, " of trajectory ", traj_ids[i],
                                   " is before its sample_step=", started,
                                   "; pass the step of the weights in force when it finished"));
  }
  Groups groups;
  bool contiguous = true;
  if (group_ids) {
    contiguous = group_stably(group_ids, n, groups.order, groups.bounds);
    for (size_t g = 0; g + 1 < groups.bounds.size() && n_steps > 1; ++g) {
      const int64_t first = groups.order[groups.bounds[g]];
      for (int64_t k = groups.bounds[g] + 1; k < groups.bounds[g + 1]; ++k)
        if (sample_steps[groups.order[k]] != sample_steps[first])
          throw InvalidArgument(concat("sample_step: group ", group_ids[first], " has entries stamped ",
                                       sample_steps[first], " and ", sample_steps[groups.order[k]],
                                       "; a group shares one sample_step"));
    }
    for (size_t g = 0; g + 1 < groups.bounds.size() && n_finish > 1 && config_.age_from == AgeFrom::kFinish; ++g) {
      const int64_t first = groups.order[groups.bounds[g]];
      for (int64_t k = groups.bounds[g] + 1; k < groups.bounds[g + 1]; ++k)
        if (finish_steps[groups.order[k]] != finish_steps[first])
          throw InvalidArgument(concat("finish_step: under age_from='finish' a group shares one finish step; group ",
                                       group_ids[first], " has finish_step ", finish_steps[first], " and ",
                                       finish_steps[groups.order[k]]));
    }
  }
  // Under pace the groups are admitted like dispatched prompts, each at its age stamp.
  StepCounts asked;
  int64_t asked_groups = 0;
  if (paced()) {
    const bool by_finish = config_.age_from == AgeFrom::kFinish && n_finish > 0;
    auto stamp_of = [&](int64_t i) {
      return by_finish ? finish_steps[n_finish == 1 ? 0 : i] : sample_steps[n_steps == 1 ? 0 : i];
    };
    if (group_ids) {
      for (size_t g = 0; g + 1 < groups.bounds.size(); ++g) ++asked[stamp_of(groups.order[groups.bounds[g]])];
      asked_groups = static_cast<int64_t>(groups.bounds.size()) - 1;
    } else {
      for (int64_t i = 0; i < n; ++i) ++asked[stamp_of(i)];
      asked_groups = n;
    }
    check_pace_call_size(asked_groups, "put");
  }
  std::optional<SteadyTime> deadline;
  bool waited = false;
  for (;;) {  // after a wait, validate again: another thread may have put one of these ids
    check_not_live(traj_ids, n);
    if (paced() && !wait_for_admission(lock, asked, asked_groups, asked.begin()->first, timeout, "put", deadline,
                                       waited))
      continue;
    if (wait_for_room(lock, n, timeout, "put", deadline)) break;
  }
  if (paced()) {
    ledger_.admitted += asked_groups;
    ledger_.admission_waits += waited;
  }
  if (size_ + n > config_.capacity) evict_oldest_groups(n);
  const int64_t stamp = now_ns();
  int64_t n_groups = n;
  if (group_ids) n_groups = static_cast<int64_t>(groups.bounds.size()) - 1;
  if (contiguous) {  // ungrouped, or GRPO groups as they usually arrive: whole columns at once
    append_runs(traj_ids, group_ids, group_ids ? groups.bounds.data() : nullptr, n_groups, sample_steps, n_steps, n,
                stamp, finish_steps, n_finish);
  } else {
    for (int64_t g = 0; g < n_groups; ++g) {
      const int64_t* members = groups.order.data() + groups.bounds[g];
      const int64_t step = sample_steps[n_steps > 1 ? members[0] : 0];
      append_group(traj_ids, group_ids, members, groups.bounds[g + 1] - groups.bounds[g], 0, step, stamp, stamp,
                   finish_steps, n_finish);
    }
  }
  if (paced()) {
    for (const auto& [age_stamp, count] : asked) ready_groups_.add(age_stamp, count);
    pace_restore_order();
  }
  ledger_.dispatched += n_groups;
  ledger_.completed += n_groups;
  ledger_.put_total += n;
  clock_ = std::max(clock_, max_step);
  for (int64_t i = 0; i < n_finish; ++i) clock_ = std::max(clock_, finish_steps[i]);  // weights that existed
  lock.unlock();
  ready_cv_.notify_all();
}

int64_t StalenessRing::skip_stale(int64_t i, int64_t cutoff) const {
  // Scans contiguous physical runs without per-entry index arithmetic or dependent loads.
  const int64_t* steps = age_steps();
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
  plan.pace_blocker = -1;
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
  const int64_t* steps = age_steps();
  const int64_t size = size_, cap = config_.capacity;
  int64_t i = 0, taken = 0;
  int64_t p = head_;          // phys(i), advanced with i
  int64_t span_start = -1;    // start of the open span of fresh entries, -1 if none
  while (i < size) {
    if (steps[p] < cutoff) {  // a stale run: close the span, skip the run in contiguous scans
      if (span_start >= 0) plan.spans.push_back({span_start, i - span_start}), span_start = -1;
      const int64_t fresh = skip_stale(i, cutoff);
      plan.dropped += fresh - i;
      i = fresh;
      if (i == size) break;
      p = phys(i);
    }
    if (span_start < 0) span_start = i;
    // A run of fresh singletons (ungrouped puts) in one tight scan, up to the wrap point or the batch.
    if (group_len[p] == 1) {
      const int64_t limit = std::min({batch_size - taken, cap - p, size - i});
      int64_t k = 1;
      // Scalar first: a short run (fresh entries among stale ones) ends here at little cost.
      const int64_t warm = std::min<int64_t>(limit, 8);
      while (k < warm && group_len[p + k] == 1 && steps[p + k] >= cutoff) ++k;
      // A long run goes on eight at a time, branch-free: the OR of (stamp - cutoff) is negative iff one
      // stamp is stale. With cutoff <= 0 every stamp (>= 0) is fresh; above it no difference overflows.
      const int64_t floor = cutoff > 0 ? cutoff : 0;
      while (k >= 8 && limit - k >= 8) {
        uint64_t below = 0;
        uint32_t not_one = 0;
        for (int j = 0; j < 8; ++j) {
          below |= static_cast<uint64_t>(steps[p + k + j]) - static_cast<uint64_t>(floor);
          not_one |= static_cast<uint32_t>(group_len[p + k + j] ^ 1);
        }
        if ((below >> 63) != 0 || not_one != 0) break;
        k += 8;
      }
      while (k < limit && group_len[p + k] == 1 && steps[p + k] >= cutoff) ++k;
      taken += k, i += k, p += k;
      p -= p == cap ? cap : 0;
    }
    if (i == size || taken == batch_size) {
      plan.full = taken == batch_size;
      break;
    }
    if (steps[p] < cutoff) continue;
    const int64_t len = group_len[p];
    if (len > batch_size)
      throw InvalidArgument(concat("batch_size=", batch_size, " is smaller than group ", group_id[p], " of ", len,
                                   " trajectories; raise batch_size to at least ", len,
                                   " (a batch never splits a group)"));
    if (taken + len > batch_size) {
      plan.full = true;
      break;
    }
    taken += len;
    i += len;
    p += len;
    p -= p >= cap ? cap : 0;
    if (taken == batch_size) {
      plan.full = true;
      break;
    }
  }
  if (span_start >= 0 && i > span_start) plan.spans.push_back({span_start, i - span_start});
  plan.taken = taken;
  plan.walked = i;
  plan.blocked_by = plan.full ? BlockedBy::kNone : BlockedBy::kTooFewReady;
  if (paced()) {  // the oldest groups are the batch; take it only if no in-flight prompt then passes max_age
    if (const auto stamp = pace_blocker_for(plan, current_step)) {
      plan.walked = plan.taken = 0;
      plan.full = false;
      plan.spans.clear();
      plan.blocked_by = BlockedBy::kInFlightAtMaxAge;
      plan.pace_blocker = *stamp;
    }
  }
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
  int64_t* const o_finish = base + 8 * k_all;
  const int32_t max_uses = static_cast<int32_t>(config_.max_uses);
  const ColumnPointers c = columns_.get();  // a local copy: the output writes cannot alias it
  const int64_t* const ages = age_steps();
  const int64_t sync = config_.parameter_sync_step, max_age = max_age_;
  int64_t k = 0, survivors = 0, age_max = 0, over_age = 0;
  Int128 age_sum = 0;  // 2**40 ages near 2**63 overflow int64
  // With max_uses == 1 every taken entry retires and leaves with the walked prefix, so its ring `uses`
  // need not be written, unless the released-id hooks read it (note_walked) before it leaves.
  const bool uses_unread = max_uses == 1 && !leave_hooks();
  // Ages come in runs (a group shares one stamp, producers stamp many entries alike): the histogram
  // and the sums are updated once per run of equal ages, not once per entry.
  int64_t run_age = 0, run_count = 0;
  auto flush = [&] {
    if (run_count == 0) return;
    age_sum += static_cast<Int128>(run_age) * run_count;
    age_max = std::max(age_max, run_age);
    stats.age_hist[age_bucket(run_age)] += run_count;
    over_age += run_age > max_age ? run_count : 0;
  };
  for (const Span& span : plan.spans) {
    for (int64_t i = span.start, end = span.start + span.count; i < end;) {
      // One contiguous physical run: six column copies, then one pass for age and uses.
      const int64_t p0 = phys(i);
      const int64_t run = std::min(end - i, config_.capacity - p0);
      if (run < 16) {  // a short run (fresh entries scattered among stale ones): entry by entry
        for (int64_t p = p0; p < p0 + run; ++p, ++k) {
          const int64_t age = current_step - ages[p];
          const int32_t uses = uses_unread ? 1 : ++c.uses[p];
          o_traj[k] = c.traj_id[p], o_group[k] = c.group_id[p], o_step[k] = c.sample_step[p];
          o_age[k] = age, o_uses[k] = uses, o_version[k] = sync > 0 ? c.sample_step[p] / sync : -1;
          o_dispatch[k] = c.dispatch_ns[p], o_complete[k] = c.complete_ns[p], o_finish[k] = c.finish_step[p];
          if (age != run_age) flush(), run_age = age, run_count = 0;
          ++run_count;
          survivors += uses < max_uses;
        }
        i += run;
        continue;
      }
      std::copy_n(c.traj_id + p0, run, o_traj + k);
      std::copy_n(c.group_id + p0, run, o_group + k);
      std::copy_n(c.sample_step + p0, run, o_step + k);
      std::copy_n(c.finish_step + p0, run, o_finish + k);
      std::copy_n(c.dispatch_ns + p0, run, o_dispatch + k);
      std::copy_n(c.complete_ns + p0, run, o_complete + k);
      if (sync == 0) {  // policy_version is derived from sample_step: no column holds it
        std::fill_n(o_version + k, run, -1);
      } else if (sync == 1) {
        std::copy_n(c.sample_step + p0, run, o_version + k);
      } else {
        const int64_t* __restrict from = c.sample_step + p0;
        int64_t* __restrict version = o_version + k;
        for (int64_t j = 0; j < run; ++j) version[j] = from[j] / sync;
      }
      const int64_t* __restrict step = ages + p0;
      int64_t* __restrict age_out = o_age + k;
      const uint64_t first = static_cast<uint64_t>(step[0]);
      uint64_t differs = 0;
      for (int64_t j = 0; j < run; ++j) {  // vectorisable: ages, and whether any stamp differs from the first
        age_out[j] = current_step - step[j];
        differs |= static_cast<uint64_t>(step[j]) ^ first;
      }
      if (differs == 0) {  // one stamp for the whole run, the usual case: one histogram update
        const int64_t age = current_step - step[0];
        if (age != run_age) flush(), run_age = age, run_count = 0;
        run_count += run;
      } else {
        for (int64_t j = 0; j < run; ++j) {
          const int64_t age = age_out[j];
          if (age != run_age) flush(), run_age = age, run_count = 0;
          ++run_count;
        }
      }
      int64_t* __restrict uses_out = o_uses + k;
      int32_t* __restrict uses = c.uses + p0;
      if (uses_unread) {
        std::fill_n(uses_out, run, 1);  // uses 0 -> 1 for every entry
      } else {
        for (int64_t j = 0; j < run; ++j) {
          const int32_t u = ++uses[j];
          uses_out[j] = u;
          survivors += u < max_uses;
        }
      }
      k += run;
      i += run;
    }
  }
  flush();
  if (spans_) {  // some ready entry crossed a weight update: one pass over the batch for the span sums
    Int128 span_sum = 0;
    int64_t span_max = 0;
    for (int64_t j = 0; j < k_all; ++j) {
      const int64_t span = o_finish[j] - o_step[j];
      span_sum += span;
      span_max = std::max(span_max, span);
    }
    stats.span_sum = span_sum;
    stats.span_max = span_max;
  }
  if (leave_hooks()) note_walked(plan.walked, current_step);  // before survivors move: ring order intact
  if (paced()) pace_forget_retired(plan.walked);
  stats.age_sum = age_sum;
  stats.age_max = age_max;
  stats.trained_over_age = over_age;
  ledger_.trained_over_age += over_age;
  if (survivors > 0) {
    // Reused entries keep their place: move them, in order, to the end of the walked prefix.
    const int64_t cutoff = config_.strategy == Strategy::kDrop ? current_step - max_age_
                                                                : std::numeric_limits<int64_t>::min();
    int64_t write = plan.walked - 1;
    for (int64_t i = plan.walked - 1; i >= 0; --i) {
      const int64_t p = phys(i);
      if (ages[p] < cutoff || c.uses[p] >= max_uses) continue;
      const int64_t q = phys(write--);
      if (p == q) continue;
      c.traj_id[q] = c.traj_id[p], c.group_id[q] = c.group_id[p], c.sample_step[q] = c.sample_step[p];
      c.finish_step[q] = c.finish_step[p], c.dispatch_ns[q] = c.dispatch_ns[p];
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
  stats.admitted = ledger_.admitted;
  stats.admission_refused = ledger_.admission_refused;
  stats.admission_waits = ledger_.admission_waits;
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
                                ? (paced() ? pace_blocked_message(plan.pace_blocker, current_step)
                                           : wait_blocked_message(current_step))
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
  if (paced()) {
    // The trainer took at current_step: its next take is a step later (a retry at this step only finds
    // admission tighter by one step's slots, never looser).
    next_take_ = std::max(next_take_, current_step + 1);
    admit_cv_.notify_all();
  }
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
  const int64_t* const ages = age_steps();
  if (sorted_) {
    const int64_t* steps = ages;
    // Stamps are non-decreasing in ring order: the stale entries are a prefix.
    int64_t lo = 0, hi = size_;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (steps[phys(mid)] < cutoff) lo = mid + 1; else hi = mid;
    }
    removed = lo;
    if (leave_hooks()) note_prefix_left(removed, ReleaseReason::kDroppedStale);
    if (paced()) pace_forget_prefix(removed);
    remove_prefix(removed);
  } else {
    // One branch-free pass: every row is copied to the write cursor, which advances only for fresh
    // rows; where neither cursor is near the wrap point, eight rows at a time with AVX-512 if present.
    const ColumnPointers c = columns_.get();  // local copies: column stores cannot alias them
    const int64_t cap = config_.capacity, total = size_;
    if (leave_hooks())  // report the stale ids before the compaction (scalar or SIMD) overwrites them
      for (int64_t i = 0; i < total; ++i)
        if (ages[phys(i)] < cutoff) note_left(c.traj_id[phys(i)], ReleaseReason::kDroppedStale);
    const bool simd = simd_compaction_available();
    int64_t read = head_, write = head_, kept = 0;
    for (int64_t done = 0; done < total;) {
      if (simd) {
        const int64_t span = std::min({total - done, cap - read, cap - write}) / 8 * 8;
        if (span > 0) {
          const int64_t n_kept = compact_rows_simd(c, ages, read, write, span, cutoff);
          kept += n_kept, done += span, read += span, write += n_kept;
          read -= (read == cap) ? cap : 0;
          write -= (write == cap) ? cap : 0;
          if (span >= 64) continue;  // near the wrap point: fall through to a few scalar rows
        }
      }
      for (const int64_t stop = std::min(total, done + 64); done < stop; ++done) {
        const int64_t keep = ages[read] >= cutoff;
        c.traj_id[write] = c.traj_id[read];
        c.group_id[write] = c.group_id[read];
        c.sample_step[write] = c.sample_step[read];
        c.finish_step[write] = c.finish_step[read];
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
    for (int64_t i = 1, prev = ages[head_], p = phys(1); i < kept && sorted; ++i) {
      sorted = ages[p] >= prev;
      prev = ages[p];
      p = p + 1 == cap ? 0 : p + 1;
    }
    removed = size_ - kept;
    size_ = kept;
    sorted_ = sorted;
    if (size_ == 0) head_ = 0, spans_ = false;
    if (paced()) pace_count_ready();
  }
  ledger_.dropped_stale += removed;
  if (removed > 0) room_cv_.notify_all();
  if (removed > 0 && paced()) admit_cv_.notify_all();
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
  admit_cv_.notify_all();  // under pace, a raised bound gives lagged prompts more slots
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
  admit_cv_.notify_all();
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
  copy64(s.finish_step, c.finish_step), copy64(s.dispatch_ns, c.dispatch_ns);
  copy64(s.complete_ns, c.complete_ns), copy32(s.uses, c.uses), copy32(s.group_len, c.group_len);
  s.policy_version.resize(s.sample_step.size());
  for (size_t i = 0; i < s.sample_step.size(); ++i)
    s.policy_version[i] = config_.parameter_sync_step > 0 ? s.sample_step[i] / config_.parameter_sync_step : -1;
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
  s.next_take = next_take_;
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
  if (!s.finish_step.empty() && s.finish_step.size() != un)
    throw InvalidArgument("state_dict: finish_step and the other ready columns differ in length");
  const std::vector<int64_t>& finish = s.finish_step.empty() ? s.sample_step : s.finish_step;
  for (int64_t i = 0; i < n; ++i)
    if (finish[i] < s.sample_step[i] || finish[i] > s.clock)
      throw InvalidArgument(concat("state_dict: entry ", i, " has finish_step=", finish[i], " outside [sample_step=",
                                   s.sample_step[i], ", clock=", s.clock, "]"));
  if (s.next_take < 0 || s.next_take > Ledger::kMaxCounter)
    throw InvalidArgument(concat("state_dict: next_take=", s.next_take, " is outside [0, 2**60]; it was edited or is corrupt"));
  for (int64_t i = 0; i < n;) {
    const int64_t len = s.group_len[i];
    if (len < 1 || i + len > n)
      throw InvalidArgument(concat("state_dict: entry ", i, " has group_len=", len, " that does not fit the ring"));
    for (int64_t j = i; j < i + len; ++j) {
      if (s.group_len[j] != len || s.sample_step[j] != s.sample_step[i] || s.group_id[j] != s.group_id[i] ||
          s.uses[j] != s.uses[i])
        throw InvalidArgument(concat("state_dict: group at entry ", i, " is not contiguous and uniform"));
      if (config_.age_from == AgeFrom::kFinish && finish[j] != finish[i])
        throw InvalidArgument(concat("state_dict: group at entry ", i, " has finish steps ", finish[i], " and ",
                                     finish[j], ", which age_from='finish' forbids; load it with age_from='start'"));
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
  if (!ledger.in_range())
    throw InvalidArgument(concat("state_dict: a ledger counter lies outside [0, ", Ledger::kMaxCounter,
                                 "]; it was edited or is corrupt"));
  if (!ledger.balanced() || s.evicted_unreported < 0 || s.evicted_unreported > ledger.evicted)
    throw InvalidArgument("state_dict: the ledger does not balance with the entries it holds; it was edited or is corrupt");

  Lock lock(mutex_);
  check_open();
  const ColumnPointers& c = columns_.get();
  const std::vector<int64_t>& ages = config_.age_from == AgeFrom::kFinish ? finish : s.sample_step;
  bool sorted = true;
  for (int64_t i = 0; i < n; ++i) {
    c.traj_id[i] = s.traj_id[i], c.group_id[i] = s.group_id[i], c.sample_step[i] = s.sample_step[i];
    c.finish_step[i] = finish[i], c.dispatch_ns[i] = s.dispatch_ns[i];
    c.complete_ns[i] = s.complete_ns[i], c.uses[i] = s.uses[i], c.group_len[i] = s.group_len[i];
    if (i > 0 && ages[i] < ages[i - 1]) sorted = false;
  }
  head_ = 0;
  size_ = n;
  sorted_ = sorted;
  spans_ = false;
  note_spans(0, n);
  next_take_ = s.next_take;
  if (paced()) {
    pace_restore_order();
    pace_count_ready();
  }
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
  admit_cv_.notify_all();
}

std::string StalenessRing::debug_string() const {
  Lock lock(mutex_);
  return concat("StalenessBuffer(capacity=", config_.capacity, ", max_age=", max_age_, ", strategy='",
                strategy_name(config_.strategy), "', max_uses=", config_.max_uses, ", on_full='",
                on_full_name(config_.on_full), "'",
                paced() ? concat(", prompts_per_step=", config_.prompts_per_step, ", lookahead=", config_.lookahead) : "",
                config_.age_from == AgeFrom::kFinish ? ", age_from='finish'" : "", ", ready=", size_,
                ", in_flight=", in_flight_.size(),
                ", clock=", clock_, ", pinned=", columns_.borrowed() ? "True" : "False",
                closed_ ? ", closed=True" : "", ")");
}

// -- pace: admission at dispatch and put, the take gate, the stamp order (docs/design.md, "pace") --------------

int64_t StalenessRing::pace_room(int64_t step) const {
  return admissible_prompts(in_flight_.step_counts(), in_flight_.size(), ready_groups_, step, pace_next_take(),
                            max_age_, {config_.prompts_per_step, config_.lookahead});
}

bool StalenessRing::pace_admits(const StepCounts& groups, int64_t total) const {
  return admits(in_flight_.step_counts(), in_flight_.size(), ready_groups_, groups, total, pace_next_take(), max_age_,
                {config_.prompts_per_step, config_.lookahead});
}

int64_t StalenessRing::admissible(int64_t step) {
  if (!paced())
    throw InvalidArgument(concat("admissible(): only strategy='pace' admits prompts; this buffer's strategy is '",
                                 strategy_name(config_.strategy), "', which starts every dispatch at once"));
  if (step < 0) throw InvalidArgument(concat("step=", step, " is negative; steps are ints >= 0"));
  Lock lock(mutex_);
  expire_due();
  return pace_room(step);
}

void StalenessRing::check_pace_call_size(int64_t groups, const char* call) const {
  const Int128 limit = static_cast<Int128>(config_.lookahead + 1) * config_.prompts_per_step;
  if (groups > limit)
    throw InvalidArgument(concat(call == std::string("put") ? "traj_ids: " : "prompt_ids: ", groups,
                                 call == std::string("put") ? " groups" : " prompts", " exceed the admission limit ",
                                 static_cast<int64_t>(limit), " = (lookahead + 1) * prompts_per_step; ", call,
                                 " at most ", static_cast<int64_t>(limit), " per call"));
}

std::string StalenessRing::admission_message(const StepCounts& groups, int64_t total, int64_t first_step) const {
  const int64_t limit = (config_.lookahead + 1) * config_.prompts_per_step;
  const int64_t outstanding = in_flight_.size() + ready_groups_.total();
  const int64_t room = pace_room(first_step);
  std::ostringstream out;
  out << total << (groups.size() > 1 ? " groups" : " prompts") << " at step " << first_step
      << " do not fit strategy='pace': limit (lookahead + 1) * prompts_per_step = " << limit << " prompt groups, "
      << outstanding << " outstanding (" << in_flight_.size() << " in flight, " << ready_groups_.total()
      << " ready), " << room << " admissible now";
  if (room < limit - outstanding)
    out << "; prompts stamped " << first_step << " must be trained by step " << first_step + max_age_
        << " and the trainer's next take is at step " << pace_next_take() << ", so fewer slots remain for them";
  out << "; take (train) to free slots, fail stuck prompts, dispatch with newer weights, or raise lookahead";
  return out.str();
}

bool StalenessRing::wait_for_admission(Lock& lock, const StepCounts& groups, int64_t total, int64_t first_step,
                                       std::optional<double> timeout, const char* call,
                                       std::optional<SteadyTime>& deadline, bool& waited) {
  if (pace_admits(groups, total)) return true;
  if (first_step + max_age_ < pace_next_take()) {  // past its deadline already: no take can make room for it
    ledger_.admission_refused += total;
    throw AdmissionFull(concat(call, ": prompts stamped ", first_step, " would pass max_age=", max_age_,
                               " before the trainer's next take at step ", pace_next_take(),
                               ", so no wait can admit them; dispatch with newer weights (step >= ",
                               pace_next_take() - max_age_, ")"));
  }
  if (!timeout) {
    ledger_.admission_refused += total;
    throw AdmissionFull(concat(call, ": ", admission_message(groups, total, first_step),
                               "; or pass timeout= to wait for a slot"));
  }
  if (!deadline) deadline = deadline_after(*timeout);  // one deadline for every wait of the call
  waited = true;
  SteadyTime last_check = SteadyClock::now();
  for (;;) {
    admit_cv_.wait_until(lock, next_wake(*deadline));
    check_interrupt(lock, last_check);
    check_open();
    expire_due();
    if (pace_admits(groups, total)) return false;  // admitted after waiting: the caller re-validates its arguments
    if (SteadyClock::now() >= *deadline) break;
  }
  ledger_.admission_refused += total;
  ++ledger_.admission_waits;
  throw Timeout(concat(call, " timed out after ", *timeout, " s waiting for admission under pace: ",
                       admission_message(groups, total, first_step)));
}

void StalenessRing::pace_restore_order() {
  if (sorted_) return;
  // Entries out of stamp order arrived (a slow prompt finished after newer ones): a stable sort by age stamp
  // restores oldest first and keeps every group contiguous (its members share a stamp). O(ready), which
  // admission bounds by (lookahead + 1) * prompts_per_step groups.
  const ColumnPointers c = columns_.get();
  const int64_t* ages = age_steps();
  std::vector<int64_t> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return ages[phys(a)] < ages[phys(b)]; });
  std::vector<int64_t> wide(static_cast<size_t>(size_));
  for (int64_t* col : {c.traj_id, c.group_id, c.sample_step, c.finish_step, c.dispatch_ns, c.complete_ns}) {
    for (int64_t i = 0; i < size_; ++i) wide[i] = col[phys(order[i])];
    for (int64_t i = 0; i < size_; ++i) col[phys(i)] = wide[i];
  }
  std::vector<int32_t> narrow(static_cast<size_t>(size_));
  for (int32_t* col : {c.uses, c.group_len}) {
    for (int64_t i = 0; i < size_; ++i) narrow[i] = col[phys(order[i])];
    for (int64_t i = 0; i < size_; ++i) col[phys(i)] = narrow[i];
  }
  sorted_ = true;
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
  // The walked prefix of a paced take holds only taken groups (nothing is dropped); those at max_uses leave.
  const ColumnPointers& c = columns_.get();
  const int64_t* ages = age_steps();
  for (int64_t i = 0; i < walked; i += c.group_len[phys(i)])
    if (config_.max_uses == 1 || c.uses[phys(i)] >= config_.max_uses) ready_groups_.remove(ages[phys(i)]);
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
