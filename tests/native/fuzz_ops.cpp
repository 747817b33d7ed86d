// libFuzzer target: random operation sequences applied to two rings of one configuration, ring A with
// owned columns and the SIMD compaction (where the CPU has it), ring B with borrowed columns and the
// scalar compaction forced. After every operation both must agree (result, message, state), the state
// must satisfy ring_checks.hpp, the ledger must move as the operation says, and a call that threw must
// have changed nothing. Build and run: see docs/reliability-ci.md ("Fuzzing the core").
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "ring_checks.hpp"
#include "scalar_switch.hpp"
#include "staleness_ring.hpp"

// Core bugs this fuzzer found are fixed and fuzzed as any other input (docs/reliability-ci.md lists them):
//   K1: import_state accepted ledger counters near INT64_MAX; now bounded by Ledger::kMaxCounter.
//   K2: take's int64 age sum overflowed at steps near INT64_MAX; now summed in 128 bits.
//   K3: evict_stale's AVX-512 pass zeroed the meta of rows its scalar tail then moved without meta (a put-only
//       ring's shortcut); the vector pass now moves meta exactly when the scalar one does (simd-evict-meta-zeroed).
// And one bug of this file's own: its evict_stale model dropped protected (max_attempts) entries, which the core
// rightly keeps (check-evict-keeps-protected); fixing it, the model and same_state began to compare meta: K3.

namespace pfb = pyfast_buffer;
namespace chk = pyfast_buffer_checks;

namespace {

constexpr int64_t kMaxStep = std::numeric_limits<int64_t>::max();

// a + b for b >= 0, saturating at kMaxStep (the fuzzer's own arithmetic must not overflow).
int64_t sat_add(int64_t a, int64_t b) { return a > kMaxStep - b ? kMaxStep : a + b; }

// a + b wrapping around, as two's complement does: how the fuzzer corrupts a checkpoint field.
template <class T>
T wrap_add(T a, int64_t b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}

enum class Outcome { kOk, kInvalid, kFull, kTimeout, kClosed };

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kOk: return "ok";
    case Outcome::kInvalid: return "InvalidArgument";
    case Outcome::kFull: return "Full";
    case Outcome::kTimeout: return "Timeout";
    default: return "Closed";
  }
}

// What one operation returned; both rings must return the same.
struct Result {
  Outcome outcome = Outcome::kOk;
  std::string message;
  pfb::TakeStats stats;
  std::vector<int64_t> batch;  // the take's output, kBatchColumns columns of stats.taken rows
  int64_t count = 0;           // what expire_in_flight returned
};

// Runs `op` on `ring`, mapping the core's documented exceptions to an outcome; any other exception
// escapes and libFuzzer reports it as a crash.
Result run_guarded(const std::function<void(Result&)>& op) {
  Result r;
  try {
    op(r);
  } catch (const pfb::InvalidArgument& e) {
    r.outcome = Outcome::kInvalid, r.message = e.what();
  } catch (const pfb::Full& e) {
    r.outcome = Outcome::kFull, r.message = e.what();
  } catch (const pfb::Timeout& e) {
    r.outcome = Outcome::kTimeout, r.message = e.what();
  } catch (const pfb::Closed& e) {
    r.outcome = Outcome::kClosed, r.message = e.what();
  }
  return r;
}

bool same_stats(const pfb::TakeStats& a, const pfb::TakeStats& b) {
  return a.taken == b.taken && a.dropped_stale == b.dropped_stale && a.retired == b.retired &&
         a.evicted == b.evicted && a.blocked_by == b.blocked_by && a.age_sum == b.age_sum && a.age_max == b.age_max &&
         a.age_hist == b.age_hist && a.buffer_left == b.buffer_left && a.in_flight == b.in_flight &&
         a.sampled_total == b.sampled_total && a.max_age == b.max_age && a.expired == b.expired &&
         a.trained_over_age == b.trained_over_age && a.span_sum == b.span_sum && a.span_max == b.span_max &&
         a.admitted == b.admitted && a.admission_refused == b.admission_refused &&
         a.admission_waits == b.admission_waits && a.protected_admitted == b.protected_admitted &&
         a.admitted_ahead == b.admitted_ahead && a.retired_early == b.retired_early;
}

// Columns of a batch that do not depend on the wall clock (all but dispatch_ns and complete_ns, columns 6 and 7).
bool same_batch(const std::vector<int64_t>& a, const std::vector<int64_t>& b, int64_t k) {
  return a.size() == b.size() && std::equal(a.begin(), a.begin() + 6 * k, b.begin()) &&
         std::equal(a.begin() + 8 * k, a.end(), b.begin() + 8 * k);
}

// Caller-owned columns for ring B, as pinned-memory buffers are in Python.
struct BorrowedColumns {
  std::vector<int64_t> wide[7];
  std::vector<int32_t> narrow[2];
  pfb::ColumnPointers ptrs;
  explicit BorrowedColumns(int64_t capacity) {
    for (auto& c : wide) c.assign(static_cast<size_t>(capacity), -7);
    for (auto& c : narrow) c.assign(static_cast<size_t>(capacity), -7);
    ptrs.traj_id = wide[0].data(), ptrs.group_id = wide[1].data(), ptrs.sample_step = wide[2].data();
    ptrs.finish_step = wide[3].data(), ptrs.dispatch_ns = wide[4].data(), ptrs.complete_ns = wide[5].data();
    ptrs.meta = wide[6].data();
    ptrs.uses = narrow[0].data(), ptrs.group_len = narrow[1].data();
  }
};

// One fuzz input: the configuration, the two rings, and the fuzzer's view of the trainer step.
class Session {
 public:
  Session(FuzzedDataProvider& in, const pfb::RingConfig& config)
      : in_(in), config_(config), borrowed_(config.capacity), a_(config, nullptr), b_(config, &borrowed_.ptrs) {
    // Both rings read one frozen lease clock that only advance_lease_clock moves: leases are deterministic.
    a_.set_lease_clock(lease_now_);
    b_.set_lease_clock(lease_now_);
  }

  void run() {
    for (int ops = 0; ops < 400 && in_.remaining_bytes() > 0; ++ops) step_once();
    // Whatever the sequence did, the final state must survive a checkpoint into a fresh ring.
    roundtrip_into_fresh_ring(a_.export_state());
  }

 private:
  enum Op : uint8_t {
    kDispatch, kComplete, kFail, kPut, kTake, kEvict, kCheckpoint, kCorruptImport, kSetMaxAge, kRenew, kExpire,
    kAdvanceLeaseClock, kClose, kRestamp, kOps
  };

  // A step near the fuzzer's clock, or now and then a lower, negative or huge one.
  int64_t pick_step() {
    switch (in_.ConsumeIntegralInRange<int>(0, 15)) {
      case 0: return step_ > 0 ? step_ - in_.ConsumeIntegralInRange<int64_t>(1, 3) : -1;
      case 1: return kMaxStep - in_.ConsumeIntegralInRange<int64_t>(0, 2);
      default: {
        const int64_t s = sat_add(step_, in_.ConsumeIntegralInRange<int64_t>(0, 2));
        step_ = std::max(step_, s);
        return s;
      }
    }
  }

  int64_t pick_prompt() { return in_.ConsumeIntegralInRange<int64_t>(0, 15); }

  bool paced() const { return config_.strategy == pfb::Strategy::kPace; }

  // complete's finish steps: none, one for all, or one per trajectory at or after its prompt's dispatch step
  // (per prompt or per trajectory, so age_from='finish' sees uniform and split groups), now and then one before it.
  std::vector<int64_t> pick_finish_steps(const pfb::RingState& now, const std::vector<int64_t>& prompts) {
    std::vector<int64_t> finish;
    auto started = [&](int64_t prompt) {
      const size_t i = index_of(now.in_flight_prompt, prompt);
      return i < now.in_flight_step.size() ? now.in_flight_step[i] : step_;
    };
    switch (in_.ConsumeIntegralInRange<int>(0, 3)) {
      case 1:
        finish.push_back(sat_add(step_, in_.ConsumeIntegralInRange<int64_t>(0, 2)));
        break;
      case 2: {
        const int64_t offset = in_.ConsumeIntegralInRange<int64_t>(0, 2);
        for (const int64_t p : prompts) finish.push_back(sat_add(started(p), offset + (p & 1)));
        break;
      }
      case 3:
        for (const int64_t p : prompts)
          finish.push_back(sat_add(started(p), in_.ConsumeIntegralInRange<int64_t>(0, 2)) -
                           (in_.ConsumeIntegralInRange<int>(0, 15) == 0));
        break;
      default:
        break;
    }
    return finish;
  }

  // A fresh trajectory id, or (rarely) the previous one again, to exercise duplicate checks.
  int64_t pick_traj() { return in_.ConsumeIntegralInRange<int>(0, 31) == 0 ? next_traj_ : ++next_traj_; }

  int64_t pick_count(int64_t usual) {
    return in_.ConsumeIntegralInRange<int>(0, 7) == 0 ? in_.ConsumeIntegralInRange<int64_t>(0, config_.capacity + 2)
                                                      : in_.ConsumeIntegralInRange<int64_t>(0, usual);
  }

  std::optional<double> pick_timeout() {
    // Never a positive timeout: one thread, nobody else could make room or entries appear.
    return in_.ConsumeBool() ? std::nullopt : std::optional<double>(0.0);
  }

  // A lease in seconds: usually none, else a valid length, now and then one the core must refuse.
  std::optional<double> pick_lease(bool optional) {
    if (optional && in_.ConsumeBool()) return std::nullopt;
    return in_.PickValueInArray<double>({0.001, 0.5, 1.0, 5.0, 1e9, 0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                                         std::numeric_limits<double>::infinity(), 2e9});
  }

  // Seconds as the core converts them to nanoseconds.
  static int64_t to_ns(double seconds) { return static_cast<int64_t>(seconds * 1e9); }

  // A prompt id: one in flight now (most of the time) or any small id.
  int64_t pick_prompt_from(const pfb::RingState& now) {
    const bool known = !now.in_flight_prompt.empty() && in_.ConsumeIntegralInRange<int>(0, 7) != 0;
    return known ? now.in_flight_prompt[in_.ConsumeIntegralInRange<size_t>(0, now.in_flight_prompt.size() - 1)]
                 : pick_prompt();
  }

  // Applies `op` to ring A (SIMD allowed) and ring B (scalar forced) and checks the results agree.
  // Checks the released-id records of one call against the states around it: every trajectory that left
  // (ready before or added by the call, not ready after) and every prompt that left the in-flight table
  // other than by completing is reported exactly once, with the reason the ledger counted.
  void check_released(const pfb::Released& rel, const pfb::RingState& before, const pfb::RingState& after,
                      bool ok, const std::string& where) const {
    if (!ok) {
      if (!rel.ids.empty()) chk::fail_check(where + "\na call that threw released ids");
      return;
    }
    if (op_.replaces_state || after.ledger.released_overflow != before.ledger.released_overflow) return;
    std::multiset<int64_t> trajs(before.traj_id.begin(), before.traj_id.end());
    trajs.insert(op_.added_trajs.begin(), op_.added_trajs.end());
    auto remove = [&](std::multiset<int64_t>& from, int64_t id) {
      const auto it = from.find(id);
      if (it == from.end()) chk::fail_check(where + "\nid " + std::to_string(id) + " appeared from nowhere");
      from.erase(it);
    };
    for (const int64_t id : after.traj_id) remove(trajs, id);
    std::multiset<int64_t> prompts(before.in_flight_prompt.begin(), before.in_flight_prompt.end());
    prompts.insert(op_.dispatched.begin(), op_.dispatched.end());
    for (const int64_t id : after.in_flight_prompt) remove(prompts, id);
    for (const int64_t id : op_.completed) remove(prompts, id);
    std::multiset<int64_t> rel_trajs, rel_prompts;
    int64_t by_reason[5] = {0, 0, 0, 0, 0};
    for (size_t i = 0; i < rel.ids.size(); ++i) {
      const int reason = rel.reasons[i];
      if (reason < 0 || reason > 4) chk::fail_check(where + "\nunknown release reason");
      ++by_reason[reason];
      (reason <= static_cast<int>(pfb::ReleaseReason::kEvicted) ? rel_trajs : rel_prompts).insert(rel.ids[i]);
    }
    const pfb::Ledger &l0 = before.ledger, &l1 = after.ledger;
    if (rel_trajs != trajs || rel_prompts != prompts || by_reason[0] != l1.retired - l0.retired ||
        by_reason[1] != l1.dropped_stale - l0.dropped_stale || by_reason[2] != l1.evicted - l0.evicted ||
        by_reason[3] + by_reason[4] != l1.failed - l0.failed || by_reason[4] != l1.expired - l0.expired)
      chk::fail_check(where + "\nreleased ids do not match what left: " + std::to_string(rel.ids.size()) +
                      " records for " + std::to_string(trajs.size()) + " trajectories and " +
                      std::to_string(prompts.size()) + " prompts; after: " + chk::describe(after));
  }

  void both(const char* name, const std::function<void(pfb::StalenessRing&, Result&)>& op,
            const std::function<void(const pfb::RingState&, const Result&, const pfb::RingState&)>& check) {
    const pfb::RingState before_a = a_.export_state(), before_b = b_.export_state();
    chk::force_scalar_compaction(false);
    const Result ra = run_guarded([&](Result& r) { op(a_, r); });
    chk::force_scalar_compaction(true);
    const Result rb = run_guarded([&](Result& r) { op(b_, r); });
    chk::force_scalar_compaction(false);
    const pfb::RingState after_a = a_.export_state(), after_b = b_.export_state();
    const std::string where = std::string(name) + " before: " + chk::describe(before_a);
    if (config_.track_released) {
      const pfb::Released rel_a = a_.take_released(), rel_b = b_.take_released();
      if (rel_a.ids != rel_b.ids || rel_a.reasons != rel_b.reasons) chk::fail_check(where + "\nreleased ids differ");
      check_released(rel_a, before_a, after_a, ra.outcome == Outcome::kOk, where);
    }
    if (after_a.ledger.released_overflow != after_b.ledger.released_overflow)
      chk::fail_check(where + "\nreleased_overflow differs");
    if (ra.outcome != rb.outcome || ra.message != rb.message)
      chk::fail_check(where + "\nrings differ: A " + outcome_name(ra.outcome) + " '" + ra.message + "', B " +
                      outcome_name(rb.outcome) + " '" + rb.message + "'");
    if (ra.outcome != Outcome::kOk) {
      // A paced dispatch or put that is refused (Full) or times out counts itself, and changes nothing else.
      const bool counted = config_.strategy == pfb::Strategy::kPace &&
                           (ra.outcome == Outcome::kFull || ra.outcome == Outcome::kTimeout);
      if (counted && (after_a.ledger.admission_refused < before_a.ledger.admission_refused ||
                      after_a.ledger.admission_waits < before_a.ledger.admission_waits))
        chk::fail_check(where + "\nan admission counter went back");
      auto uncounted = [counted](pfb::RingState s, const pfb::RingState& after) {
        if (counted) s.ledger.admission_refused = after.ledger.admission_refused;
        if (counted) s.ledger.admission_waits = after.ledger.admission_waits;
        return s;
      };
      if (!chk::same_state(uncounted(before_a, after_a), after_a, true) ||
          !chk::same_state(uncounted(before_b, after_b), after_b, true))
        chk::fail_check(where + "\nthe call threw " + outcome_name(ra.outcome) + " ('" + ra.message +
                        "') but changed the state: " + chk::describe(after_a));
    } else {
      if (!same_stats(ra.stats, rb.stats) || !same_batch(ra.batch, rb.batch, ra.stats.taken))
        chk::fail_check(where + "\nrings returned different results");
    }
    if (!chk::same_state(after_a, after_b, false))
      chk::fail_check(where + "\nrings diverged:\nA " + chk::describe(after_a) + "\nB " + chk::describe(after_b));
    const std::string broken = chk::structure_error(after_a, config_);
    if (!broken.empty()) chk::fail_check(where + "\nafter: " + chk::describe(after_a) + "\n" + broken);
    if (ra.outcome == Outcome::kOk && check) check(before_a, ra, after_a);
  }

  // How many of `ids` start their max_attempts-th untrained attempt, from the attempt records of `before`
  // (the fuzzer never reaches the table's bound, so no record is forgotten on the way).
  int64_t protected_attempts(const pfb::RingState& before, const std::vector<int64_t>& ids) const {
    if (config_.max_attempts <= 0) return 0;
    int64_t count = 0;
    for (const int64_t id : ids) {
      int64_t run = 1;
      for (const pfb::AttemptRecord& r : before.attempts)
        if (r.prompt_id == id) run = int64_t{r.since_trained} + 1;
      count += run >= config_.max_attempts;
    }
    return count;
  }

  // The ledger after a successful call: `before` plus the given changes, the sizes from the state.
  static void expect_ledger(const pfb::RingState& after, pfb::Ledger expected, const char* what) {
    expected.in_flight = after.ledger.in_flight, expected.buffer_left = after.ledger.buffer_left;
    if (!chk::same_ledger(expected, after.ledger)) chk::fail_check(std::string(what) + ": ledger moved wrongly: " +
                                                                   chk::describe(after));
  }

  void step_once() {
    op_ = OpIds{};
    switch (static_cast<Op>(in_.ConsumeIntegralInRange<int>(0, kOps * 8 - 1) % kOps)) {
      case kDispatch: return dispatch();
      case kComplete: return complete();
      case kFail: return fail();
      case kPut: return put();
      case kTake: return take();
      case kEvict: return evict();
      case kCheckpoint: return checkpoint();
      case kCorruptImport: return corrupt_import();
      case kSetMaxAge: return set_max_age();
      case kRenew: return renew();
      case kExpire: return expire();
      case kAdvanceLeaseClock: return advance_lease_clock();
      case kRestamp: return restamp();
      case kClose:
        // Rare: a closed ring answers every later call with Closed.
        if (in_.ConsumeIntegralInRange<int>(0, 15) == 0)
          both("close", [](pfb::StalenessRing& r, Result&) { r.close(); }, nullptr);
        return;
      default: return;
    }
  }

  void dispatch() {
    std::vector<int64_t> ids(static_cast<size_t>(pick_count(4)));
    for (auto& id : ids) id = pick_prompt();
    const int64_t s = pick_step();
    const std::optional<double> lease = pick_lease(true);
    const auto timeout = pick_timeout();  // under pace: refused at once, or a wait of 0 s that times out
    op_.dispatched = ids;
    both("dispatch",
         [&](pfb::StalenessRing& r, Result&) {
           r.dispatch(ids.data(), static_cast<int64_t>(ids.size()), s, lease, timeout);
         },
         [&](const pfb::RingState& before, const Result&, const pfb::RingState& after) {
           pfb::Ledger l = before.ledger;
           l.dispatched += static_cast<int64_t>(ids.size());
           if (paced()) l.admitted += static_cast<int64_t>(ids.size());
           if (paced()) l.protected_admitted += protected_attempts(before, ids);
           expect_ledger(after, l, "dispatch");
           for (const int64_t id : ids) {
             const size_t i = index_of(after.in_flight_prompt, id);
             if (i == after.in_flight_prompt.size() || after.in_flight_step[i] != s ||
                 after.in_flight_held_ns[i] != 0 || after.in_flight_lease_left_ns[i] != (lease ? to_ns(*lease) : -1))
               chk::fail_check("dispatch: prompt " + std::to_string(id) + " not in flight as dispatched: " +
                               chk::describe(after));
           }
           if (after.clock != std::max(before.clock, ids.empty() ? before.clock : s) && !ids.empty())
             chk::fail_check("dispatch: clock did not advance to the step");
         });
  }

  void complete() {
    const pfb::RingState now = a_.export_state();
    const int64_t n = pick_count(6);
    std::vector<int64_t> traj(static_cast<size_t>(n)), prompt(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      traj[i] = pick_traj();
      prompt[i] = pick_prompt_from(now);
    }
    const auto timeout = pick_timeout();
    const std::vector<int64_t> finish = pick_finish_steps(now, prompt);
    op_.added_trajs = traj;
    const std::set<int64_t> distinct(prompt.begin(), prompt.end());
    op_.completed.assign(distinct.begin(), distinct.end());
    both("complete",
         [&](pfb::StalenessRing& r, Result&) {
           r.complete(traj.data(), prompt.data(), n, timeout, finish.data(), static_cast<int64_t>(finish.size()));
         },
         [&](const pfb::RingState& before, const Result&, const pfb::RingState& after) {
           pfb::Ledger l = before.ledger;
           l.completed += static_cast<int64_t>(std::unordered_set<int64_t>(prompt.begin(), prompt.end()).size());
           l.put_total += n;
           l.evicted = after.ledger.evicted;
           expect_ledger(after, l, "complete");
         });
  }

  void fail() {
    const pfb::RingState now = a_.export_state();
    std::vector<int64_t> ids(static_cast<size_t>(pick_count(3)));
    for (auto& id : ids) id = pick_prompt_from(now);
    both("fail", [&](pfb::StalenessRing& r, Result&) { r.fail(ids.data(), static_cast<int64_t>(ids.size())); },
         [&](const pfb::RingState& before, const Result&, const pfb::RingState& after) {
           pfb::Ledger l = before.ledger;
           l.failed += static_cast<int64_t>(ids.size());
           expect_ledger(after, l, "fail");
         });
  }

  void put() {
    const int64_t n = pick_count(6);
    const bool grouped = in_.ConsumeBool();
    const bool per_entry_steps = in_.ConsumeIntegralInRange<int>(0, 3) == 0;
    std::vector<int64_t> traj(static_cast<size_t>(n)), group(static_cast<size_t>(n)), steps;
    const int64_t base_step = pick_step();
    for (int64_t i = 0; i < n; ++i) {
      traj[i] = pick_traj();
      group[i] = in_.ConsumeIntegralInRange<int64_t>(100, 103);
    }
    if (per_entry_steps) {
      // Grouped: one step per group (valid), now and then a group with two different stamps.
      // Ungrouped: stamps out of order, so evict_stale takes its compaction pass (SIMD on ring A).
      for (int64_t i = 0; i < n; ++i)
        if (!grouped)
          steps.push_back(std::max<int64_t>(0, base_step - in_.ConsumeIntegralInRange<int64_t>(0, 3)));
        else if (in_.ConsumeIntegralInRange<int>(0, 15) == 0)
          steps.push_back(sat_add(base_step, 1));
        else
          steps.push_back(sat_add(base_step, group[i] & 1));
    } else {
      steps.push_back(base_step);
    }
    const auto timeout = pick_timeout();
    std::vector<int64_t> finish;  // none, one for all, or one per trajectory at or after its stamp (-1: refused)
    const int finish_kind = in_.ConsumeIntegralInRange<int>(0, 3);
    for (int64_t i = 0; !steps.empty() && i < (finish_kind == 1 ? 1 : finish_kind == 2 ? n : 0); ++i)
      finish.push_back(sat_add(steps[steps.size() == 1 ? 0 : i], in_.ConsumeIntegralInRange<int64_t>(0, 2)) -
                       (in_.ConsumeIntegralInRange<int>(0, 15) == 0));
    op_.added_trajs = traj;
    both("put",
         [&](pfb::StalenessRing& r, Result&) {
           r.put(traj.data(), grouped ? group.data() : nullptr, steps.data(), static_cast<int64_t>(steps.size()), n,
                 timeout, finish.data(), static_cast<int64_t>(finish.size()));
         },
         [&](const pfb::RingState& before, const Result&, const pfb::RingState& after) {
           const int64_t groups =
               grouped ? static_cast<int64_t>(std::unordered_set<int64_t>(group.begin(), group.end()).size()) : n;
           pfb::Ledger l = before.ledger;
           l.dispatched += groups, l.completed += groups, l.put_total += n;
           if (paced()) l.admitted += groups;
           l.evicted = after.ledger.evicted;
           expect_ledger(after, l, "put");
         });
  }

  void take() {
    const int64_t batch_size = in_.ConsumeIntegralInRange<int>(0, 15) == 0
                                   ? in_.ConsumeIntegralInRange<int64_t>(-1, int64_t{1} << 40)
                                   : in_.ConsumeIntegralInRange<int64_t>(1, config_.capacity + 2);
    const int64_t s = pick_step();
    const auto timeout = pick_timeout();
    // The output has exactly the room the bindings give it, so ASan sees any write past it.
    const int64_t rows = std::max<int64_t>(0, std::min(batch_size, config_.capacity));
    both("take",
         [&](pfb::StalenessRing& r, Result& res) {
           std::vector<int64_t> out(static_cast<size_t>(pfb::kBatchColumns * rows));
           res.stats = r.take(batch_size, s, timeout, out.data());
           out.resize(static_cast<size_t>(pfb::kBatchColumns * res.stats.taken));
           // Column f of a k-row batch starts at f * k: the core writes it contiguous.
           res.batch = out;
         },
         [&](const pfb::RingState& before, const Result& res, const pfb::RingState& after) {
           check_take(before, res, after, batch_size, s);
         });
  }

  // The batch is whole groups of the ring, oldest first, with ages, uses and counts as documented.
  void check_take(const pfb::RingState& before, const Result& res, const pfb::RingState& after, int64_t batch_size,
                  int64_t s) const {
    const pfb::TakeStats& st = res.stats;
    const int64_t k = st.taken;
    auto col = [&](int f, int64_t j) { return res.batch[static_cast<size_t>(f * k + j)]; };
    if (k > batch_size || k > config_.capacity) chk::fail_check("take: batch larger than asked");
    int64_t j = 0;
    for (size_t i = 0; i < before.traj_id.size() && j < k; i += static_cast<size_t>(before.group_len[i])) {
      const int64_t len = before.group_len[i];
      bool match = j + len <= k;
      for (int64_t m = 0; match && m < len; ++m)
        match = col(0, j + m) == before.traj_id[i + m] && col(1, j + m) == before.group_id[i + m] &&
                col(2, j + m) == before.sample_step[i + m] && col(4, j + m) == before.uses[i + m] + 1;
      if (match) j += len;
    }
    if (j != k) chk::fail_check("take: the batch is not whole groups of the ring in order: " + chk::describe(before));
    __int128 age_sum = 0;
    int64_t age_max = 0, retired = 0, hist_total = 0, over_age = 0;
    for (int64_t m = 0; m < k; ++m) {
      const int64_t age = col(3, m);
      const int64_t stamp = config_.age_from == pfb::AgeFrom::kFinish ? col(8, m) : col(2, m);
      if (age != s - stamp) chk::fail_check("take: age is not current_step - its age stamp");
      if (col(8, m) < col(2, m)) chk::fail_check("take: finish_step before sample_step");
      if (config_.strategy == pfb::Strategy::kDrop && age > max_age_) chk::fail_check("take: stale entry taken");
      over_age += age > max_age_;
      age_sum += age, age_max = std::max(age_max, age);
      retired += config_.strategy == pfb::Strategy::kPace || col(4, m) >= config_.max_uses;  // pace: one use
    }
    for (int64_t h : st.age_hist) hist_total += h;
    if (age_sum != st.age_sum || age_max != st.age_max || hist_total != k)
      chk::fail_check("take: age statistics do not match the batch");
    if (retired != st.retired) chk::fail_check("take: retired count does not match the batch's uses");
    if (config_.strategy != pfb::Strategy::kDrop && st.dropped_stale != 0) chk::fail_check("take: wait/pace dropped");
    if (over_age != st.trained_over_age) chk::fail_check("take: trained_over_age does not match the batch");
    if (st.evicted != before.evicted_unreported || after.evicted_unreported != 0)
      chk::fail_check("take: evictions not reported exactly once");
    if (st.buffer_left != after.ledger.buffer_left || st.in_flight != after.ledger.in_flight ||
        st.sampled_total != after.ledger.put_total)
      chk::fail_check("take: stats disagree with the state after the call");
    pfb::Ledger l = before.ledger;
    l.taken += k, l.retired += st.retired, l.dropped_stale += st.dropped_stale;
    l.trained_over_age += st.trained_over_age;
    l.retired_early += st.retired_early;
    if (st.retired_early != (config_.strategy == pfb::Strategy::kPace && config_.max_uses > 1 ? st.retired : 0))
      chk::fail_check("take: retired_early is not pace's retirements below max_uses");
    expect_ledger(after, l, "take");
    if (after.clock != std::max(before.clock, s)) chk::fail_check("take: clock is not max(clock, current_step)");
  }

  void evict() {
    const int64_t s = pick_step();
    both("evict_stale", [&](pfb::StalenessRing& r, Result& res) { res.stats = r.evict_stale(s); },
         [&](const pfb::RingState& before, const Result& res, const pfb::RingState& after) {
           // The survivors are exactly the fresh entries and the protected ones (a prompt's max_attempts-th
           // untrained attempt is never stale: docs/design.md), in their order.
           pfb::RingState fresh = before;
           size_t w = 0;
           for (size_t i = 0; i < before.traj_id.size(); ++i) {
             const int64_t stamp =
                 config_.age_from == pfb::AgeFrom::kFinish ? before.finish_step[i] : before.sample_step[i];
             const bool protect = (before.meta[i] & pfb::kMetaProtected) != 0;
             if (stamp < s - max_age_ && !protect) continue;
             fresh.traj_id[w] = before.traj_id[i], fresh.group_id[w] = before.group_id[i];
             fresh.sample_step[w] = before.sample_step[i], fresh.uses[w] = before.uses[i];
             fresh.group_len[w] = before.group_len[i], fresh.policy_version[w] = before.policy_version[i];
             fresh.finish_step[w] = before.finish_step[i], fresh.meta[w] = before.meta[i];
             ++w;
           }
           for (auto* c : {&fresh.traj_id, &fresh.group_id, &fresh.sample_step, &fresh.policy_version,
                           &fresh.finish_step, &fresh.meta})
             c->resize(w);
           fresh.uses.resize(w), fresh.group_len.resize(w);
           if (fresh.traj_id != after.traj_id || fresh.group_len != after.group_len || fresh.uses != after.uses ||
               fresh.sample_step != after.sample_step || fresh.meta != after.meta)
             chk::fail_check("evict_stale: survivors are not the fresh entries in order: " + chk::describe(before));
           if (res.stats.dropped_stale != static_cast<int64_t>(before.traj_id.size() - w))
             chk::fail_check("evict_stale: dropped count wrong");
           pfb::Ledger l = before.ledger;
           l.dropped_stale += res.stats.dropped_stale;
           expect_ledger(after, l, "evict_stale");
         });
  }

  void set_max_age() {
    const int64_t max_age = in_.PickValueInArray<int64_t>({0, 1, 2, 3, 5, kMaxStep, -1});
    both("set_max_age", [&](pfb::StalenessRing& r, Result&) { r.set_max_age(max_age); },
         [&](const pfb::RingState& before, const Result&, const pfb::RingState& after) {
           pfb::Ledger l = before.ledger;
           l.max_age_changes += max_age != max_age_;
           expect_ledger(after, l, "set_max_age");
           max_age_ = max_age;
           if (a_.max_age() != max_age || b_.max_age() != max_age) chk::fail_check("set_max_age did not take");
         });
  }

  static size_t index_of(const std::vector<int64_t>& v, int64_t x) {
    return static_cast<size_t>(std::find(v.begin(), v.end(), x) - v.begin());
  }

  void renew() {
    const pfb::RingState now = a_.export_state();
    std::vector<int64_t> ids(static_cast<size_t>(pick_count(3)));
    for (auto& id : ids) id = pick_prompt_from(now);
    const double lease = *pick_lease(false);
    both("renew", [&](pfb::StalenessRing& r, Result&) { r.renew(ids.data(), static_cast<int64_t>(ids.size()), lease); },
         [&](const pfb::RingState& before, const Result&, const pfb::RingState& after) {
           expect_ledger(after, before.ledger, "renew");
           for (size_t i = 0; i < after.in_flight_prompt.size(); ++i) {
             const bool renewed = index_of(ids, after.in_flight_prompt[i]) < ids.size();
             const int64_t left = renewed ? to_ns(lease) : before.in_flight_lease_left_ns[i];
             if (after.in_flight_lease_left_ns[i] != left)
               chk::fail_check("renew: wrong lease: " + chk::describe(after));
           }
         });
  }

  // expire_in_flight fails exactly the prompts held at least `older_than`, counting them as expired.
  void expire() {
    const double older_than = in_.PickValueInArray<double>({0.0, 0.001, 0.5, 1.0, 5.0, 60.0, -1.0,
                                                            std::numeric_limits<double>::quiet_NaN(), 2e9});
    both("expire_in_flight", [&](pfb::StalenessRing& r, Result& res) { res.count = r.expire_in_flight(older_than); },
         [&](const pfb::RingState& before, const Result& res, const pfb::RingState& after) {
           std::vector<int64_t> kept;
           for (size_t i = 0; i < before.in_flight_prompt.size(); ++i)
             if (before.in_flight_held_ns[i] < to_ns(older_than)) kept.push_back(before.in_flight_prompt[i]);
           const auto gone = static_cast<int64_t>(before.in_flight_prompt.size() - kept.size());
           if (res.count != gone || after.in_flight_prompt != kept)
             chk::fail_check("expire_in_flight: expired the wrong prompts: " + chk::describe(before));
           pfb::Ledger l = before.ledger;
           l.failed += gone, l.expired += gone;
           expect_ledger(after, l, "expire_in_flight");
         });
  }

  // restamp_in_flight raises exactly the in-flight stamps below the step to it (age_from='finish'; refused, changing
  // nothing, under 'start'), returns how many, and moves no counter.
  void restamp() {
    const int64_t s = pick_step();
    both("restamp_in_flight", [&](pfb::StalenessRing& r, Result& res) { res.count = r.restamp_in_flight(s); },
         [&](const pfb::RingState& before, const Result& res, const pfb::RingState& after) {
           if (config_.age_from != pfb::AgeFrom::kFinish) chk::fail_check("restamp_in_flight: ran under 'start'");
           int64_t raised = 0;
           for (size_t i = 0; i < before.in_flight_prompt.size(); ++i) {
             raised += before.in_flight_step[i] < s;
             const size_t j = index_of(after.in_flight_prompt, before.in_flight_prompt[i]);
             if (j == after.in_flight_prompt.size() || after.in_flight_step[j] != std::max(before.in_flight_step[i], s))
               chk::fail_check("restamp_in_flight: wrong stamps: " + chk::describe(after));
           }
           if (res.count != raised || after.in_flight_prompt.size() != before.in_flight_prompt.size())
             chk::fail_check("restamp_in_flight: raised the wrong prompts: " + chk::describe(before));
           expect_ledger(after, before.ledger, "restamp_in_flight");
         });
  }

  // Moves the frozen lease clock forward: the next call fails every prompt whose lease passed, as expired.
  void advance_lease_clock() {
    const int64_t delta = in_.PickValueInArray<int64_t>({0, 1'000'000, 500'000'000, 1'000'000'000, 5'000'000'000,
                                                         60'000'000'000});
    const int64_t later = lease_now_ + delta;
    const bool closed = a_.closed();
    both("advance the lease clock",
         [&](pfb::StalenessRing& r, Result&) { r.set_lease_clock(later); },
         [&](const pfb::RingState& before, const Result&, const pfb::RingState& after) {
           // (after was exported at the new time, so the expiry has happened; a closed ring is frozen.)
           std::vector<int64_t> kept;
           for (size_t i = 0; i < before.in_flight_prompt.size(); ++i) {
             const int64_t left = before.in_flight_lease_left_ns[i];
             if (closed || left < 0 || left > delta) kept.push_back(before.in_flight_prompt[i]);
           }
           if (after.in_flight_prompt != kept)
             chk::fail_check("lease expiry failed the wrong prompts: " + chk::describe(before) + "\nafter " +
                             chk::describe(after));
           for (size_t i = 0, j = 0; i < before.in_flight_prompt.size(); ++i) {
             if (j == kept.size() || before.in_flight_prompt[i] != kept[j]) continue;
             const int64_t left = before.in_flight_lease_left_ns[i];
             const int64_t left_now = left < 0 ? -1 : std::max<int64_t>(left - delta, 0);  // closed: kept at 0
             if (after.in_flight_held_ns[j] != before.in_flight_held_ns[i] + delta ||
                 after.in_flight_lease_left_ns[j] != left_now)
               chk::fail_check("lease clock: held/left did not move with the clock: " + chk::describe(after));
             ++j;
           }
           const auto gone = static_cast<int64_t>(before.in_flight_prompt.size() - kept.size());
           pfb::Ledger l = before.ledger;
           l.failed += gone, l.expired += gone;
           expect_ledger(after, l, "lease expiry");
         });
    lease_now_ = later;
  }

  void roundtrip_into_fresh_ring(const pfb::RingState& s) const {
    pfb::StalenessRing fresh(config_, nullptr);
    fresh.set_lease_clock(lease_now_);
    fresh.import_state(s);
    if (!chk::same_state(fresh.export_state(), chk::expired_on_import(s), true))
      chk::fail_check("export -> import into a fresh ring changed the state: " + chk::describe(s));
  }

  void checkpoint() {
    roundtrip_into_fresh_ring(a_.export_state());
    const pfb::RingState s = a_.export_state();
    op_.replaces_state = true;
    both("import_state(export_state())", [&](pfb::StalenessRing& r, Result&) { r.import_state(s); },
         [&](const pfb::RingState&, const Result&, const pfb::RingState& after) {
           if (!chk::same_state(after, s, true)) chk::fail_check("import of the own export changed the state");
         });
  }

  // Imports a checkpoint with one field changed: it is refused with nothing changed, or the state it
  // yields passes every check (both enforced by both()).
  void corrupt_import() {
    pfb::RingState s = a_.export_state();
    const int64_t delta =
        in_.PickValueInArray<int64_t>({1, -1, 2, -2, 1000, kMaxStep, std::numeric_limits<int64_t>::min()});
    const size_t n = s.traj_id.size(), m = s.in_flight_prompt.size();
    auto at = [&](size_t size) { return in_.ConsumeIntegralInRange<size_t>(0, size - 1); };
    switch (in_.ConsumeIntegralInRange<int>(0, 17)) {
      case 0: if (n) { auto& v = s.traj_id[at(n)]; v = wrap_add(v, delta); } break;
      case 1: if (n) { auto& v = s.group_id[at(n)]; v = wrap_add(v, delta); } break;
      case 2: if (n) { auto& v = s.sample_step[at(n)]; v = wrap_add(v, delta); } break;
      case 3: if (n) { auto& v = s.uses[at(n)]; v = wrap_add(v, delta); } break;
      case 4: if (n) { auto& v = s.group_len[at(n)]; v = wrap_add(v, delta); } break;
      case 5: if (m) { auto& v = s.in_flight_prompt[at(m)]; v = wrap_add(v, delta); } break;
      case 6: if (m) { auto& v = s.in_flight_step[at(m)]; v = wrap_add(v, delta); } break;
      case 7: s.clock = wrap_add(s.clock, delta); break;
      case 8: s.evicted_unreported = wrap_add(s.evicted_unreported, delta); break;
      case 9:  // still balanced, but are the counters in range?
        s.ledger.put_total = wrap_add(s.ledger.put_total, delta);
        s.ledger.evicted = wrap_add(s.ledger.evicted, delta);
        break;
      case 10: s.ledger.dispatched = wrap_add(s.ledger.dispatched, delta); break;
      case 11: if (n) s.uses.pop_back(); break;
      case 14: if (m) { auto& v = s.in_flight_lease_left_ns[at(m)]; v = wrap_add(v, delta); } break;
      case 15: if (m) { auto& v = s.in_flight_held_ns[at(m)]; v = wrap_add(v, delta); } break;
      case 16: s.ledger.expired = wrap_add(s.ledger.expired, delta); break;
      case 17: if (m) s.in_flight_held_ns.pop_back(); break;
      case 12:
        if (m) s.in_flight_prompt.push_back(s.in_flight_prompt[0]), s.in_flight_step.push_back(s.in_flight_step[0]),
            s.in_flight_dispatch_ns.push_back(0), s.in_flight_lease_left_ns.push_back(-1),
            s.in_flight_held_ns.push_back(0);
        break;
      default:
        if (n) {  // drop the last entry everywhere
          for (auto* c : {&s.traj_id, &s.group_id, &s.sample_step, &s.policy_version, &s.dispatch_ns, &s.complete_ns,
                          &s.finish_step})
            c->pop_back();
          s.uses.pop_back(), s.group_len.pop_back();
        }
    }
    op_.replaces_state = true;
    both("import_state(corrupted)", [&](pfb::StalenessRing& r, Result&) { r.import_state(s); }, nullptr);
  }

  // What the current operation adds or removes by name, for check_released.
  struct OpIds {
    std::vector<int64_t> added_trajs, dispatched, completed;
    bool replaces_state = false;  // import_state: ids are replaced, not released
  };

  FuzzedDataProvider& in_;
  OpIds op_;
  const pfb::RingConfig config_;
  BorrowedColumns borrowed_;
  pfb::StalenessRing a_, b_;
  int64_t step_ = 0;
  int64_t next_traj_ = 0;
  int64_t max_age_ = config_.max_age;  // the rings' max_age, which set_max_age changes
  int64_t lease_now_ = 1'000'000'000'000;  // the frozen lease clock of both rings, in ns
};

pfb::RingConfig pick_config(FuzzedDataProvider& in) {
  pfb::RingConfig c;
  c.capacity = in.ConsumeIntegralInRange<int64_t>(1, 40);
  c.max_age = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? kMaxStep : in.ConsumeIntegralInRange<int64_t>(0, 6);
  c.strategy = in.ConsumeBool() ? pfb::Strategy::kDrop : pfb::Strategy::kWait;
  c.max_uses = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? std::numeric_limits<int32_t>::max()
                                                          : in.ConsumeIntegralInRange<int64_t>(1, 3);
  c.on_full = in.PickValueInArray({pfb::OnFull::kEvictOldest, pfb::OnFull::kBlock, pfb::OnFull::kError});
  c.parameter_sync_step = in.ConsumeIntegralInRange<int64_t>(0, 3);
  c.track_released = in.ConsumeIntegralInRange<int>(0, 3) != 0;
  c.release_bound = in.PickValueInArray<int64_t>({0, 0, 1, 3, 8});  // 0: the default, large enough
  c.unique_ids = in.ConsumeBool();
  if (in.ConsumeIntegralInRange<int>(0, 2) == 0) {  // pace: admission at dispatch and put, the take gate
    c.strategy = pfb::Strategy::kPace;
    c.prompts_per_step = in.ConsumeIntegralInRange<int64_t>(1, 4);
    c.lookahead = in.ConsumeIntegralInRange<int64_t>(0, std::min<int64_t>(c.max_age, 6));
  }
  c.age_from = in.ConsumeBool() ? pfb::AgeFrom::kStart : pfb::AgeFrom::kFinish;
  // Under pace only: there nothing is dropped, and a protected attempt is admitted first (the take checks below
  // know nothing of the protection from the drop). 0: no cap.
  if (c.strategy == pfb::Strategy::kPace) c.max_attempts = in.ConsumeIntegralInRange<int64_t>(0, 3);
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::fprintf(stderr, "fuzz_ops: ring A compacts with %s, ring B with the scalar pass\n",
               chk::simd_compaction_on_this_cpu() ? "AVX-512" : "the scalar pass (no AVX-512 on this CPU)");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const pfb::RingConfig config = pick_config(in);
  Session(in, config).run();
  return 0;
}
