// ThreadSanitizer driver of the core: each round builds one ring and races producers (dispatch,
// complete, fail, put), a consumer taking with timeouts, evict_stale, export_state/import_state,
// set_max_age and the read-only accessors against a close() at a random moment. Every snapshot taken
// meanwhile must satisfy ring_checks.hpp. Exits 0 when every round ends cleanly; a failed check aborts,
// and under TSan any data race or lock-order report fails the run (TSAN_OPTIONS=halt_on_error=1).
// Usage: tsan_driver [rounds=40] [round_ms=40] [seed=1]
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

// Counts what the threads saw, to show the round exercised the paths it claims to.
struct Tally {
  std::atomic<int64_t> ops{0}, taken{0}, timeouts{0}, refused{0}, full{0}, imports{0}, snapshots{0};
};

// Runs `body` until the ring is closed; Closed thrown by any call ends the loop, as it ends a worker.
void until_closed(pfb::StalenessRing& ring, const std::function<void()>& body) {
  try {
    while (!ring.closed()) body();
  } catch (const pfb::Closed&) {
  }
}

void check_snapshot(const pfb::RingState& s, const pfb::RingConfig& config, const char* who) {
  const std::string broken = chk::structure_error(s, config);
  if (!broken.empty()) chk::fail_check(std::string(who) + ": inconsistent snapshot: " + broken + "\n" + chk::describe(s));
}

void run_round(int round, int round_ms, uint32_t seed, Tally& tally) {
  pfb::RingConfig config;
  config.capacity = 64;
  config.max_age = 2 + round % 3;
  config.strategy = round % 2 ? pfb::Strategy::kWait : pfb::Strategy::kDrop;
  config.max_uses = 1 + round % 2;
  config.on_full = static_cast<pfb::OnFull>(round % 3);
  config.parameter_sync_step = round % 4;
  pfb::StalenessRing ring(config, nullptr);
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
            case 0: {  // dispatch now, finish later, so prompts stay in flight across takes
              ring.dispatch(&prompt, 1, s);
              pending.push_back(prompt);
              break;
            }
            case 1: {  // complete the oldest pending prompt with 1..3 trajectories
              if (pending.empty()) break;
              const int64_t p = pending.front();
              pending.erase(pending.begin());
              const int64_t n = 1 + static_cast<int64_t>(rng() % 3);
              std::vector<int64_t> traj(n), prompts(n, p);
              for (int64_t j = 0; j < n; ++j) traj[j] = p * 4 + j;
              ring.complete(traj.data(), prompts.data(), n, room_timeout);
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
      if (++n % 8 == 0) {
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

  std::mt19937 rng(seed ^ static_cast<uint32_t>(round * 2654435761u));
  std::this_thread::sleep_for(std::chrono::milliseconds(round_ms / 2 + static_cast<int>(rng() % (round_ms + 1))));
  ring.close();
  ring.close();  // idempotent
  for (auto& t : threads) t.join();

  const pfb::RingState final_state = ring.export_state();
  check_snapshot(final_state, config, "after close");
  pfb::StalenessRing fresh(config, nullptr);
  fresh.import_state(final_state);
  if (!chk::same_state(fresh.export_state(), final_state, true))
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
              "%lld snapshots, %lld imports into the live ring\n",
              rounds, static_cast<long long>(tally.ops.load()), static_cast<long long>(tally.taken.load()),
              static_cast<long long>(tally.timeouts.load()), static_cast<long long>(tally.refused.load()),
              static_cast<long long>(tally.full.load()), static_cast<long long>(tally.snapshots.load()),
              static_cast<long long>(tally.imports.load()));
  if (tally.taken.load() == 0 || tally.snapshots.load() == 0) {
    std::fprintf(stderr, "tsan_driver: nothing was taken or snapshotted; the rounds are too short\n");
    return 1;
  }
  return 0;
}
