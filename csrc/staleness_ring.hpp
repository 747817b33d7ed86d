// The staleness-aware ring: ready entries in columns, in-flight prompts, the ledger, one lock.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "errors.hpp"
#include "in_flight.hpp"
#include "ledger.hpp"
#include "monotonic_condition.hpp"
#include "mutex.hpp"
#include "release_log.hpp"
#include "ring_columns.hpp"
#include "thread_annotations.hpp"

namespace pyfast_buffer {

enum class Strategy : int { kDrop = 0, kWait = 1 };
enum class OnFull : int { kEvictOldest = 0, kBlock = 1, kError = 2 };
enum class BlockedBy : int { kNone = 0, kTooFewReady = 1, kInFlightAtMaxAge = 2 };

/// Largest capacity accepted: keeps every column's byte size far from int64 overflow.
constexpr int64_t kMaxCapacity = int64_t{1} << 40;

/// Longest timeout, lease or expire_in_flight age accepted, in seconds (about 31 years).
constexpr double kMaxSeconds = 1e9;

/// Longest a blocking call sleeps between two interrupt checks (see set_interrupt_check).
constexpr int64_t kInterruptCheckMs = 100;

/// Construction parameters; the constructor rejects out-of-range values.
struct RingConfig {
  int64_t capacity = 0;             // ready entries the ring holds (> 0)
  int64_t max_age = 0;              // largest trainable age in steps (>= 0)
  Strategy strategy = Strategy::kDrop;
  int64_t max_uses = 1;             // uses before an entry retires (>= 1)
  OnFull on_full = OnFull::kEvictOldest;
  int64_t parameter_sync_step = 0;  // > 0 stamps policy_version = step / it; 0 stamps -1
  bool track_released = false;      // keep a ReleaseLog of every id that leaves (see take_released)
  int64_t release_bound = 0;        // records that log holds (> 0), or 0 for default_release_bound(capacity)
  bool unique_ids = false;          // refuse a trajectory id that is already ready in the ring
};

/// Ids that left the buffer since the previous take_released(), oldest first, with ReleaseReason codes.
struct Released {
  std::vector<int64_t> ids;
  std::vector<int8_t> reasons;
};

/// Signed 128-bit integer: sums of ages, which can pass 2**63 (GCC and Clang extension).
__extension__ typedef __int128 Int128;

/// Number of fixed age-histogram buckets: 0, 1, 2-3, 4-7, 8-15, 16-31, 32-63, 64+.
constexpr int kAgeBuckets = 8;

/// Returns the age-histogram bucket of `age`: its bit length, capped at the last bucket (0 for age <= 0).
inline int age_bucket(int64_t age) {
  if (age <= 0) return 0;
  const int bits = 64 - __builtin_clzll(static_cast<unsigned long long>(age));
  return bits < kAgeBuckets - 1 ? bits : kAgeBuckets - 1;
}

/// Number of int64 columns a take writes: traj_id, group_id, sample_step, age, uses,
/// policy_version, dispatch_ns, complete_ns, in that order.
constexpr int kBatchColumns = 8;

/// Pointers to the output columns of one batch (see kBatchColumns for the order).
struct BatchColumns {
  int64_t* traj_id;
  int64_t* group_id;
  int64_t* sample_step;
  int64_t* age;
  int64_t* uses;
  int64_t* policy_version;
  int64_t* dispatch_ns;
  int64_t* complete_ns;
};

/// What one take or evict_stale did, and the ring's state right after it.
struct TakeStats {
  int64_t taken = 0;          // entries written to the batch
  int64_t dropped_stale = 0;  // entries this call dropped for age > max_age
  int64_t retired = 0;        // entries this call retired (reached max_uses)
  int64_t evicted = 0;        // entries on_full evicted since the previous take or evict_stale
  BlockedBy blocked_by = BlockedBy::kNone;
  Int128 age_sum = 0;  // exact: ages are < 2**63 and a batch holds < 2**40 entries
  int64_t age_max = 0;
  std::array<int64_t, kAgeBuckets> age_hist{};
  int64_t buffer_left = 0;
  int64_t in_flight = 0;
  int64_t sampled_total = 0;
  int64_t max_age = 0;  // the max_age in force for this call
  int64_t expired = 0;  // Ledger::expired after this call
};

/// The whole logical state in ring order (oldest first), as checkpoints store it.
struct RingState {
  std::vector<int64_t> traj_id, group_id, sample_step, policy_version, dispatch_ns, complete_ns;
  std::vector<int32_t> uses, group_len;
  std::vector<int64_t> in_flight_prompt, in_flight_step, in_flight_dispatch_ns;
  std::vector<int64_t> in_flight_lease_left_ns;  // lease time left when exported (>= 0), or -1 for no lease
  std::vector<int64_t> in_flight_held_ns;        // time in flight when exported (>= 0)
  Ledger ledger;
  int64_t clock = -1;               // largest step seen, -1 before any
  int64_t evicted_unreported = 0;   // evictions not yet reported by a take
};

/// Thread-safe staleness-aware ring buffer; every public method takes the one internal lock.
class StalenessRing {
 public:
  /// Builds an empty ring; `borrowed` (may be null) supplies caller-owned columns of capacity entries.
  /// Throws InvalidArgument for an out-of-range config and OutOfMemory if the columns cannot be allocated.
  StalenessRing(const RingConfig& config, const ColumnPointers* borrowed);
  StalenessRing(const StalenessRing&) = delete;
  StalenessRing& operator=(const StalenessRing&) = delete;

  /// Marks `n` prompts in flight since `sample_step`, each with a lease of `lease` seconds if given (> 0,
  /// finite, <= kMaxSeconds); throws InvalidArgument, changing nothing, if an id repeats or is in flight.
  void dispatch(const int64_t* prompt_ids, int64_t n, int64_t sample_step,
                std::optional<double> lease = std::nullopt) PFB_EXCLUDES(mutex_);

  /// Gives each of `n` in-flight prompts a lease of `lease` seconds from now; throws InvalidArgument,
  /// changing nothing, if an id repeats or is not in flight.
  void renew(const int64_t* prompt_ids, int64_t n, double lease) PFB_EXCLUDES(mutex_);

  /// Fails (as expired) every in-flight prompt dispatched at least `older_than` seconds ago (>= 0,
  /// finite); returns how many prompts this call expired, lease expiries included.
  int64_t expire_in_flight(double older_than) PFB_EXCLUDES(mutex_);

  /// Freezes the lease clock at `now_ns` (nullopt: back to the steady clock); a hook for deterministic tests.
  void set_lease_clock(std::optional<int64_t> now_ns) PFB_EXCLUDES(mutex_);

  /// Installs `check`, called without the lock at least every kInterruptCheckMs while a call blocks; it
  /// may throw to abort that call, which then changes nothing. Set it before the ring is shared.
  void set_interrupt_check(std::function<void()> check) { interrupt_check_ = std::move(check); }

  /// Moves each listed prompt's trajectories into the ring as one group stamped with its dispatch step; throws
  /// InvalidArgument, changing nothing, if a trajectory id repeats, a prompt is not in flight, or (unique_ids) an
  /// id is already ready; with on_full=block and a timeout, waits for room (interruptible, see set_interrupt_check).
  void complete(const int64_t* traj_ids, const int64_t* prompt_ids, int64_t n,
                std::optional<double> timeout) PFB_EXCLUDES(mutex_);

  /// Marks `n` prompts failed; throws InvalidArgument if one repeats or is not in flight.
  void fail(const int64_t* prompt_ids, int64_t n) PFB_EXCLUDES(mutex_);

  /// Dispatch + complete in one call; null `group_ids` makes each trajectory its own group, and
  /// `sample_steps` holds one stamp for all (`n_steps` == 1) or one per trajectory; refuses repeated ids (and,
  /// with unique_ids, ready ones) with InvalidArgument, changing nothing; waits for room as complete does.
  void put(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* sample_steps,
           int64_t n_steps, int64_t n, std::optional<double> timeout) PFB_EXCLUDES(mutex_);

  /// Takes up to `batch_size` entries under the strategy into `out` (room for kBatchColumns *
  /// batch_size int64), column f of a k-entry batch at out[f*k, f*k+k) so it is contiguous; without
  /// a timeout it never blocks, with one it waits for a full batch or throws Timeout naming the cause, waking
  /// at least every kInterruptCheckMs (when an interrupt check is set) and at the earliest lease deadline.
  TakeStats take(int64_t batch_size, int64_t current_step, std::optional<double> timeout, int64_t* out)
      PFB_EXCLUDES(mutex_);

  /// Drops every ready entry with age > max_age: a binary search when stamps are non-decreasing in
  /// ring order, else one branch-free compaction pass; returns what it did.
  TakeStats evict_stale(int64_t current_step) PFB_EXCLUDES(mutex_);

  /// Returns a consistent copy of the ledger (after failing prompts whose lease passed).
  Ledger ledger() PFB_EXCLUDES(mutex_);

  /// Moves out every released-id record kept since the previous call; throws InvalidArgument unless the ring
  /// was built with track_released.
  Released take_released() PFB_EXCLUDES(mutex_);

  /// Returns the max_age in force now.
  int64_t max_age() const PFB_EXCLUDES(mutex_);

  /// Sets max_age (>= 0, else InvalidArgument); the next take or evict_stale applies it to every ready
  /// entry, entries already dropped stay dropped; counts a change in Ledger::max_age_changes.
  void set_max_age(int64_t max_age) PFB_EXCLUDES(mutex_);

  /// Returns the number of ready entries.
  int64_t size() const PFB_EXCLUDES(mutex_);

  /// Returns the number of in-flight prompts (after failing prompts whose lease passed).
  int64_t in_flight() PFB_EXCLUDES(mutex_);

  /// Returns true iff close() has been called.
  bool closed() const PFB_EXCLUDES(mutex_);

  /// Closes the ring and wakes every waiter, which then throws Closed; calling it again does nothing.
  void close() PFB_EXCLUDES(mutex_);

  /// Returns a copy of the whole state, ready entries oldest first (after failing prompts whose lease passed).
  RingState export_state() PFB_EXCLUDES(mutex_);

  /// Replaces the whole state; throws InvalidArgument, changing nothing, if it is inconsistent or does not fit.
  void import_state(const RingState& state) PFB_EXCLUDES(mutex_);

  /// Returns a one-line description of configuration and state, for __repr__.
  std::string debug_string() const PFB_EXCLUDES(mutex_);

  /// Returns the configuration the ring was built with (its max_age is the initial one; see max_age()).
  const RingConfig& config() const { return config_; }

  /// Returns true iff the columns are borrowed from the caller (pinned memory).
  bool borrows_columns() const PFB_NO_THREAD_SAFETY_ANALYSIS {  // fixed at construction: no lock needed
    return columns_.borrowed();
  }

 private:
  // Every private member function below requires mutex_ held (PFB_REQUIRES, checked by Clang's
  // -Wthread-safety in the sanitizer stage); the public ones take it themselves (PFB_EXCLUDES).
  using SteadyTime = std::chrono::steady_clock::time_point;
  struct Span {
    int64_t start, count;  // logical indices [start, start + count) of entries to take
  };
  struct TakePlan {
    int64_t walked = 0, taken = 0, dropped = 0;
    bool full = false;
    BlockedBy blocked_by = BlockedBy::kNone;
    std::vector<Span> spans;  // runs of fresh entries the batch takes, oldest first
  };
  struct Groups {
    std::vector<int64_t> order;   // indices into the call's arrays, grouped stably
    std::vector<int64_t> bounds;  // group g is order[bounds[g] .. bounds[g + 1])
  };

  // ring_common.cpp: checks and notes shared by the calls.
  int64_t phys(int64_t logical) const PFB_REQUIRES(mutex_) {  // physical row of logical index `logical`
    const int64_t p = head_ + logical;
    return p >= config_.capacity ? p - config_.capacity : p;
  }
  void check_open() const PFB_REQUIRES(mutex_);  // throws Closed after close()
  void check_clock(int64_t current_step) const PFB_REQUIRES(mutex_);  // throws unless 0 <= clock_ <= step
  void check_not_live(const int64_t* traj_ids, int64_t n) const PFB_REQUIRES(mutex_);  // unique_ids refusal
  // Runs interrupt_check_ with mutex_ released, at most every kInterruptCheckMs; mutex_ is held again on return.
  void check_interrupt(SteadyTime& last_check) PFB_REQUIRES(mutex_);
  SteadyTime next_wake(SteadyTime deadline) const PFB_REQUIRES(mutex_);  // when a wait next wakes up
  bool leave_hooks() const PFB_REQUIRES(mutex_) { return release_log_ != nullptr || config_.unique_ids; }
  void note_left(int64_t id, ReleaseReason reason) PFB_REQUIRES(mutex_);  // one id leaves
  void note_prefix_left(int64_t count, ReleaseReason reason) PFB_REQUIRES(mutex_);  // the oldest `count` leave
  void note_walked(int64_t walked, int64_t current_step) PFB_REQUIRES(mutex_);  // a take's walked prefix leaves

  // ring_in_flight.cpp: the lease clock and expiry.
  int64_t lease_now() const PFB_REQUIRES(mutex_);
  int64_t expire_due() PFB_REQUIRES(mutex_);  // fails prompts whose lease passed; returns how many
  void expire_prompts(const std::vector<int64_t>& prompts) PFB_REQUIRES(mutex_);

  // ring_write.cpp: room, appends and on_full.
  // Returns true if n entries fit now (or on_full evicts); false once room appeared after a wait, mutex_
  // released meanwhile (the caller re-validates); throws Full or Timeout.
  bool wait_for_room(int64_t n, std::optional<double> timeout, const char* call, std::optional<SteadyTime>& deadline)
      PFB_REQUIRES(mutex_);
  void append_group(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* order, int64_t len,
                    int64_t group_id, int64_t sample_step, int64_t dispatch_ns, int64_t complete_ns)
      PFB_REQUIRES(mutex_);
  void append_runs(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* bounds, int64_t n_groups,
                   const int64_t* sample_steps, int64_t n_steps, int64_t n, int64_t stamp) PFB_REQUIRES(mutex_);
  void remove_prefix(int64_t n) PFB_REQUIRES(mutex_);  // drops the oldest n entries
  void evict_oldest_groups(int64_t need) PFB_REQUIRES(mutex_);  // whole groups until `need` entries fit

  // ring_take.cpp: planning and committing a batch.
  bool wait_blocked(int64_t current_step) const PFB_REQUIRES(mutex_);
  std::string wait_blocked_message(int64_t current_step) const PFB_REQUIRES(mutex_);
  int64_t skip_stale(int64_t i, int64_t cutoff) const PFB_REQUIRES(mutex_);
  void plan_take(int64_t batch_size, int64_t current_step, TakePlan& plan) const PFB_REQUIRES(mutex_);
  void commit_take(const TakePlan& plan, int64_t current_step, int64_t* out, TakeStats& stats) PFB_REQUIRES(mutex_);
  void fill_state(TakeStats& stats) PFB_REQUIRES(mutex_);  // the ring's state after a take or evict_stale

  const RingConfig config_;  // as constructed (immutable); max_age_ below is the one in force
  RingColumns columns_ PFB_GUARDED_BY(mutex_);
  mutable Mutex mutex_;
  MonotonicCondition ready_cv_;       // consumers: entries arrived, prompts finished, or closed
  MonotonicCondition room_cv_;        // producers: room freed, or closed
  int64_t head_ PFB_GUARDED_BY(mutex_) = 0;
  int64_t size_ PFB_GUARDED_BY(mutex_) = 0;
  bool sorted_ PFB_GUARDED_BY(mutex_) = true;  // sample_step non-decreasing in ring order
  bool closed_ PFB_GUARDED_BY(mutex_) = false;
  int64_t clock_ PFB_GUARDED_BY(mutex_) = -1;
  int64_t max_age_ PFB_GUARDED_BY(mutex_);  // config_.max_age until set_max_age changes it
  int64_t evicted_unreported_ PFB_GUARDED_BY(mutex_) = 0;
  InFlightTable in_flight_ PFB_GUARDED_BY(mutex_);
  Ledger ledger_ PFB_GUARDED_BY(mutex_);
  std::optional<int64_t> manual_lease_clock_ PFB_GUARDED_BY(mutex_);  // set_lease_clock's frozen time, if any
  std::unique_ptr<ReleaseLog> release_log_ PFB_GUARDED_BY(mutex_);    // null unless config_.track_released
  std::unordered_set<int64_t> live_ids_ PFB_GUARDED_BY(mutex_);       // ready ids, kept only with unique_ids
  std::function<void()> interrupt_check_;  // set before the ring is shared, then only read: no lock
};

}  // namespace pyfast_buffer
