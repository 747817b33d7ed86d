// ThreadSanitizer driver of the core: each round builds one ring (drop, wait or pace) and races producers
// (dispatch with and without leases, paced dispatch waiting for admission, renew, complete with finish steps,
// fail, put), a consumer taking with timeouts, evict_stale,
// expire_in_flight, export_state/import_state, set_max_age, the read-only accessors and a waiter that
// the interrupt check aborts, against a close() at a random moment. Every snapshot taken
// meanwhile must satisfy ring_checks.hpp. Exits 0 when every round ends cleanly; a failed check aborts,
// and under TSan any data race or lock-order report fails the run (TSAN_OPTIONS=halt_on_error=1).
// Usage: tsan_driver [rounds=40] [round_ms=40] [seed=1]   (.ci/tsan.sh runs 60 rounds)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ring_checks.hpp"
#include "staleness_ring.hpp"

namespace pfb = pyfast_buffer;
namespace chk = pyfast_buffer_checks;

namespace {

constexpr int kProducers = 3;

// Set only on the waiter thread: the interrupt check aborts its blocked calls and no one else's.
thread_local bool interrupt_me = false;

// Counts what the threads saw, to show the round exercised the paths it claims to.
struct Tally {
  std::atomic<int64_t> ops{0}, taken{0}, timeouts{0}, refused{0}, full{0}, imports{0}, snapshots{0}, expired{0},
      interrupted{0}, admission_waits{0};
};

// Runs `body` until the ring is closed; Closed thrown by any call ends the loop, as it ends a worker.
void until_closed(pfb::StalenessRing& ring, const std::function<void()>& body) {
  try {
    while (!ring.closed()) body();
  } catch (const pfb::Closed&) {
  }
}

// What the interrupt check throws, as PyErr_CheckSignals would raise KeyboardInterrupt.
struct Interrupted {};

void check_snapshot(const pfb::RingState& s, const pfb::RingConfig& config, const char* who) {
  const std::string broken = chk::structure_error(s, config);
  if (!broken.empty())
    chk::fail_check(std::string(who) + ": inconsistent snapshot: " + broken + "\n" + chk::describe(s));
}

// Every trajectory that entered and is not ready was released once, and the records agree with the ledger.
void check_released(pfb::StalenessRing& ring, const pfb::RingState& final_state, std::vector<int64_t>& trajs,
                    int64_t (&by_reason)[5]) {
  const pfb::Released rest = ring.take_released();
  for (size_t i = 0; i < rest.ids.size(); ++i) {
    ++by_reason[rest.reasons[i]];
    if (rest.reasons[i] <= static_cast<int8_t>(pfb::ReleaseReason::kEvicted)) trajs.push_back(rest.ids[i]);
  }
  const pfb::Ledger& l = final_state.ledger;
  if (l.released_overflow != 0) return;  // the default bound is large; if it did overflow, counts are partial
  std::vector<int64_t> all = trajs;
  all.insert(all.end(), final_state.traj_id.begin(), final_state.traj_id.end());
  std::sort(all.begin(), all.end());
  if (std::adjacent_find(all.begin(), all.end()) != all.end())
    chk::fail_check("a trajectory id was released twice, or released and still ready");
  if (static_cast<int64_t>(all.size()) != l.put_total || by_reason[0] != l.retired ||
      by_reason[1] != l.dropped_stale || by_reason[2] != l.evicted || by_reason[3] + by_reason[4] != l.failed ||
      by_reason[4] != l.expired)
    chk::fail_check("released-id records disagree with the ledger: " + chk::describe(final_state));
}

void run_round(int round, int round_ms, uint32_t seed, Tally& tally) {
  pfb::RingConfig config;
  config.capacity = 64;
  config.max_age = 2 + round % 3;
  config.strategy = static_cast<pfb::Strategy>(round % 3);  // drop, wait, pace
  if (config.strategy == pfb::Strategy::kPace) config.prompts_per_step = 2, config.lookahead = config.max_age;
  // Half the paced rounds protect every attempt (max_attempts=1): each dispatch then goes first, and the puts
  // (never protected) wait behind the dispatches waiting for admission.
  if (config.strategy == pfb::Strategy::kPace && (round / 3) % 2 == 1) config.max_attempts = 1;
  config.max_uses = 1 + round % 2;
  config.on_full = static_cast<pfb::OnFull>(round % 3);
  config.parameter_sync_step = round % 4;
  // Odd rounds track released ids (drained concurrently, accounted for at the end) and refuse live
  // duplicates; they skip the imports into the live ring, which replace ids instead of releasing them.
  const bool tracked = round % 2 == 1;
  config.track_released = tracked;
  config.unique_ids = tracked;
  pfb::StalenessRing ring(config, nullptr);
  std::vector<int64_t> released_trajs;  // only the drainer thread appends, then the main thread reads
  int64_t released_by_reason[5] = {0, 0, 0, 0, 0};
  // Runs without the lock from any blocked thread; interrupts only the waiter's takes (see below).
  ring.set_interrupt_check([] {
    if (interrupt_me) throw Interrupted{};
  });
  std::atomic<int64_t> step{0};
  std::vector<std::thread> threads;

  for (int k = 0; k < kProducers; ++k)
    threads.emplace_back([&, k] {
      std::mt19937 rng(seed * 7919u + static_cast<uint32_t>(round * 31 + k));
      std::vector<int64_t> pending;  // prompts this producer dispatched and still has to finish
      int64_t i = 0;
      until_closed(ring, [&] {
        const int64_t prompt = (int64_t{k + 1} << 40) + i++;
        const int64_t s = step.load();
        const std::optional<double> room_timeout = 0.002;
        try {
          switch (rng() % 4) {
            case 0: {  // dispatch now (half with a short lease), finish later: prompts stay in flight across takes
              const std::optional<double> lease = rng() % 2 ? std::optional<double>(0.003) : std::nullopt;
              ring.dispatch(&prompt, 1, s, lease, room_timeout);  // paced: waits for a take, fail or expiry
              pending.push_back(prompt);
              if (rng() % 4 == 0 && pending.size() > 1) ring.renew(pending.data(), 1, 0.005);
              break;
            }
            case 1: {  // complete the oldest pending prompt with 1..3 trajectories
              if (pending.empty()) break;
              const int64_t p = pending.front();
              pending.erase(pending.begin());
              const int64_t n = 1 + static_cast<int64_t>(rng() % 3);
              std::vector<int64_t> traj(n), prompts(n, p);
              for (int64_t j = 0; j < n; ++j) traj[j] = p * 4 + j;
              const int64_t finish = step.load();  // the weights in force now: a span when the step moved on
              ring.complete(traj.data(), prompts.data(), n, room_timeout, &finish, 1);
              break;
            }
            case 2: {  // fail the newest pending prompt
              if (pending.empty()) break;
              const int64_t p = pending.back();
              pending.pop_back();
              ring.fail(&p, 1);
              break;
            }
            default: {  // put a group of 2 at the current step
              const int64_t traj[2] = {prompt * 4, prompt * 4 + 1}, group[2] = {prompt, prompt};
              ring.put(traj, group, &s, 1, 2, room_timeout);
            }
          }
          tally.ops++;
        } catch (const pfb::InvalidArgument&) {
          tally.refused++;  // an import raced in and forgot or restored this prompt
        } catch (const pfb::Full&) {
          tally.full++;
        } catch (const pfb::Timeout&) {
          tally.timeouts++;
        }
      });
    });

  threads.emplace_back([&] {  // the consumer: takes with a timeout, advances the trainer step
    std::vector<int64_t> out(pfb::kBatchColumns * 8);
    int64_t takes = 0;
    until_closed(ring, [&] {
      try {
        const pfb::TakeStats st = ring.take(8, step.load(), 0.001, out.data());
        tally.taken += st.taken;
      } catch (const pfb::Timeout&) {
        tally.timeouts++;
      } catch (const pfb::InvalidArgument&) {
        tally.refused++;
      }
      if (++takes % 4 == 0) step++;
    });
  });

  threads.emplace_back([&] {  // evict_stale and set_max_age, racing the consumer's clock
    std::mt19937 rng(seed + static_cast<uint32_t>(round));
    until_closed(ring, [&] {
      try {
        ring.evict_stale(step.load());
      } catch (const pfb::InvalidArgument&) {
        tally.refused++;  // the consumer stamped a later step first
      }
      ring.set_max_age(1 + static_cast<int64_t>(rng() % 4));
      tally.expired += ring.expire_in_flight(0.004);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    });
  });

  threads.emplace_back([&] {  // checkpoints: snapshots must be consistent; imports race everything
    pfb::StalenessRing side(config, nullptr);
    int64_t n = 0;
    until_closed(ring, [&] {
      const pfb::RingState s = ring.export_state();
      check_snapshot(s, config, "export_state");
      tally.snapshots++;
      const pfb::Ledger l = ring.ledger();
      if (!l.balanced()) chk::fail_check("ledger() returned an unbalanced ledger");
      (void)ring.size(), (void)ring.in_flight(), (void)ring.max_age(), (void)ring.debug_string();
      side.import_state(s);
      if (tracked) {
        const pfb::Released rel = ring.take_released();
        for (size_t i = 0; i < rel.ids.size(); ++i) {
          ++released_by_reason[rel.reasons[i]];
          if (rel.reasons[i] <= static_cast<int8_t>(pfb::ReleaseReason::kEvicted)) released_trajs.push_back(rel.ids[i]);
        }
      }
      if (!tracked && ++n % 8 == 0) {
        try {
          ring.import_state(s);  // rolls the ring back a little: producers must cope
          tally.imports++;
        } catch (const pfb::InvalidArgument&) {
          tally.refused++;  // max_uses/capacity are fixed, so this would be a bug in export/import
          chk::fail_check("import_state refused the ring's own export");
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    });
  });

  threads.emplace_back([&] {  // a waiter for a batch that never fills, aborted by the interrupt check
    interrupt_me = true;
    std::vector<int64_t> out(pfb::kBatchColumns * config.capacity);
    until_closed(ring, [&] {
      try {
        // More than the ring holds, so never full; a step far ahead, so the consumer's clock never passes it
        // (a take that waits commits nothing, so this step never reaches the ring's clock).
        ring.take(config.capacity + 1, step.load() + 1'000'000, 0.5, out.data());
      } catch (const Interrupted&) {
        tally.interrupted++;
      } catch (const pfb::Timeout&) {
        tally.timeouts++;
      } catch (const pfb::InvalidArgument&) {
        tally.refused++;
      }
    });
  });

  std::mt19937 rng(seed ^ static_cast<uint32_t>(round * 2654435761u));
  // Every fourth round outlives the 100 ms between interrupt checks, so the waiter gets interrupted.
  const int extra_ms = round % 4 == 3 ? 2 * static_cast<int>(pfb::kInterruptCheckMs) : 0;
  std::this_thread::sleep_for(
      std::chrono::milliseconds(round_ms / 2 + static_cast<int>(rng() % (round_ms + 1)) + extra_ms));
  ring.close();
  ring.close();  // idempotent
  for (auto& t : threads) t.join();

  const pfb::RingState final_state = ring.export_state();
  check_snapshot(final_state, config, "after close");
  tally.admission_waits += final_state.ledger.admission_waits;
  if (tracked) check_released(ring, final_state, released_trajs, released_by_reason);
  pfb::StalenessRing fresh(config, nullptr);
  fresh.set_lease_clock(int64_t{1} << 50);  // frozen, so only the leases that had passed expire on import
  fresh.import_state(final_state);
  if (!chk::same_state(fresh.export_state(), chk::expired_on_import(final_state), true))
    chk::fail_check("the final state does not survive export -> import");
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 40;
  const int round_ms = argc > 2 ? std::atoi(argv[2]) : 40;
  const uint32_t seed = argc > 3 ? static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10)) : 1u;
  Tally tally;
  for (int r = 0; r < rounds; ++r) run_round(r, round_ms, seed, tally);
  std::printf("tsan_driver: %d rounds, %lld calls, %lld taken, %lld timeouts, %lld refused, %lld full, "
              "%lld snapshots, %lld imports into the live ring, %lld expired by expire_in_flight, "
              "%lld interrupted waits, %lld paced dispatches that waited for admission\n",
              rounds, static_cast<long long>(tally.ops.load()), static_cast<long long>(tally.taken.load()),
              static_cast<long long>(tally.timeouts.load()), static_cast<long long>(tally.refused.load()),
              static_cast<long long>(tally.full.load()), static_cast<long long>(tally.snapshots.load()),
              static_cast<long long>(tally.imports.load()), static_cast<long long>(tally.expired.load()),
              static_cast<long long>(tally.interrupted.load()), static_cast<long long>(tally.admission_waits.load()));
  if (tally.taken.load() == 0 || tally.snapshots.load() == 0 || (rounds >= 4 && tally.interrupted.load() == 0) ||
      (rounds >= 3 && tally.admission_waits.load() == 0)) {
    std::fprintf(stderr,
                 "tsan_driver: nothing was taken, snapshotted, interrupted or waited for admission; the rounds are "
                 "too short\n");
    return 1;
  }
  return 0;
}
