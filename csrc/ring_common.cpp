// StalenessRing: construction, argument checks, the clock check, interrupts and wake-ups, release notes.
#include "ring_detail.hpp"

#include <cmath>
#include <limits>
#include <vector>

namespace pyfast_buffer {

int64_t checked_seconds_ns(double seconds, const char* name, bool allow_zero) {
  const bool ok = std::isfinite(seconds) && (allow_zero ? seconds >= 0 : seconds > 0) && seconds <= kMaxSeconds;
  if (!ok)
    throw InvalidArgument(concat(name, "=", seconds, " must be a finite number of seconds ",
                                 allow_zero ? ">= 0" : "> 0", " and <= ", kMaxSeconds));
  return static_cast<int64_t>(seconds * 1e9);
}

// An open-addressing table of one flat array: no allocation per id, so the check costs a few ns per id on
// every put and dispatch.
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
  if (config.max_attempts < 0 || config.max_attempts > std::numeric_limits<int32_t>::max())
    throw InvalidArgument(concat("max_attempts=", config.max_attempts, " must be >= 1 (or 0 for no cap)"));
  if (config.attempts_bound < 0)
    throw InvalidArgument(concat("attempts_bound=", config.attempts_bound, " must be > 0 (or 0 for the default)"));
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
      max_age_(config.max_age),
      attempts_(config.attempts_bound > 0 ? config.attempts_bound : default_attempts_bound(config.capacity)) {
  source_max_age_.fill(-1);
  for (MonotonicCondition* cv : {&ready_cv_, &room_cv_, &admit_cv_}) cv->set_wake(&wake_);
  if (config_.track_released)
    release_log_ = std::make_unique<ReleaseLog>(config_.release_bound > 0 ? config_.release_bound
                                                                          : default_release_bound(config_.capacity));
}

void StalenessRing::note_left(int64_t id, ReleaseReason reason) {
  if (release_log_ && release_log_->push(id, reason)) ++ledger_.released_overflow;
  if (config_.unique_ids && reason <= ReleaseReason::kEvicted) live_ids_.erase(id);  // trajectories only
}

void StalenessRing::note_walked(int64_t walked, int64_t current_step, bool unbounded) {
  // The walked prefix after a take's writes: stale entries were dropped, the rest taken; those at max_uses retire.
  const int64_t cutoff = take_cutoff(current_step, unbounded);
  const ColumnPointers& c = columns_.get();
  const int64_t* ages = age_steps();
  const bool per_entry = !unbounded && per_entry_cutoffs();
  for (int64_t i = 0; i < walked; ++i) {
    const int64_t p = phys(i);
    if (per_entry ? stale_at(p) : ages[p] < cutoff)
      note_left(c.traj_id[p], ReleaseReason::kDroppedStale);
    else if (c.uses[p] >= config_.max_uses || paced())  // under pace every use is the last (commit_take)
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
  MutexLock lock(mutex_);
  if (!release_log_)
    throw InvalidArgument("released(): this buffer does not track released ids; construct it with track_released=True");
  Released out;
  release_log_->drain(out.ids, out.reasons);
  return out;
}

void StalenessRing::check_clock(int64_t current_step) const {
  if (current_step < 0)
    throw InvalidArgument(concat("current_step=", current_step, " is negative; steps are ints >= 0"));
  if (current_step < clock_ && clock_from_stamp_)
    throw InvalidArgument(concat(
        "current_step=", current_step, " is lower than step ", clock_,
        ", which a dispatch or put stamped as its sample_step, ahead of the trainer: a stamp is the step of the "
        "weights that generated the data, never above the trainer's current step; stamp producers with the "
        "trainer's step (or its last weight push), or pass the trainer's real global step here"));
  if (current_step < clock_)
    throw InvalidArgument(concat("current_step=", current_step, " is lower than step ", clock_,
                                 " of an earlier take or evict_stale; the trainer's step never goes back, pass "
                                 "the current global step"));
}

void StalenessRing::advance_clock_by_stamp(int64_t sample_step) {
  if (sample_step <= clock_) return;
  clock_ = sample_step;
  clock_from_stamp_ = true;
}

void StalenessRing::advance_clock_by_trainer(int64_t current_step) {
  if (current_step < clock_) return;
  clock_ = current_step;
  clock_from_stamp_ = false;
}

void StalenessRing::check_interrupt(SteadyTime& last_check) {
  if (!interrupt_check_) return;
  const SteadyTime now = SteadyClock::now();
  if (now - last_check < std::chrono::milliseconds(kInterruptCheckMs)) return;
  last_check = now;
  MutexUnlock unlocked(mutex_);  // the check may take the GIL: never hold our lock while waiting for it
  interrupt_check_();  // throws to abort the call (mutex_ is taken back as it unwinds); nothing has changed yet
}

}  // namespace pyfast_buffer
