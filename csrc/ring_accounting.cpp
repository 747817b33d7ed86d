// StalenessRing: what the bound does to the data (docs/data-bias.md): per-source counts, the bias monitor,
// the prompt-attempt table, per-source max_age overrides and their accessors.
#include "ring_detail.hpp"

#include <limits>

namespace pyfast_buffer {

void StalenessRing::check_slots(const int32_t* slots, int64_t n_slots, int64_t n, const char* what) const {
  if (!slots) return;
  if (n_slots != 1 && n_slots != n)
    throw InvalidArgument(concat("source: ", n_slots, " tags for ", n, " ", what, "; pass one int or one per ", what));
  for (int64_t i = 0; i < n_slots; ++i)
    if (slots[i] < 0 || slots[i] >= kSourceSlots)
      throw InvalidArgument(concat("source=", slots[i] - 1, " is out of range; pass a source in [0, ", kMaxSource,
                                   "] (or None for untagged)"));
}

namespace {
// Rollout latency of the entry at physical row p, in microseconds (0 when the clock went back).
inline int64_t latency_us(const ColumnPointers& c, int64_t p) {
  return std::max<int64_t>(c.complete_ns[p] - c.dispatch_ns[p], 0) / 1000;
}
}  // namespace

void StalenessRing::observe_walked(int64_t walked, int64_t current_step, bool first_use_always, bool unbounded,
                                   TakeStats& stats) {
  // One pass over the walked prefix (uses already counted by this take): per-source counts, the monitor's
  // trained and lost sketches, and each observed group's prompt record. Put entries (never a monitored
  // rollout) are counted entry by entry over contiguous rows, without group bookkeeping; an observed group
  // is handled whole.
  const ColumnPointers& c = columns_.get();
  const bool per_entry = !unbounded && per_entry_cutoffs();  // the same rule the take's plan walked by
  const int64_t* const stamps = per_entry ? expiry_.data() : age_steps();
  const int64_t cut = per_entry ? expiry_cut_ : take_cutoff(current_step, unbounded);
  // Per slot, by this call: taken, dropped, trained, and the dropped put entries (source_counts_ not yet told).
  std::array<std::array<int64_t, 4>, kSourceSlots> by_slot{};
  const int64_t cap = config_.capacity;
  for (int64_t i = 0; i < walked;) {
    const int64_t p = phys(i);
    const int64_t run = std::min(walked - i, cap - p);
    int64_t k = 0;
    for (; k < run; ++k) {
      const int64_t m = c.meta[p + k];
      if (meta_observed(m)) break;
      std::array<int64_t, 4>& n = by_slot[static_cast<size_t>(meta_slot(m))];
      const int64_t stale = stamps[p + k] < cut;
      n[static_cast<size_t>(stale)] += 1;
      n[2] += (1 - stale) & static_cast<int64_t>(first_use_always || c.uses[p + k] == 1);
      n[3] += stale;
    }
    i += k;
    if (k == run) continue;
    const int64_t q = p + k;  // an observed group starts here
    const int64_t len = c.group_len[q], m = c.meta[q];
    std::array<int64_t, 4>& n = by_slot[static_cast<size_t>(meta_slot(m))];
    if (stamps[q] < cut) {
      n[1] += len;
      observe_lost_group(q, false);
    } else {
      n[0] += len;
      if (first_use_always || c.uses[q] == 1) {  // its first take: trained
        n[2] += len;
        add_group(Fate::kTrained, q, len);
        attempts_.on_trained(c.group_id[q]);
      }
    }
    i += len;
  }
  for (int slot = 0; slot < kSourceSlots; ++slot) {
    const std::array<int64_t, 4>& n = by_slot[static_cast<size_t>(slot)];
    if (!(n[0] | n[1])) continue;
    SourceCounts& counts = source_counts_[static_cast<size_t>(slot)];
    counts.taken += n[0], counts.trained += n[2], counts.dropped += n[3];
    if (tagged_) stats.sources.push_back({slot, n[0], n[1]});
  }
}

void StalenessRing::observe_lost(int64_t count, bool evicted) {
  // The oldest `count` ready entries are about to leave: evicted (on_full) or dropped stale.
  const ColumnPointers& c = columns_.get();
  for (int64_t i = 0; i < count;) {
    const int64_t p = phys(i);
    observe_lost_group(p, evicted);
    i += c.group_len[p];
  }
}

void StalenessRing::observe_lost_group(int64_t p, bool evicted) {
  const ColumnPointers& c = columns_.get();
  const int64_t len = c.group_len[p], m = c.meta[p];
  SourceCounts& counts = source_counts_[static_cast<size_t>(meta_slot(m))];
  (evicted ? counts.evicted : counts.dropped) += len;
  if (c.uses[p] != 0 || !meta_observed(m) || !bias_) return;  // taken before, or never a monitored rollout
  add_group(Fate::kLost, p, len);
  attempts_.on_lost(c.group_id[p], len);
}

void StalenessRing::add_group(Fate fate, int64_t p, int64_t len) {
  // One complete() call stamped the whole group: one dispatch and one completion time, so one latency for
  // all its members; lengths were given for every trajectory of that call or for none.
  const ColumnPointers& c = columns_.get();
  bias_->add(fate, Quantity::kLatency, latency_us(c, p), len);
  if (meta_length(c.meta[p]) < 0) return;
  for (int64_t j = 0, q = p; j < len; ++j, q = q + 1 == config_.capacity ? 0 : q + 1)
    bias_->add(fate, Quantity::kLength, meta_length(c.meta[q]));
}

void StalenessRing::set_source_max_age(int32_t slot, int64_t max_age) {
  if (slot < 1 || slot >= kSourceSlots)
    throw InvalidArgument(concat("source_max_age: source ", slot - 1, " is out of range; use sources in [0, ",
                                 kMaxSource, "]"));
  if (max_age < -1)
    throw InvalidArgument(concat("source_max_age: max_age=", max_age, " for source ", slot - 1, " must be >= 0"));
  {
    MutexLock lock(mutex_);
    int64_t& own = source_max_age_[static_cast<size_t>(slot)];
    if (own == max_age) return;
    overrides_ += (max_age >= 0) - (own >= 0);
    own = max_age;
    expiry_valid_ = false;  // every entry of that source has a new stale-before step
  }
  ready_cv_.notify_all();  // under wait, a raised bound may unblock a waiting take
}

std::array<int64_t, kSourceSlots> StalenessRing::source_max_ages() const {
  MutexLock lock(mutex_);
  return source_max_age_;
}

std::vector<std::pair<int64_t, int64_t>> StalenessRing::starved(int64_t min_attempts) const {
  MutexLock lock(mutex_);
  return attempts_.starved_prompts(min_attempts);
}

AttemptCounters StalenessRing::attempt_counters() const {
  MutexLock lock(mutex_);
  return attempts_.counters();
}

std::array<SourceCounts, kSourceSlots> StalenessRing::source_counts() const {
  MutexLock lock(mutex_);
  return source_counts_;
}

std::unique_ptr<BiasMonitor> StalenessRing::bias() const {
  MutexLock lock(mutex_);
  return bias_ ? std::make_unique<BiasMonitor>(*bias_) : nullptr;
}

}  // namespace pyfast_buffer
