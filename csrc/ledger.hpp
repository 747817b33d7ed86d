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

  /// Returns true iff both invariants of DESIGN.md hold.
  bool balanced() const {
    return put_total == retired + dropped_stale + evicted + buffer_left &&
           dispatched == completed + failed + in_flight && 0 <= expired && expired <= failed;
  }
};

}  // namespace pyfast_buffer
