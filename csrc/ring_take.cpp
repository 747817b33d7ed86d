// StalenessRing: take; planning a batch (stale skips, groups, the wait gate) and committing it.
#include "ring_detail.hpp"

#include <limits>

namespace pyfast_buffer {

namespace {
// Stamps per branch-free block of the walk's scans: 32 is the smallest at which GCC 12 vectorises the
// reduction loop (at 8 it unrolls it fully and leaves it scalar).
constexpr int kScanBlock = 32;

// The refusal of a take whose walk reached a fresh group larger than the batch.
InvalidArgument group_too_big(int64_t batch_size, int64_t group_id, int64_t len) {
  return InvalidArgument(concat("batch_size=", batch_size, " is smaller than group ", group_id, " of ", len,
                                " trajectories; raise batch_size to at least ", len, " (a batch never splits a group)"));
}
}  // namespace

void StalenessRing::finish_plan(TakePlan& plan, int64_t span_start, int64_t walked, int64_t taken) {
  if (span_start >= 0 && walked > span_start) plan.spans.push_back({span_start, walked - span_start});
  plan.taken = taken;
  plan.walked = walked;
  plan.blocked_by = plan.full ? BlockedBy::kNone : BlockedBy::kTooFewReady;
}

bool StalenessRing::wait_blocked(int64_t current_step) const {
  if (in_flight_.size() == 0) return false;
  if (overrides_ == 0) return current_step - in_flight_.oldest_step() >= max_age_;
  // Per-source bounds: one pass over the in-flight prompts, each against its own source's max_age.
  // The bounds are copied into locals: a lambda's body is analysed without the caller's lock.
  const std::array<int64_t, kSourceSlots> own_ages = source_max_age_;
  const int64_t global = max_age_;
  return in_flight_.any_of([&own_ages, global, current_step](int64_t step, int64_t meta) {
    const int64_t own = own_ages[static_cast<size_t>(meta_slot(meta))];
    return current_step - step >= (own >= 0 ? own : global);
  });
}

std::string StalenessRing::wait_blocked_message(int64_t current_step) const {
  const auto blocking = in_flight_.at_or_before(current_step - max_age_);
  std::ostringstream out;
  out << blocking.size() << " in-flight prompt(s) at max_age=" << max_age_ << " (";
  for (size_t i = 0; i < blocking.size() && i < 8; ++i)
    out << (i ? ", " : "") << "prompt " << blocking[i].first << " since step " << blocking[i].second;
  if (blocking.size() > 8) out << ", ...";
  out << "); complete or fail them, or increase max_age (max_off_policy_threshold)";
  return out.str();
}

// Inlined into plan_take, its one caller: a stale run of one or two entries must not pay for a call.
[[gnu::always_inline]] inline int64_t StalenessRing::skip_stale(const int64_t* stamps, int64_t i, int64_t cutoff) const {
  // Scans contiguous physical runs without per-entry index arithmetic or dependent loads. A stamp (>= 0) was
  // below cutoff, so cutoff > 0 and no stamp - cutoff overflows: its sign bit says stale.
  while (i < size_) {
    const int64_t p = phys(i);
    const int64_t run = std::min(size_ - i, config_.capacity - p);
    const int64_t* s = stamps + p;
    int64_t k = 0;
    // Scalar first: a short stale run (one source's entries among fresh ones) ends here at little cost.
    const int64_t warm = std::min<int64_t>(run, 8);
    while (k < warm && s[k] < cutoff) ++k;
    if (k == 8) {
      // A long run goes on kScanBlock stamps at a time, branch-free: the AND of (stamp - cutoff) is negative
      // iff all are stale. GCC vectorises this loop at the baseline ISA (SSE2 psubq/pand; -fopt-info-vec).
      while (run - k >= kScanBlock) {
        uint64_t all = ~uint64_t{0};
        for (int j = 0; j < kScanBlock; ++j) all &= static_cast<uint64_t>(s[k + j]) - static_cast<uint64_t>(cutoff);
        if ((all >> 63) == 0) break;
        k += kScanBlock;
      }
      while (k < run && s[k] < cutoff) ++k;
    }
    i += k;
    if (k < run) break;
  }
  return i;
}

int64_t StalenessRing::expiry_of(int64_t p) const {
  const int64_t meta = columns_.get().meta[p];
  if (meta & kMetaProtected) return std::numeric_limits<int64_t>::max();
  const int64_t own = source_max_age_[static_cast<size_t>(meta_slot(meta))];
  // stamp + bound (both >= 0), saturating at INT64_MAX: a sum past every step is never below one.
  const int64_t stamp = age_steps()[p], bound = own >= 0 ? own : max_age_;
  return stamp > std::numeric_limits<int64_t>::max() - bound ? std::numeric_limits<int64_t>::max() : stamp + bound;
}

void StalenessRing::ensure_expiry() const {
  if (expiry_valid_) return;
  if (expiry_.empty()) expiry_.resize(static_cast<size_t>(config_.capacity));
  for (int64_t i = 0, p = head_; i < size_; ++i, p = p + 1 == config_.capacity ? 0 : p + 1)
    expiry_[static_cast<size_t>(p)] = expiry_of(p);
  expiry_valid_ = true;
}

void StalenessRing::stamp_expiry(int64_t first, int64_t count) {
  if (!expiry_valid_) return;  // not kept (no per-entry bound) or due for a rebuild anyway
  for (int64_t i = first; i < first + count; ++i) expiry_[static_cast<size_t>(phys(i))] = expiry_of(phys(i));
}

void StalenessRing::fill_cutoffs(int64_t current_step, bool any_strategy) const {
  ensure_expiry();
  expiry_cut_ = any_strategy || config_.strategy == Strategy::kDrop ? current_step
                                                                     : std::numeric_limits<int64_t>::min();
}

int64_t StalenessRing::take_cutoff(int64_t current_step, bool unbounded) const {
  return config_.strategy == Strategy::kDrop && !unbounded ? current_step - max_age_
                                                           : std::numeric_limits<int64_t>::min();
}

void StalenessRing::plan_take(int64_t batch_size, int64_t current_step, TakePlan& plan) const {
  plan.walked = plan.taken = plan.dropped = 0;
  plan.pace_blocker = -1;
  plan.full = false;
  plan.spans.clear();
  if (config_.strategy == Strategy::kWait && !plan.unbounded && wait_blocked(current_step)) {
    plan.blocked_by = BlockedBy::kInFlightAtMaxAge;
    return;
  }
  // Under drop, stale entries are skipped in contiguous scans: a group shares one stamp (and one source and
  // protection), so a stale group is skipped whole and every fresh entry reached starts a group. With
  // per-source bounds or protected entries the walk is the same over the stale-before column: an entry is
  // stale iff expiry_[p] < current_step, one scalar for every source.
  // An unbounded call walks as wait does: no stamp (>= 0) is below the cutoff.
  const bool per_entry = !plan.unbounded && per_entry_cutoffs();
  if (per_entry) fill_cutoffs(current_step, false);
  const int64_t cutoff = per_entry ? expiry_cut_ : take_cutoff(current_step, plan.unbounded);
  const int32_t* group_len = columns_.get().group_len;
  const int64_t* group_id = columns_.get().group_id;
  const int64_t* steps = per_entry ? expiry_.data() : age_steps();
  const int64_t size = size_, cap = config_.capacity;
  int64_t i = 0, taken = 0;
  int64_t p = head_;          // phys(i), advanced with i
  int64_t span_start = -1;    // start of the open span of fresh entries, -1 if none
  while (i < size) {
    if (steps[p] < cutoff) {  // a stale run: close the span, skip the run in contiguous scans
      if (span_start >= 0) plan.spans.push_back({span_start, i - span_start}), span_start = -1;
      const int64_t fresh = skip_stale(steps, i, cutoff);
      plan.dropped += fresh - i;
      i = fresh;
      if (i == size) break;
      p = phys(i);
    }
    if (span_start < 0) span_start = i;
    // A run of fresh singletons (ungrouped puts) in one tight scan, up to the wrap point or the batch.
    if (group_len[p] == 1) {
      const int64_t limit = std::min({batch_size - taken, cap - p, size - i});
      int64_t k = 1;
      // Scalar first: a short run (fresh entries among stale ones) ends here at little cost.
      const int64_t warm = std::min<int64_t>(limit, 8);
      while (k < warm && group_len[p + k] == 1 && steps[p + k] >= cutoff) ++k;
      // A long run goes on kScanBlock at a time, branch-free (a vectorised loop, like skip_stale's): the OR
      // of (stamp - cutoff) is negative iff one stamp is stale. With cutoff <= 0 every stamp (>= 0) is
      // fresh; above it no difference overflows.
      const int64_t floor = cutoff > 0 ? cutoff : 0;
      while (k >= 8 && limit - k >= kScanBlock) {
        uint64_t below = 0;
        uint32_t not_one = 0;
        for (int j = 0; j < kScanBlock; ++j) {
          below |= static_cast<uint64_t>(steps[p + k + j]) - static_cast<uint64_t>(floor);
          not_one |= static_cast<uint32_t>(group_len[p + k + j] ^ 1);
        }
        if ((below >> 63) != 0 || not_one != 0) break;
        k += kScanBlock;
      }
      while (k < limit && group_len[p + k] == 1 && steps[p + k] >= cutoff) ++k;
      taken += k, i += k, p += k;
      p -= p == cap ? cap : 0;
    }
    if (i == size || taken == batch_size) {
      plan.full = taken == batch_size;
      break;
    }
    if (steps[p] < cutoff) continue;
    const int64_t len = group_len[p];
    if (len > batch_size) throw group_too_big(batch_size, group_id[p], len);
    if (taken + len > batch_size) {
      plan.full = true;
      break;
    }
    taken += len;
    i += len;
    p += len;
    p -= p >= cap ? cap : 0;
    if (taken == batch_size) {
      plan.full = true;
      break;
    }
  }
  finish_plan(plan, span_start, i, taken);
  apply_pace_gate(plan, current_step);
}

void StalenessRing::apply_pace_gate(TakePlan& plan, int64_t current_step) const {
  if (!paced()) return;
  // The oldest groups are the batch; take it only if no in-flight prompt then passes max_age.
  if (const auto stamp = pace_blocker_for(plan, current_step)) {
    plan.walked = plan.taken = 0;
    plan.full = false;
    plan.spans.clear();
    plan.blocked_by = BlockedBy::kInFlightAtMaxAge;
    plan.pace_blocker = *stamp;
  }
}

void StalenessRing::commit_take(const TakePlan& plan, int64_t current_step, int64_t* base, TakeStats& stats) {
  const int64_t k_all = plan.taken;
  int64_t* const o_traj = base;
  int64_t* const o_group = base + k_all;
  int64_t* const o_step = base + 2 * k_all;
  int64_t* const o_age = base + 3 * k_all;
  int64_t* const o_uses = base + 4 * k_all;
  int64_t* const o_version = base + 5 * k_all;
  int64_t* const o_dispatch = base + 6 * k_all;
  int64_t* const o_complete = base + 7 * k_all;
  int64_t* const o_finish = base + 8 * k_all;
  int64_t* const o_source = base + 9 * k_all;
  // Under pace every use is a group's last (docs/design.md, "Reuse under the bound"): the admission rule
  // reserves one trainer slot per group, so a reused group would take a slot no admitted group was promised.
  const int32_t max_uses = paced() ? 1 : static_cast<int32_t>(config_.max_uses);
  const ColumnPointers c = columns_.get();  // a local copy: the output writes cannot alias it
  const int64_t* const ages = age_steps();
  const int64_t sync = config_.parameter_sync_step, max_age = max_age_;
  int64_t k = 0, survivors = 0, age_max = 0, over_age = 0;
  Int128 age_sum = 0;  // 2**40 ages near 2**63 overflow int64
  // With max_uses == 1 every taken entry retires and leaves with the walked prefix, so its ring `uses`
  // need not be written, unless the released-id hooks read it (note_walked) before it leaves.
  const bool uses_unread = config_.max_uses == 1 && !leave_hooks();
  if (config_.max_uses > 1 && !paced()) lone_unused_ = false;  // a taken entry may stay, with uses > 0
  // Ages come in runs (a group shares one stamp, producers stamp many entries alike): the histogram
  // and the sums are updated once per run of equal ages, not once per entry.
  int64_t run_age = 0, run_count = 0;
  auto flush = [&] {
    if (run_count == 0) return;
    age_sum += static_cast<Int128>(run_age) * run_count;
    age_max = std::max(age_max, run_age);
    stats.age_hist[age_bucket(run_age)] += run_count;
    over_age += run_age > max_age ? run_count : 0;
  };
  for (const Span& span : plan.spans) {
    for (int64_t i = span.start, end = span.start + span.count; i < end;) {
      // One contiguous physical run: six column copies, then one pass for age and uses.
      const int64_t p0 = phys(i);
      const int64_t run = std::min(end - i, config_.capacity - p0);
      if (run < 16) {  // a short run (fresh entries scattered among stale ones): entry by entry
        for (int64_t p = p0; p < p0 + run; ++p, ++k) {
          const int64_t age = current_step - ages[p];
          const int32_t uses = uses_unread ? 1 : ++c.uses[p];
          o_traj[k] = c.traj_id[p], o_group[k] = c.group_id[p], o_step[k] = c.sample_step[p];
          o_age[k] = age, o_uses[k] = uses, o_version[k] = sync > 0 ? c.sample_step[p] / sync : -1;
          o_dispatch[k] = c.dispatch_ns[p], o_complete[k] = c.complete_ns[p], o_finish[k] = c.finish_step[p];
          o_source[k] = meta_slot(c.meta[p]) - 1;
          if (age != run_age) flush(), run_age = age, run_count = 0;
          ++run_count;
          survivors += uses < max_uses;
        }
        i += run;
        continue;
      }
      std::copy_n(c.traj_id + p0, run, o_traj + k);
      std::copy_n(c.group_id + p0, run, o_group + k);
      std::copy_n(c.sample_step + p0, run, o_step + k);
      std::copy_n(c.finish_step + p0, run, o_finish + k);
      std::copy_n(c.dispatch_ns + p0, run, o_dispatch + k);
      std::copy_n(c.complete_ns + p0, run, o_complete + k);
      if (sync == 0) {  // policy_version is derived from sample_step: no column holds it
        std::fill_n(o_version + k, run, -1);
      } else if (sync == 1) {
        std::copy_n(c.sample_step + p0, run, o_version + k);
      } else {
        const int64_t* __restrict from = c.sample_step + p0;
        int64_t* __restrict version = o_version + k;
        for (int64_t j = 0; j < run; ++j) version[j] = from[j] / sync;
      }
      if (plain_meta_) {
        std::fill_n(o_source + k, run, int64_t{-1});  // every entry untagged
      } else {
        const int64_t* __restrict meta = c.meta + p0;
        int64_t* __restrict source_out = o_source + k;
        for (int64_t j = 0; j < run; ++j) source_out[j] = ((meta[j] >> kMetaSlotShift) & 0xFF) - 1;  // vectorisable
      }
      const int64_t* __restrict step = ages + p0;
      int64_t* __restrict age_out = o_age + k;
      const uint64_t first = static_cast<uint64_t>(step[0]);
      uint64_t differs = 0;
      for (int64_t j = 0; j < run; ++j) {  // vectorisable: ages, and whether any stamp differs from the first
        age_out[j] = current_step - step[j];
        differs |= static_cast<uint64_t>(step[j]) ^ first;
      }
      if (differs == 0) {  // one stamp for the whole run, the usual case: one histogram update
        const int64_t age = current_step - step[0];
        if (age != run_age) flush(), run_age = age, run_count = 0;
        run_count += run;
      } else {
        for (int64_t j = 0; j < run; ++j) {
          const int64_t age = age_out[j];
          if (age != run_age) flush(), run_age = age, run_count = 0;
          ++run_count;
        }
      }
      int64_t* __restrict uses_out = o_uses + k;
      int32_t* __restrict uses = c.uses + p0;
      if (uses_unread) {
        std::fill_n(uses_out, run, 1);  // uses 0 -> 1 for every entry
      } else {
        for (int64_t j = 0; j < run; ++j) {
          const int32_t u = ++uses[j];
          uses_out[j] = u;
          survivors += u < max_uses;
        }
      }
      k += run;
      i += run;
    }
  }
  flush();
  if (spans_) {  // some ready entry crossed a weight update: one pass over the batch for the span sums
    Int128 span_sum = 0;
    int64_t span_max = 0;
    for (int64_t j = 0; j < k_all; ++j) {
      const int64_t span = o_finish[j] - o_step[j];
      span_sum += span;
      span_max = std::max(span_max, span);
    }
    stats.span_sum = span_sum;
    stats.span_max = span_max;
  }
  // Before survivors move, while ring order is intact: the data accounting, then the released-id hooks.
  if (bias_ || tagged_) observe_walked(plan.walked, current_step, uses_unread, plan.unbounded, stats);
  if (leave_hooks()) note_walked(plan.walked, current_step, plan.unbounded);
  if (paced()) pace_forget_retired(plan.walked);
  stats.age_sum = age_sum;
  stats.age_max = age_max;
  stats.trained_over_age = over_age;
  ledger_.trained_over_age += over_age;
  marks_.touched_front(plan.walked);  // uses changed; survivors move within the walked prefix
  if (survivors > 0) {
    // Reused entries keep their place: move them, in order, to the end of the walked prefix.
    const int64_t cutoff = take_cutoff(current_step, plan.unbounded);
    const bool per_entry = !plan.unbounded && per_entry_cutoffs();
    int64_t write = plan.walked - 1;
    for (int64_t i = plan.walked - 1; i >= 0; --i) {
      const int64_t p = phys(i);
      if ((per_entry ? stale_at(p) : ages[p] < cutoff) || c.uses[p] >= max_uses) continue;
      const int64_t q = phys(write--);
      if (p == q) continue;
      c.traj_id[q] = c.traj_id[p], c.group_id[q] = c.group_id[p], c.sample_step[q] = c.sample_step[p];
      c.finish_step[q] = c.finish_step[p], c.dispatch_ns[q] = c.dispatch_ns[p];
      c.complete_ns[q] = c.complete_ns[p], c.uses[q] = c.uses[p], c.group_len[q] = c.group_len[p];
      if (!plain_meta_) c.meta[q] = c.meta[p];
      if (per_entry) expiry_[static_cast<size_t>(q)] = expiry_[static_cast<size_t>(p)];
    }
  }
  remove_prefix(plan.walked - survivors);
  stats.taken = plan.taken;
  stats.dropped_stale = plan.dropped;
  stats.retired = plan.taken - survivors;
  stats.retired_early = paced() && config_.max_uses > 1 ? stats.retired : 0;
  stats.blocked_by = plan.blocked_by;
  ledger_.taken += plan.taken;
  ledger_.retired += stats.retired;
  ledger_.retired_early += stats.retired_early;
  ledger_.dropped_stale += plan.dropped;
  if (plan.walked > 0) room_cv_.notify_all();
}

std::string StalenessRing::take_short_cause(const TakePlan& plan, int64_t batch_size, int64_t current_step) const {
  if (plan.blocked_by == BlockedBy::kInFlightAtMaxAge)
    return paced() ? pace_blocked_message(plan.pace_blocker, current_step) : wait_blocked_message(current_step);
  return concat("only ", plan.taken, " fresh entries are ready for batch_size=", batch_size, " (", size_,
                " ready in all, ", in_flight_.size(), " prompts in flight); produce faster, lower batch_size or raise "
                "the timeout");
}

TakeStats StalenessRing::take(int64_t batch_size, int64_t current_step, std::optional<double> timeout,
                              int64_t* out, bool bounded) {
  check_timeout(timeout);
  MutexLock lock(mutex_);
  check_open();
  expire_due();
  if (batch_size <= 0) throw InvalidArgument(concat("batch_size=", batch_size, " must be > 0"));
  if (!bounded && paced())
    throw InvalidArgument(
        "bounded=False is refused under pace: its admission already promised every group the bound; take with "
        "the bound, or use strategy 'drop' or 'wait' for takes without it");
  check_clock(current_step);
  TakeStats stats;
  TakePlan plan;
  // A property of this call alone, kept in its plan: another thread's take (this one waits without the lock)
  // still sees the buffer's max_age, which this call never changes.
  plan.unbounded = !bounded;
  plan_take(batch_size, current_step, plan);
  if (is_probe(timeout) && !plan.full) throw WouldBlock(take_short_cause(plan, batch_size, current_step));
  if (timeout && !plan.full) {
    const auto deadline = deadline_after(*timeout);
    SteadyTime last_check = SteadyClock::now();
    // Every change that could complete the batch notifies ready_cv_; re-plan on each wake-up. The wait
    // also wakes for the interrupt check and at the earliest lease deadline, which may unblock `wait`.
    while (!plan.full) {
      ready_cv_.wait_until(mutex_, next_wake(deadline));
      check_interrupt(last_check);
      check_open();
      expire_due();
      if (SteadyClock::now() >= deadline) {
        plan_take(batch_size, current_step, plan);
        if (plan.full) break;
        throw Timeout(concat("take timed out after ", *timeout, " s under ", strategy_name(config_.strategy),
                             ": ", take_short_cause(plan, batch_size, current_step)));
      }
      check_clock(current_step);  // a producer may have stamped a later step while we waited
      plan_take(batch_size, current_step, plan);
    }
  }
  advance_clock_by_trainer(current_step);
  commit_take(plan, current_step, out, stats);
  if (bias_) bias_->on_take();
  if (paced()) {
    // The trainer took at current_step: its next take is a step later (a retry at this step only finds
    // admission tighter by one step's slots, never looser).
    next_take_ = std::max(next_take_, current_step == std::numeric_limits<int64_t>::max() ? current_step
                                                                                           : current_step + 1);
    admit_cv_.notify_all();
  }
  fill_state(stats);
  return stats;
}

}  // namespace pyfast_buffer
