// The staleness-aware ring: ready entries in columns, in-flight prompts, the ledger, one lock.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "admission.hpp"
#include "change_marks.hpp"
#include "entry_meta.hpp"
#include "errors.hpp"
#include "in_flight.hpp"
#include "ledger.hpp"
#include "monotonic_condition.hpp"
#include "mutex.hpp"
#include "prompt_attempts.hpp"
#include "release_log.hpp"
#include "ring_columns.hpp"
#include "thread_annotations.hpp"
#include "value_sketch.hpp"
#include "wake_fd.hpp"

namespace pyfast_buffer {

enum class Strategy : int { kDrop = 0, kWait = 1, kPace = 2 };
/// Which end of a trajectory's version span max_age is measured from: its dispatch step or its finish step.
enum class AgeFrom : int { kStart = 0, kFinish = 1 };
enum class OnFull : int { kEvictOldest = 0, kBlock = 1, kError = 2 };
enum class BlockedBy : int { kNone = 0, kTooFewReady = 1, kInFlightAtMaxAge = 2 };

/// Largest capacity accepted: keeps every column's byte size far from int64 overflow.
constexpr int64_t kMaxCapacity = int64_t{1} << 40;

/// Longest timeout, lease or expire_in_flight age accepted, in seconds (about 31 years).
constexpr double kMaxSeconds = 1e9;

/// Longest a blocking call sleeps between two interrupt checks (see set_interrupt_check).
constexpr int64_t kInterruptCheckMs = 100;

/// A timeout that makes a blocking call (dispatch, put or complete that must wait, take short of a full batch)
/// throw WouldBlock instead of waiting, changing and counting nothing: one attempt of an awaitable call. A tiny
/// negative number, so that a caller's mistaken -1 ("forever") is still refused as a negative timeout.
constexpr double kProbeTimeout = -0x1p-1000;

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
  int64_t prompts_per_step = 0;     // pace: prompt groups one training step takes (>= 1); 0 otherwise
  int64_t lookahead = 0;            // pace: steps generation may run ahead of training, in [0, max_age]; 0 otherwise
  AgeFrom age_from = AgeFrom::kStart;
  int64_t max_attempts = 0;         // > 0: a prompt's max_attempts-th untrained attempt is protected; 0: none
  int64_t attempts_bound = 0;       // prompt records kept (> 0), or 0 for default_attempts_bound(capacity)
};

/// Largest prompts_per_step accepted (the admission arithmetic runs in 128 bits, so any lookahead fits).
constexpr int64_t kMaxPromptsPerStep = int64_t{1} << 40;

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
/// policy_version, dispatch_ns, complete_ns, finish_step, source (-1: untagged), in that order.
constexpr int kBatchColumns = 10;

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
  int64_t* finish_step;
  int64_t* source;
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
  int64_t trained_over_age = 0;  // entries this call handed out at age > max_age
  Int128 span_sum = 0;           // sum of finish_step - sample_step over the batch (exact, as age_sum)
  int64_t span_max = 0;
  int64_t admitted = 0, admission_refused = 0, admission_waits = 0;  // the Ledger's, after this call
  int64_t protected_admitted = 0, admitted_ahead = 0;                 // the Ledger's, after this call
  int64_t retired_early = 0;  // pace, max_uses > 1: entries this call retired below max_uses (part of retired)
  std::array<int64_t, 6> attempts{};  // PromptAttempts::totals() after this call
  // (slot, taken, dropped) of every source slot this call took or dropped from, when any entry is tagged
  std::vector<std::array<int64_t, 3>> sources;
};

/// Cumulative counts of one source slot.
struct SourceCounts {
  int64_t dispatched = 0;  // prompts dispatched (put counts each group as one)
  int64_t generated = 0;   // trajectories that entered the ring
  int64_t taken = 0;       // uses handed out in batches
  int64_t trained = 0;     // trajectories taken for the first time
  int64_t dropped = 0;     // trajectories dropped stale
  int64_t evicted = 0;     // trajectories evicted by on_full
};

/// The whole logical state in ring order (oldest first), as checkpoints store it.
struct RingState {
  std::vector<int64_t> traj_id, group_id, sample_step, policy_version, dispatch_ns, complete_ns;
  std::vector<int64_t> finish_step;  // import: empty means "as sample_step" (state from before spans)
  std::vector<int32_t> uses, group_len;
  std::vector<int64_t> meta;  // per entry (entry_meta.hpp)
  std::vector<int64_t> in_flight_prompt, in_flight_step, in_flight_dispatch_ns, in_flight_meta;
  std::vector<int64_t> in_flight_lease_left_ns;  // lease time left when exported (>= 0), or -1 for no lease
  std::vector<int64_t> in_flight_held_ns;        // time in flight when exported (>= 0)
  Ledger ledger;
  int64_t clock = -1;               // largest step seen, -1 before any
  int64_t evicted_unreported = 0;   // evictions not yet reported by a take
  int64_t next_take = 0;            // pace: the step the trainer's next take is expected at (docs/design.md)
  std::vector<AttemptRecord> attempts;  // least recently touched first
  AttemptCounters attempt_counters;
  std::array<SourceCounts, kSourceSlots> source_counts{};
};

/// What changed since the previous export_delta (the Ray index's journal, docs/ray.md): with `runs` as triples
/// (changed, from, len), the ready entries are, run by run, the next `changed` entries of `rows` then the
/// previous export's entries [from, from + len), and after the last run the rest of `rows`; in-flight prompts
/// and attempt records as changed rows and removed ids; every scalar and counter whole.
struct RingDelta {
  RingState rows;  // entries, in-flight prompts and attempts as described above; scalars and counters whole
  std::vector<int64_t> runs;  // (changed, from, len) per kept run of the previous export (RingChangeMarks)
  bool in_flight_all = false;           // rows.in_flight_* is the whole in-flight table
  std::vector<int64_t> in_flight_gone;  // prompts no longer in flight
  bool attempts_all = false;            // rows.attempts is the whole table
  int64_t attempts_moved = 0;           // rows.attempts[0:attempts_moved] is the table's new tail, oldest first
  std::vector<int64_t> attempts_gone;   // prompts whose attempts record was dropped
  int64_t now_ns = 0;                   // the lease clock the in-flight rows' lease_left/held are measured at
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
  /// `slots` (null: all untagged) holds one source slot (0 untagged, s + 1 for source s) for all (`n_slots` == 1)
  /// or one per prompt. Under pace, admits all `n` or none: without a timeout a call that does not fit throws AdmissionFull, with
  /// one it waits (interruptible) until admissible() allows it, or throws Timeout; both change only the counters.
  void dispatch(const int64_t* prompt_ids, int64_t n, int64_t sample_step,
                std::optional<double> lease = std::nullopt, std::optional<double> timeout = std::nullopt,
                const int32_t* slots = nullptr, int64_t n_slots = 0)
      PFB_EXCLUDES(mutex_);

  /// Returns how many prompts stamped `step` a dispatch may start now under pace (docs/design.md, "pace");
  /// throws InvalidArgument under another strategy.
  int64_t admissible(int64_t step) PFB_EXCLUDES(mutex_);

  /// Gives each of `n` in-flight prompts a lease of `lease` seconds from now; throws InvalidArgument,
  /// changing nothing, if an id repeats or is not in flight.
  void renew(const int64_t* prompt_ids, int64_t n, double lease) PFB_EXCLUDES(mutex_);

  /// Under age_from="finish", raises to `step` the stamp of every in-flight prompt stamped below it (the weights
  /// of `step` now write them: an in-flight weight update) and returns how many it raised; throws InvalidArgument
  /// (after expiring passed leases, as every call does) under age_from="start", for a negative `step`, or for a
  /// `step` past the trainer's next step (pace's next take; else one past the largest step seen).
  int64_t restamp_in_flight(int64_t step) PFB_EXCLUDES(mutex_);

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
  /// `lengths` (null: none) holds one response length (>= 0, < 2**32 - 1) per trajectory.
  /// `finish_steps` holds none (`n_finish` == 0: each prompt's dispatch step), one or `n` finish steps, each
  /// >= the prompt's dispatch step; under age_from=finish a group shares one.
  void complete(const int64_t* traj_ids, const int64_t* prompt_ids, int64_t n, std::optional<double> timeout,
                const int64_t* finish_steps = nullptr, int64_t n_finish = 0, const int64_t* lengths = nullptr)
      PFB_EXCLUDES(mutex_);

  /// Marks `n` prompts failed; throws InvalidArgument if one repeats or is not in flight.
  void fail(const int64_t* prompt_ids, int64_t n) PFB_EXCLUDES(mutex_);

  /// Dispatch + complete in one call; null `group_ids` makes each trajectory its own group, and
  /// `sample_steps` holds one stamp for all (`n_steps` == 1) or one per trajectory; refuses repeated ids (and,
  /// with unique_ids, ready ones) with InvalidArgument, changing nothing; waits for room as complete does.
  /// `slots` (null: untagged) holds one source slot for all (`n_slots` == 1) or one per trajectory; a group
  /// shares one. `finish_steps` as complete's (each >= its entry's sample step); under pace the groups are admitted as a
  /// dispatch's prompts are, the same timeout bounding both waits.
  void put(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* sample_steps,
           int64_t n_steps, int64_t n, std::optional<double> timeout, const int64_t* finish_steps = nullptr,
           int64_t n_finish = 0, const int32_t* slots = nullptr, int64_t n_slots = 0) PFB_EXCLUDES(mutex_);

  /// Takes up to `batch_size` entries under the strategy into `out` (room for kBatchColumns *
  /// batch_size int64), column f of a k-entry batch at out[f*k, f*k+k) so it is contiguous; without
  /// a timeout it never blocks, with one it waits for a full batch or throws Timeout naming the cause, waking
  /// at least every kInterruptCheckMs (when an interrupt check is set) and at the earliest lease deadline.
  /// With `bounded` false this one call ignores max_age (and per-source bounds): nothing is dropped stale and
  /// wait's in-flight gate does not hold it; entries handed out past max_age count in trained_over_age; refused
  /// (InvalidArgument) under pace, whose admission is the bound's promise. max_age itself is never changed.
  TakeStats take(int64_t batch_size, int64_t current_step, std::optional<double> timeout, int64_t* out,
                 bool bounded = true) PFB_EXCLUDES(mutex_);

  /// Drops every ready entry with age > max_age: a binary search when stamps are non-decreasing in
  /// ring order, else one branch-free compaction pass; returns what it did.
  TakeStats evict_stale(int64_t current_step) PFB_EXCLUDES(mutex_);

  /// Evicts the oldest `groups` whole groups (all if fewer are ready), counted as evicted as on_full does;
  /// returns how many entries left. Throws InvalidArgument if groups < 0, BufferClosed once closed.
  int64_t evict_oldest(int64_t groups) PFB_EXCLUDES(mutex_);

  /// Makes every change that may let a waiter proceed also write a byte to `fd` (non-blocking, kept open by the
  /// caller; -1: none), once per arm_wake(): how an event loop learns that an awaited call may succeed now.
  void set_wake_fd(int fd) { wake_.set(fd); }

  /// Lets the next such change write its byte (call it before looking at the ring again).
  void arm_wake() { wake_.arm(); }

  /// Returns the earliest lease deadline of an in-flight prompt (steady-clock ns), or -1: a waiting call may
  /// succeed then (the prompt expires) with no other change to announce it.
  int64_t next_lease_deadline_ns() PFB_EXCLUDES(mutex_);

  /// Counts an awaiting dispatch of `n` prompts (n == 0: a put) among the admission waiters until
  /// end_admission_wait, so a protected one holds the others back as a blocking one does; returns whether it is
  /// protected (pass that to end_admission_wait).
  bool begin_admission_wait(const int64_t* prompt_ids, int64_t n) PFB_EXCLUDES(mutex_);

  /// Ends a begin_admission_wait; a protected waiter leaving wakes the others.
  void end_admission_wait(bool protected_call) PFB_EXCLUDES(mutex_);

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

  /// Sets the max_age of source slot `slot` (1 .. kSourceSlots - 1) to `max_age` (>= 0), or back to the
  /// ring's max_age with -1; throws InvalidArgument otherwise. Applies from the next take or evict_stale
  /// (not counted in Ledger::max_age_changes, which counts set_max_age).
  void set_source_max_age(int32_t slot, int64_t max_age) PFB_EXCLUDES(mutex_);

  /// Returns the max_age override of every source slot (-1: none), slot 0 first.
  std::array<int64_t, kSourceSlots> source_max_ages() const PFB_EXCLUDES(mutex_);

  /// Returns (prompt_id, attempts) of every remembered prompt with >= `min_attempts` attempts and nothing
  /// trained, by prompt id.
  std::vector<std::pair<int64_t, int64_t>> starved(int64_t min_attempts) const PFB_EXCLUDES(mutex_);

  /// Returns the attempt counters.
  AttemptCounters attempt_counters() const PFB_EXCLUDES(mutex_);

  /// Returns the cumulative counts of every source slot, slot 0 first.
  std::array<SourceCounts, kSourceSlots> source_counts() const PFB_EXCLUDES(mutex_);

  /// Returns a copy of the bias monitor, or null before the first dispatch (nothing monitored yet).
  std::unique_ptr<BiasMonitor> bias() const PFB_EXCLUDES(mutex_);

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

  /// Returns what changed since the previous call (everything on the first call, or with `full`) and begins a
  /// new interval; expires nothing. Tracking the in-flight and attempts tables starts with the first call.
  RingDelta export_delta(bool full) PFB_EXCLUDES(mutex_);

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
    int64_t pace_blocker = -1;  // pace: the in-flight stamp that blocked the take, when blocked_by says so
    bool full = false;
    bool unbounded = false;  // this call takes without the age bound (take's `bounded` false): nothing is stale
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
  // Moves clock_ up to a producer's sample_step (dispatch, put); remembers that a stamp set it.
  void advance_clock_by_stamp(int64_t sample_step) PFB_REQUIRES(mutex_);
  // Moves clock_ up to the trainer's step (take, evict_stale); the trainer has then reached every stamp.
  void advance_clock_by_trainer(int64_t current_step) PFB_REQUIRES(mutex_);
  void check_not_live(const int64_t* traj_ids, int64_t n) const PFB_REQUIRES(mutex_);  // unique_ids refusal
  // Runs interrupt_check_ with mutex_ released, at most every kInterruptCheckMs; mutex_ is held again on return.
  void check_interrupt(SteadyTime& last_check) PFB_REQUIRES(mutex_);
  // Why a take planned as `plan` is short of a full batch (the cause in its Timeout or WouldBlock message).
  std::string take_short_cause(const TakePlan& plan, int64_t batch_size, int64_t current_step) const
      PFB_REQUIRES(mutex_);
  SteadyTime next_wake(SteadyTime deadline) const PFB_REQUIRES(mutex_);  // when a wait next wakes up
  bool leave_hooks() const PFB_REQUIRES(mutex_) { return release_log_ != nullptr || config_.unique_ids; }
  void note_left(int64_t id, ReleaseReason reason) PFB_REQUIRES(mutex_);  // one id leaves
  void note_prefix_left(int64_t count, ReleaseReason reason) PFB_REQUIRES(mutex_);  // the oldest `count` leave
  void note_walked(int64_t walked, int64_t current_step, bool unbounded) PFB_REQUIRES(mutex_);  // a take's walked prefix
  // The one stamp below which a take at current_step drops an entry when no per-entry bound applies:
  // current_step - max_age under drop; none (INT64_MIN) under wait and pace, and for an unbounded take.
  int64_t take_cutoff(int64_t current_step, bool unbounded) const PFB_REQUIRES(mutex_);
  // ring_state.cpp: the ledger, clock, pace step, attempt counters and source counts into an export.
  void export_scalars(RingState& s) const PFB_REQUIRES(mutex_);

  // ring_in_flight.cpp: the lease clock and expiry.
  int64_t lease_now() const PFB_REQUIRES(mutex_);
  int64_t expire_due() PFB_REQUIRES(mutex_);  // fails prompts whose lease passed; returns how many
  void expire_prompts(const std::vector<int64_t>& prompts) PFB_REQUIRES(mutex_);
  // Throws InvalidArgument naming the first of the n prompts that is already in flight.
  void check_not_in_flight(const int64_t* prompt_ids, int64_t n) const PFB_REQUIRES(mutex_);

  // ring_write.cpp: room, appends and on_full.
  // Returns true if n entries fit now (or on_full evicts); false once room appeared after a wait, mutex_
  // released meanwhile (the caller re-validates); throws Full or Timeout.
  bool wait_for_room(int64_t n, std::optional<double> timeout, const char* call, std::optional<SteadyTime>& deadline)
      PFB_REQUIRES(mutex_);
  void append_group(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* order, int64_t len,
                    int64_t group_id, int64_t sample_step, int64_t dispatch_ns, int64_t complete_ns,
                    const int64_t* finish_steps, int64_t n_finish, int64_t meta) PFB_REQUIRES(mutex_);
  void append_runs(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* bounds, int64_t n_groups,
                   const int64_t* sample_steps, int64_t n_steps, int64_t n, int64_t stamp,
                   const int64_t* finish_steps, int64_t n_finish, const int32_t* slots, int64_t n_slots)
      PFB_REQUIRES(mutex_);
  void note_spans(int64_t first, int64_t count) PFB_REQUIRES(mutex_);  // sets spans_ if an appended entry spans
  void remove_prefix(int64_t n) PFB_REQUIRES(mutex_);  // drops the oldest n entries
  void evict_oldest_groups(int64_t need) PFB_REQUIRES(mutex_);  // whole groups until `need` entries fit
  void evict_prefix(int64_t count) PFB_REQUIRES(mutex_);  // the oldest `count` entries leave as evicted

  // ring_take.cpp: planning and committing a batch.
  bool wait_blocked(int64_t current_step) const PFB_REQUIRES(mutex_);
  std::string wait_blocked_message(int64_t current_step) const PFB_REQUIRES(mutex_);
  // The first ring index >= i whose stamp in `stamps` (age stamps or expiry_) is not below `cutoff`.
  int64_t skip_stale(const int64_t* stamps, int64_t i, int64_t cutoff) const PFB_REQUIRES(mutex_);
  void plan_take(int64_t batch_size, int64_t current_step, TakePlan& plan) const PFB_REQUIRES(mutex_);
  // Closes a walk's open span at `walked` and records its totals (touches only `plan`).
  static void finish_plan(TakePlan& plan, int64_t span_start, int64_t walked, int64_t taken);
  void apply_pace_gate(TakePlan& plan, int64_t current_step) const PFB_REQUIRES(mutex_);  // pace: blocks the take
  void commit_take(const TakePlan& plan, int64_t current_step, int64_t* out, TakeStats& stats) PFB_REQUIRES(mutex_);
  void fill_state(TakeStats& stats) PFB_REQUIRES(mutex_);  // the ring's state after a take or evict_stale

  // ring_admission.cpp: strategy="pace". A paced ring stays sorted by age stamp, so oldest first is ring order.
  bool paced() const { return config_.strategy == Strategy::kPace; }
  const int64_t* age_steps() const PFB_REQUIRES(mutex_) {  // the column ages are measured from
    return config_.age_from == AgeFrom::kFinish ? columns_.get().finish_step : columns_.get().sample_step;
  }
  int64_t pace_next_take() const PFB_REQUIRES(mutex_) {  // the step of the trainer's next take
    return std::max<int64_t>(next_take_, clock_ < 0 ? 0 : clock_);
  }
  int64_t pace_room(int64_t step) const PFB_REQUIRES(mutex_);  // admissible(step), the lock held
  int64_t restamp_limit() const PFB_REQUIRES(mutex_) {  // the largest step restamp_in_flight accepts
    if (paced()) return pace_next_take();  // never moves t0
    const int64_t clock = clock_ < 0 ? 0 : clock_;
    return clock == std::numeric_limits<int64_t>::max() ? clock : clock + 1;  // the weights after the latest step
  }
  void check_pace_call_size(int64_t groups, const char* call) const;  // InvalidArgument past the whole limit
  bool pace_admits(const StepCounts& groups, int64_t total) const PFB_REQUIRES(mutex_);
  // Returns true if the groups are admitted now; false once admitted after a wait, mutex_ released meanwhile
  // (the caller re-validates); throws AdmissionFull or Timeout, counting the refusal. A call that is not
  // `protected_call` is not admitted while a protected one waits (docs/design.md, "protected attempts first").
  bool wait_for_admission(const StepCounts& groups, int64_t total, int64_t first_step, bool protected_call,
                          std::optional<double> timeout, const char* call, std::optional<SteadyTime>& deadline,
                          bool& waited) PFB_REQUIRES(mutex_);
  // True iff dispatching these prompts now would start a protected (max_attempts) attempt; changes nothing.
  bool holds_protected_attempt(const int64_t* prompt_ids, int64_t n) const PFB_REQUIRES(mutex_);
  std::string admission_message(const StepCounts& groups, int64_t total, int64_t first_step) const
      PFB_REQUIRES(mutex_);
  std::string protected_waiting_message() const PFB_REQUIRES(mutex_);  // names the protected calls waiting
  void pace_restore_order() PFB_REQUIRES(mutex_);  // stable sort by age stamp, if an append broke the order
  void pace_count_ready() PFB_REQUIRES(mutex_);    // rebuilds ready_groups_ from the entries
  void pace_forget_prefix(int64_t count) PFB_REQUIRES(mutex_);   // the oldest `count` entries leave
  void pace_forget_retired(int64_t walked) PFB_REQUIRES(mutex_);  // a take's retired groups leave
  std::optional<int64_t> pace_blocker_for(const TakePlan& plan, int64_t current_step) const PFB_REQUIRES(mutex_);
  std::string pace_blocked_message(int64_t stamp, int64_t current_step) const PFB_REQUIRES(mutex_);

  // ring_accounting.cpp: what the bound does to the data (docs/data-bias.md).
  bool per_entry_cutoffs() const PFB_REQUIRES(mutex_) { return overrides_ > 0 || protected_seen_; }
  void check_slots(const int32_t* slots, int64_t n_slots, int64_t n, const char* what) const;
  // Makes expiry_ current and sets the step stale_at compares with: current_step under drop or when
  // `any_strategy` (evict_stale applies the bounds under either strategy), else none (wait keeps everything).
  void fill_cutoffs(int64_t current_step, bool any_strategy) const PFB_REQUIRES(mutex_);
  bool stale_at(int64_t p) const PFB_REQUIRES(mutex_) { return expiry_[static_cast<size_t>(p)] < expiry_cut_; }
  int64_t expiry_of(int64_t p) const PFB_REQUIRES(mutex_);  // row p's stale-before step, from its stamp and meta
  void ensure_expiry() const PFB_REQUIRES(mutex_);          // rebuilds expiry_ (O(ready)) unless it is current
  void stamp_expiry(int64_t first, int64_t count) PFB_REQUIRES(mutex_);  // appended entries, if expiry_ is kept
  // Counts a take's walked prefix (uses already counted) per source, in the monitor and the attempt table.
  void observe_walked(int64_t walked, int64_t current_step, bool first_use_always, bool unbounded, TakeStats& stats)
      PFB_REQUIRES(mutex_);
  void observe_lost(int64_t count, bool evicted) PFB_REQUIRES(mutex_);  // the oldest `count` entries leave
  void observe_lost_group(int64_t p, bool evicted) PFB_REQUIRES(mutex_);  // the group at row p leaves
  void add_group(Fate fate, int64_t p, int64_t len) PFB_REQUIRES(mutex_);  // the group at row p into the monitor

  const RingConfig config_;  // as constructed (immutable); max_age_ below is the one in force
  RingColumns columns_ PFB_GUARDED_BY(mutex_);
  mutable Mutex mutex_;
  WakeFd wake_;  // every condition below signals it too (set_wake_fd): the awaitable API's wake-ups
  MonotonicCondition ready_cv_;       // consumers: entries arrived, prompts finished, or closed
  MonotonicCondition room_cv_;        // producers: room freed, or closed
  int64_t head_ PFB_GUARDED_BY(mutex_) = 0;
  int64_t size_ PFB_GUARDED_BY(mutex_) = 0;
  RingChangeMarks marks_ PFB_GUARDED_BY(mutex_);  // the entries changed since export_delta
  bool sorted_ PFB_GUARDED_BY(mutex_) = true;  // age stamps (age_steps()) non-decreasing in ring order
  bool spans_ PFB_GUARDED_BY(mutex_) = false;  // a ready entry has finish_step != sample_step (else no span sums)
  bool closed_ PFB_GUARDED_BY(mutex_) = false;
  int64_t clock_ PFB_GUARDED_BY(mutex_) = -1;
  // True while clock_ is a producer's stamp (dispatch/put) above every trainer step seen: check_clock then
  // blames the stamp, not the trainer.
  bool clock_from_stamp_ PFB_GUARDED_BY(mutex_) = false;
  int64_t max_age_ PFB_GUARDED_BY(mutex_);  // config_.max_age until set_max_age changes it
  int64_t evicted_unreported_ PFB_GUARDED_BY(mutex_) = 0;
  InFlightTable in_flight_ PFB_GUARDED_BY(mutex_);
  Ledger ledger_ PFB_GUARDED_BY(mutex_);
  std::optional<int64_t> manual_lease_clock_ PFB_GUARDED_BY(mutex_);  // set_lease_clock's frozen time, if any
  std::unique_ptr<ReleaseLog> release_log_ PFB_GUARDED_BY(mutex_);    // null unless config_.track_released
  std::unordered_set<int64_t> live_ids_ PFB_GUARDED_BY(mutex_);       // ready ids, kept only with unique_ids
  std::function<void()> interrupt_check_;  // set before the ring is shared, then only read: no lock
  ReadyGroups ready_groups_ PFB_GUARDED_BY(mutex_);  // pace: ready groups by age stamp, in step with the entries
  int64_t next_take_ PFB_GUARDED_BY(mutex_) = 0;     // pace: one past the step of the latest take
  MonotonicCondition admit_cv_;  // pace producers: a slot freed (take, fail, expiry, load, max_age), a protected
                                 // waiter left, or closed
  int64_t protected_waiting_ PFB_GUARDED_BY(mutex_) = 0;    // pace: protected dispatch calls waiting for admission
  int64_t unprotected_waiting_ PFB_GUARDED_BY(mutex_) = 0;  // pace: other dispatch/put calls waiting for admission
  // What the bound does to the data (docs/data-bias.md): attempts, per-source bounds and counts, the monitor.
  PromptAttempts attempts_ PFB_GUARDED_BY(mutex_);
  std::unique_ptr<BiasMonitor> bias_ PFB_GUARDED_BY(mutex_);                // allocated at the first dispatch
  std::array<int64_t, kSourceSlots> source_max_age_ PFB_GUARDED_BY(mutex_);  // -1: the ring's max_age
  int64_t overrides_ PFB_GUARDED_BY(mutex_) = 0;                             // slots with an override
  bool protected_seen_ PFB_GUARDED_BY(mutex_) = false;  // a protected entry may be in the ring
  bool tagged_ PFB_GUARDED_BY(mutex_) = false;          // a tagged entry or prompt may exist
  bool plain_meta_ PFB_GUARDED_BY(mutex_) = true;  // every ready entry's meta is kPutMeta: moving it is skippable
  // Every ready entry is its own group (group_len 1) and was never taken (uses 0): the scalar compaction of
  // evict_stale then skips those two columns, whose every live row already holds the value it would copy.
  bool lone_unused_ PFB_GUARDED_BY(mutex_) = true;
  // Every ready entry came from an ungrouped put without finish steps: its group_id is its traj_id, its
  // finish_step its sample_step and its complete_ns its dispatch_ns, so the compaction reads three columns of
  // the six and writes the other three from them.
  bool mirrored_ PFB_GUARDED_BY(mutex_) = true;
  std::vector<int64_t> compact_scratch_ PFB_GUARDED_BY(mutex_);  // evict_stale's blocks, allocated at its first pass
  std::array<SourceCounts, kSourceSlots> source_counts_ PFB_GUARDED_BY(mutex_){};
  // The per-entry stale-before column (docs/design.md, "The take walk"): expiry_[p] is row p's age stamp plus its
  // own source's max_age (saturating), INT64_MAX when protected, so an entry is stale at step s iff
  // expiry_[p] < s and the tagged walk compares one column with one scalar, as the untagged walk does. Allocated
  // at the first per-entry take; kept current by every append and move while expiry_valid_, which a changed bound,
  // a load or a reorder clears (the next walk rebuilds it in one pass).
  mutable std::vector<int64_t> expiry_ PFB_GUARDED_BY(mutex_);
  mutable bool expiry_valid_ PFB_GUARDED_BY(mutex_) = false;
  mutable int64_t expiry_cut_ PFB_GUARDED_BY(mutex_) = 0;  // what stale_at compares with (fill_cutoffs)
};

}  // namespace pyfast_buffer
