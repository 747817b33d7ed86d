// Fixed-size log-linear histograms of rollout latency and response length, cumulative and over a window.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

namespace pyfast_buffer {

/// Sub-buckets per power of two: a bucket of values >= 32 spans at most 1/16 of its lower edge.
constexpr int kSketchSub = 16;

/// Values at or above 2**kSketchTopBit fall in the last bucket (latencies are in microseconds: 2**41 us is
/// about 25 days; lengths are token counts).
constexpr int kSketchTopBit = 41;

/// Buckets per sketch: values below 32 exactly, then kSketchSub per power of two up to 2**kSketchTopBit.
constexpr int kSketchBuckets = 2 * kSketchSub + kSketchSub * (kSketchTopBit - 5);

/// Returns the bucket of `value` (negative values count as 0): exact below 32, else
/// kSketchSub buckets per power of two, the last bucket holding every value >= 2**kSketchTopBit.
inline int sketch_bucket(int64_t value) {
  if (value < 2 * kSketchSub) return value < 0 ? 0 : static_cast<int>(value);
  constexpr int64_t top = (int64_t{1} << kSketchTopBit) - 1;
  const int64_t v = value > top ? top : value;
  const int e = 63 - __builtin_clzll(static_cast<unsigned long long>(v));  // 5 <= e < kSketchTopBit
  return kSketchSub * (e - 3) + static_cast<int>((v >> (e - 4)) & (kSketchSub - 1));
}

/// Counts per bucket plus the exact count and sum of the values added.
struct Sketch {
  std::array<int64_t, kSketchBuckets> counts{};
  int64_t n = 0;
  double sum = 0;

  /// Adds `count` copies of `value`.
  void add(int64_t value, int64_t count = 1) {
    counts[static_cast<size_t>(sketch_bucket(value))] += count;
    n += count;
    sum += static_cast<double>(value) * static_cast<double>(count);
  }
};

/// What became of a monitored trajectory: generated (completed), trained (taken once) or lost
/// (dropped stale or evicted before any take).
enum class Fate : int { kGenerated = 0, kTrained = 1, kLost = 2 };

/// The two monitored quantities: rollout latency (complete - dispatch, microseconds) and response length.
enum class Quantity : int { kLatency = 0, kLength = 1 };

/// Number of (fate, quantity) sketches.
constexpr int kBiasSketches = 6;

/// Sub-windows of the sliding window, and take calls per sub-window: the window covers the last
/// 3 * kWindowTakes to 4 * kWindowTakes take calls.
constexpr int kWindowParts = 4;
constexpr int64_t kWindowTakes = 16;

/// Cumulative and windowed sketches of every (fate, quantity); about 150 KiB, allocated once.
struct BiasMonitor {
  std::array<Sketch, kBiasSketches> total;
  std::array<std::array<Sketch, kBiasSketches>, kWindowParts> window;
  int current = 0;          // the sub-window being filled
  int64_t takes_in_current = 0;
  int64_t rotations = 0;    // sub-windows completed since construction

  /// Adds `count` values `value` of `q` with fate `f` to the cumulative and the current sketches.
  void add(Fate f, Quantity q, int64_t value, int64_t count = 1) {
    const size_t k = static_cast<size_t>(static_cast<int>(f) * 2 + static_cast<int>(q));
    total[k].add(value, count);
    window[static_cast<size_t>(current)][k].add(value, count);
  }

  /// Counts one take call; every kWindowTakes calls the oldest sub-window is cleared and becomes current.
  void on_take() {
    if (++takes_in_current < kWindowTakes) return;
    takes_in_current = 0;
    current = (current + 1) % kWindowParts;
    window[static_cast<size_t>(current)] = {};
    ++rotations;
  }
};

}  // namespace pyfast_buffer
