// Fixed, deterministic workloads of the native core for the callgrind perf guard (benchmarks/perf_guard.py).
//
// Usage: perf_driver <workload>   (perf_driver --list names them)
// Each workload builds a ring and fills it outside the measured region, then calls the operation under
// test only through pfb_measured(), so `valgrind --tool=callgrind --toggle-collect=pfb_measured` counts
// the instructions of that operation alone. It prints one JSON line: the workload, the entries the
// measured calls moved (the denominator of instructions per entry) and the number of measured calls.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "staleness_ring.hpp"

namespace pfb = pyfast_buffer;

// The one measured region: callgrind collects only while this function is on the stack.
extern "C" __attribute__((noinline, noipa)) void pfb_measured(const std::function<void()>& op) {
  op();
  asm volatile("" ::: "memory");  // keeps the call from being folded into its caller
}

namespace {

constexpr int64_t kCapacity = 1 << 16;  // the bench's B = 65536 ring
constexpr int64_t kBatch = 4096;        // entries per measured put/take
constexpr int64_t kStep = 1000;         // the trainer's step in every workload
constexpr int64_t kMaxAge = 10;

struct Result {
  int64_t entries = 0;
  int64_t calls = 0;
};

pfb::RingConfig config(int64_t max_age = kMaxAge) {
  pfb::RingConfig c;
  c.capacity = kCapacity;
  c.max_age = max_age;
  return c;
}

std::vector<int64_t> iota(int64_t n, int64_t start = 0, int64_t divide = 1) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = (start + i) / divide;
  return v;
}

// A fixed-seed shuffle (xorshift), so every run measures the same data.
void shuffle(std::vector<int64_t>& v) {
  uint64_t x = 88172645463325252ull;
  for (size_t i = v.size() - 1; i > 0; --i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::swap(v[i], v[x % (i + 1)]);
  }
}

// Fills the ring to capacity with `steps` (one per entry), in groups of `group` entries.
void fill(pfb::StalenessRing& ring, const std::vector<int64_t>& steps, int64_t group, int64_t first_id) {
  const int64_t n = static_cast<int64_t>(steps.size());
  const auto ids = iota(n, first_id);
  const auto groups = iota(n, first_id, group);
  ring.put(ids.data(), group > 1 ? groups.data() : nullptr, steps.data(), n, n, std::nullopt);
}

// put(kBatch) into a full ring that evicts its oldest entries; `group` 1 = ungrouped, else GRPO groups.
Result put(int64_t group) {
  pfb::StalenessRing ring(config(), nullptr);
  fill(ring, std::vector<int64_t>(kCapacity, kStep), group, 0);
  Result r;
  for (int64_t call = 0; call < 64; ++call) {
    const int64_t first = kCapacity + call * kBatch;
    const auto ids = iota(kBatch, first);
    const auto groups = iota(kBatch, first, group);
    const int64_t step = kStep;
    pfb_measured([&] { ring.put(ids.data(), group > 1 ? groups.data() : nullptr, &step, 1, kBatch, std::nullopt); });
    r.entries += kBatch, ++r.calls;
  }
  return r;
}

// take(kBatch) under drop until the ring is empty, four laps; every entry is fresh.
Result take(int64_t group) {
  pfb::StalenessRing ring(config(), nullptr);
  std::vector<int64_t> out(static_cast<size_t>(pfb::kBatchColumns * kBatch));
  Result r;
  for (int lap = 0; lap < 4; ++lap) {
    fill(ring, std::vector<int64_t>(kCapacity, kStep), group, lap * kCapacity);
    for (int64_t call = 0; call < kCapacity / kBatch; ++call) {
      pfb::TakeStats stats;
      pfb_measured([&] { stats = ring.take(kBatch, kStep, std::nullopt, out.data()); });
      r.entries += stats.taken, ++r.calls;
    }
  }
  return r;
}

// take(kBatch) under drop from a ring in which half the entries, shuffled, are stale.
Result take_half_stale() {
  pfb::StalenessRing ring(config(), nullptr);
  std::vector<int64_t> steps(kCapacity, kStep);
  for (int64_t i = 0; i < kCapacity / 2; ++i) steps[i] = kStep - kMaxAge - 1;
  shuffle(steps);
  std::vector<int64_t> out(static_cast<size_t>(pfb::kBatchColumns * kBatch));
  Result r;
  for (int lap = 0; lap < 4; ++lap) {
    fill(ring, steps, 1, lap * kCapacity);
    for (int64_t call = 0; call < kCapacity / 2 / kBatch; ++call) {
      pfb::TakeStats stats;
      pfb_measured([&] { stats = ring.take(kBatch, kStep, std::nullopt, out.data()); });
      r.entries += stats.taken + stats.dropped_stale, ++r.calls;  // entries walked
    }
  }
  return r;
}

// take(kBatch) under drop with four sources, each with its own source_max_age (ring order round-robin, so every
// entry meets the per-entry cutoff walk); source 2's bound makes its quarter stale. Per entry walked.
Result take_4sources() {
  pfb::StalenessRing ring(config(), nullptr);
  const int64_t bounds[4] = {10, 20, 5, 40};
  for (int slot = 1; slot <= 4; ++slot) ring.set_source_max_age(slot, bounds[slot - 1]);
  std::vector<int32_t> slots(static_cast<size_t>(kCapacity));
  for (int64_t i = 0; i < kCapacity; ++i) slots[i] = static_cast<int32_t>(1 + i % 4);
  const std::vector<int64_t> steps(kCapacity, kStep - 8);  // age 8: stale only for source 2 (bound 5)
  std::vector<int64_t> out(static_cast<size_t>(pfb::kBatchColumns * kBatch));
  Result r;
  for (int lap = 0; lap < 4; ++lap) {
    const auto ids = iota(kCapacity, lap * kCapacity);
    ring.put(ids.data(), nullptr, steps.data(), kCapacity, kCapacity, std::nullopt, nullptr, 0, slots.data(), kCapacity);
    for (int64_t call = 0; call < kCapacity * 3 / 4 / kBatch; ++call) {
      pfb::TakeStats stats;
      pfb_measured([&] { stats = ring.take(kBatch, kStep, std::nullopt, out.data()); });
      r.entries += stats.taken + stats.dropped_stale, ++r.calls;  // entries walked
    }
  }
  return r;
}

// evict_stale over a full ring, half of it stale and shuffled: the one-pass compaction; per entry scanned.
Result evict_shuffled() {
  pfb::StalenessRing ring(config(), nullptr);
  std::vector<int64_t> steps(kCapacity, kStep);
  for (int64_t i = 0; i < kCapacity / 2; ++i) steps[i] = kStep - kMaxAge - 1 - i % 50;
  shuffle(steps);
  Result r;
  for (int lap = 0; lap < 4; ++lap) {
    fill(ring, steps, 1, lap * kCapacity);  // evicts what the previous lap kept
    pfb_measured([&] { ring.evict_stale(kStep); });
    r.entries += kCapacity, ++r.calls;
  }
  return r;
}

// evict_stale over a stream stamped 0..63 in order: the binary-search path; per entry removed.
Result evict_sorted() {
  constexpr int64_t kSteps = 64;
  pfb::StalenessRing ring(config(kSteps - 1), nullptr);
  fill(ring, iota(kCapacity, 0, kCapacity / kSteps), 1, 0);
  Result r;
  for (int64_t step = kSteps; step < 2 * kSteps; ++step) {
    pfb::TakeStats stats;
    pfb_measured([&] { stats = ring.evict_stale(step); });
    r.entries += stats.dropped_stale, ++r.calls;
  }
  return r;
}

// dispatch(512 prompts) then complete(8 trajectories per prompt, contiguous) into a full ring.
Result dispatch_complete() {
  constexpr int64_t kPrompts = kBatch / 8;
  pfb::StalenessRing ring(config(), nullptr);
  fill(ring, std::vector<int64_t>(kCapacity, kStep), 8, 0);
  Result r;
  for (int64_t call = 0; call < 64; ++call) {
    const auto prompts = iota(kPrompts, kCapacity + call * kPrompts);
    const auto trajs = iota(kBatch, kCapacity + call * kBatch);
    const auto prompt_of = iota(kBatch, 8 * (kCapacity + call * kPrompts), 8);
    pfb_measured([&] {
      ring.dispatch(prompts.data(), kPrompts, kStep);
      ring.complete(trajs.data(), prompt_of.data(), kBatch, std::nullopt);
    });
    r.entries += kBatch, ++r.calls;
  }
  return r;
}

// One training step's cycle, 64 times: dispatch(512 prompts) at step s, complete(8 trajectories each), take(4096)
// at s; under pace (prompts_per_step = 512, so every call passes admission and the take gate) or under drop.
Result cycle(pfb::Strategy strategy) {
  constexpr int64_t kPrompts = kBatch / 8;
  pfb::RingConfig c = config();
  c.strategy = strategy;
  if (strategy == pfb::Strategy::kPace) c.prompts_per_step = kPrompts, c.lookahead = kMaxAge;
  pfb::StalenessRing ring(c, nullptr);
  std::vector<int64_t> out(static_cast<size_t>(pfb::kBatchColumns * kBatch));
  Result r;
  for (int64_t call = 0; call < 64; ++call) {
    const int64_t step = kStep + call;
    const auto prompts = iota(kPrompts, call * kPrompts);
    const auto trajs = iota(kBatch, call * kBatch);
    const auto prompt_of = iota(kBatch, 8 * call * kPrompts, 8);
    pfb::TakeStats stats;
    pfb_measured([&] {
      ring.dispatch(prompts.data(), kPrompts, step);
      ring.complete(trajs.data(), prompt_of.data(), kBatch, std::nullopt);
      stats = ring.take(kBatch, step, std::nullopt, out.data());
    });
    r.entries += stats.taken, ++r.calls;
  }
  return r;
}

// Constructing a ring of 2^20 entries (allocation, and pre-touching if the core does it); per entry.
Result construct() {
  pfb::RingConfig c = config();
  c.capacity = 1 << 20;
  Result r;
  for (int i = 0; i < 2; ++i) {
    pfb_measured([&] { pfb::StalenessRing ring(c, nullptr); });
    r.entries += c.capacity, ++r.calls;
  }
  return r;
}

struct Workload {
  const char* name;
  std::function<Result()> run;
};

const std::vector<Workload>& workloads() {
  static const std::vector<Workload> all = {
      {"put", [] { return put(1); }},
      {"put_grouped8", [] { return put(8); }},
      {"take", [] { return take(1); }},
      {"take_grouped8", [] { return take(8); }},
      {"take_half_stale", take_half_stale},
      {"take_4sources", take_4sources},
      {"evict_stale_shuffled", evict_shuffled},
      {"evict_stale_sorted", evict_sorted},
      {"dispatch_complete", dispatch_complete},
      {"paced_cycle", [] { return cycle(pfb::Strategy::kPace); }},
      {"drop_cycle", [] { return cycle(pfb::Strategy::kDrop); }},
      {"construct", construct},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: perf_driver <workload> | --list\n");
    return 2;
  }
  for (const Workload& w : workloads()) {
    if (std::strcmp(argv[1], "--list") == 0) {
      std::printf("%s\n", w.name);
    } else if (w.name == std::string(argv[1])) {
      const Result r = w.run();
      std::printf("{\"workload\": \"%s\", \"entries\": %lld, \"calls\": %lld}\n", w.name,
                  static_cast<long long>(r.entries), static_cast<long long>(r.calls));
      return 0;
    }
  }
  if (std::strcmp(argv[1], "--list") == 0) return 0;
  std::fprintf(stderr, "unknown workload '%s'; run perf_driver --list for the names\n", argv[1]);
  return 2;
}
