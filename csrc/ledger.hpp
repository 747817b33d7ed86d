// The exact account of every prompt and trajectory the buffer has seen.
#pragma once

#include <cstdint>

namespace pyfast_buffer {

/// Cumulative counters, updated under the ring's lock together with the data they describe.
struct Ledger {
  int64_t dispatched = 0;     // prompts dispatched (put counts each group as one)
  int64_t completed = 0;      // prompts completed (put counts each group as one)
  int64_t failed = 0;         // prompts failed, expired ones included
  int64_t put_total = 0;      // trajectories that entered the ring (sampled_total)
  int64_t taken = 0;          // uses: entries handed out in batches, counting reuse
  int64_t retired = 0;        // trajectories that reached max_uses and left the ring
  int64_t dropped_stale = 0;  // trajectories dropped because age > max_age
  int64_t evicted = 0;        // trajectories pushed out of a full ring by on_full=evict_oldest
  int64_t in_flight = 0;      // prompts dispatched and neither completed nor failed
  int64_t buffer_left = 0;    // trajectories ready in the ring
  int64_t max_age_changes = 0;  // set_max_age calls that changed max_age
  int64_t expired = 0;          // prompts failed by the buffer: lease passed, or expire_in_flight
  int64_t released_overflow = 0;  // released-id records discarded unread (log full); not part of any state
  int64_t admitted = 0;           // prompts (put: groups) the pace admission rule let in; <= dispatched
  int64_t admission_refused = 0;  // prompts of dispatch/put calls pace refused (AdmissionError or timeout)
  int64_t admission_waits = 0;    // dispatch/put calls that waited for admission under pace
  int64_t trained_over_age = 0;   // uses taken at age > max_age (pace and wait; 0 under drop); <= taken
  int64_t protected_admitted = 0;  // pace: admitted prompts that were protected attempts (max_attempts); <= admitted
  int64_t admitted_ahead = 0;      // pace: protected dispatch calls admitted while an unprotected call waited
  int64_t retired_early = 0;       // pace, max_uses > 1: trajectories retired after one use, below max_uses; <= retired

  /// Largest counter a checkpoint may carry: far beyond any real run, and small enough that the
  /// sums below and the next increments cannot overflow int64.
  static constexpr int64_t kMaxCounter = int64_t{1} << 60;

  /// Returns true iff every counter lies in [0, kMaxCounter].
  bool in_range() const {
    for (int64_t v : {dispatched, completed, failed, put_total, taken, retired, dropped_stale, evicted, in_flight,
                      buffer_left, max_age_changes, expired, admitted, admission_refused, admission_waits,
                      trained_over_age, protected_admitted, admitted_ahead, retired_early})
      if (v < 0 || v > kMaxCounter) return false;
    return true;
  }

  /// Returns true iff the invariants of docs/design.md ("The ledger") hold (call it on counters that are in_range()).
  bool balanced() const {
    return put_total == retired + dropped_stale + evicted + buffer_left &&
           dispatched == completed + failed + in_flight && 0 <= expired && expired <= failed &&
           admitted <= dispatched && trained_over_age <= taken && protected_admitted <= admitted &&
           retired_early <= retired;
  }
};

}  // namespace pyfast_buffer
