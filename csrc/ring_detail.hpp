// Private to the core's ring_*.cpp files: the helpers they share. Not installed, never seen by bindings.cpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>

#include "staleness_ring.hpp"

namespace pyfast_buffer {

using SteadyClock = std::chrono::steady_clock;

/// Returns the wall clock in nanoseconds since the epoch (the dispatch and complete stamps).
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Returns the steady clock in nanoseconds (the lease clock unless set_lease_clock froze it).
inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch()).count();
}

/// Returns the steady time `seconds` from now.
inline SteadyClock::time_point deadline_after(double seconds) {
  // Callers validated `seconds`; the clamp keeps NaN, negatives and huge values away from chrono regardless.
  const double clamped = seconds >= 0 ? std::min(seconds, kMaxSeconds) : 0.0;
  return SteadyClock::now() +
         std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(clamped));
}

/// Returns a + b for b >= 0, saturating below kNoLease so that a deadline never reads as "no lease".
inline int64_t add_saturating(int64_t a, int64_t b) {
  return a > kNoLease - 1 - b ? kNoLease - 1 : a + b;
}

/// Returns the strategy's name as the Python API spells it.
inline const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kDrop: return "drop";
    case Strategy::kWait: return "wait";
    default: return "pace";
  }
}

/// Returns the concatenation of `parts` as streamed text (error messages).
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

/// Returns `seconds` in whole nanoseconds, or throws InvalidArgument naming `name` unless it is finite,
/// > 0 (>= 0 with allow_zero) and <= kMaxSeconds.
int64_t checked_seconds_ns(double seconds, const char* name, bool allow_zero);

/// Throws InvalidArgument unless `timeout` is absent, kProbeTimeout or a valid number of seconds (>= 0).
inline void check_timeout(std::optional<double> timeout) {
  if (timeout && *timeout != kProbeTimeout) checked_seconds_ns(*timeout, "timeout", true);
}

/// Whether `timeout` asks for one attempt that throws WouldBlock instead of waiting (kProbeTimeout).
inline bool is_probe(std::optional<double> timeout) { return timeout && *timeout == kProbeTimeout; }

/// Returns the first id (in call order) that occurs twice in ids[0..n), if any, in a few ns per id.
std::optional<int64_t> first_duplicate(const int64_t* ids, int64_t n);

// Small members the hot paths of several ring_*.cpp files call: defined here, inline, so that splitting
// the ring into files keeps the inlining one file had (bench/perf_guard.py counts the instructions).

inline void StalenessRing::check_open() const {
  if (closed_) throw Closed("the buffer is closed; create a new buffer (or load its state_dict) to continue");
}

inline StalenessRing::SteadyTime StalenessRing::next_wake(SteadyTime deadline) const {
  SteadyTime wake = deadline;
  if (interrupt_check_) wake = std::min(wake, SteadyClock::now() + std::chrono::milliseconds(kInterruptCheckMs));
  const int64_t lease = in_flight_.earliest_deadline();
  if (lease != kNoLease && !manual_lease_clock_)  // the real lease clock is the steady clock
    wake = std::min(wake, SteadyTime(std::chrono::duration_cast<SteadyClock::duration>(
                              std::chrono::nanoseconds(lease))));
  return wake;
}

inline void StalenessRing::note_prefix_left(int64_t count, ReleaseReason reason) {
  const int64_t* traj_id = columns_.get().traj_id;
  for (int64_t i = 0; i < count; ++i) note_left(traj_id[phys(i)], reason);
}

// Appends one in-flight prompt to an export, its lease left and time in flight measured at `now`.
inline void append_in_flight(RingState& s, int64_t prompt, const InFlightPrompt& rec, int64_t now) {
  s.in_flight_prompt.push_back(prompt);
  s.in_flight_step.push_back(rec.sample_step);
  s.in_flight_dispatch_ns.push_back(rec.dispatch_ns);
  s.in_flight_meta.push_back(rec.meta);
  s.in_flight_lease_left_ns.push_back(rec.deadline_ns == kNoLease ? -1 : std::max<int64_t>(rec.deadline_ns - now, 0));
  s.in_flight_held_ns.push_back(std::max<int64_t>(now - rec.since_ns, 0));
}

inline void StalenessRing::remove_prefix(int64_t n) {
  marks_.removed_front(n);
  head_ = phys(n);
  size_ -= n;
  if (size_ == 0) head_ = 0, sorted_ = true, spans_ = false, plain_meta_ = !tagged_, lone_unused_ = true,
                    mirrored_ = true;
}

inline void StalenessRing::fill_state(TakeStats& stats) {
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
  stats.protected_admitted = ledger_.protected_admitted;
  stats.admitted_ahead = ledger_.admitted_ahead;
  stats.attempts = attempts_.totals();
}

}  // namespace pyfast_buffer
