// StalenessRing: complete and put, grouping, appends, waiting for room and on_full eviction.
#include "ring_detail.hpp"

#include <limits>
#include <numeric>
#include <unordered_map>
#include <vector>

namespace pyfast_buffer {

namespace {
// Groups indices 0..n) by key, groups in order of first appearance, members in call order; returns
// true iff every group is a contiguous run of the call (then `order` is 0..n).
bool group_stably(const int64_t* keys, int64_t n, std::vector<int64_t>& order, std::vector<int64_t>& bounds) {
  // GRPO groups arrive contiguous with increasing (or decreasing) ids: then runs of equal keys are
  // the groups, and no hash map is needed. A key seen in two runs breaks the monotony: the map decides.
  bounds.reserve(static_cast<size_t>(n) + 1);  // no regrowth: at most one group per entry
  bounds.assign(1, 0);
  int64_t ups = 0, downs = 0, prev = keys[0];
  for (int64_t i = 1; i < n; ++i) {
    const int64_t key = keys[i];
    if (key == prev) continue;
    ups += key > prev, downs += key < prev;
    bounds.push_back(i);
    prev = key;
  }
  if (ups == 0 || downs == 0) {
    bounds.push_back(n);
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
    return true;
  }
  std::unordered_map<int64_t, int64_t> group_of_key;
  group_of_key.reserve(static_cast<size_t>(n));
  std::vector<int64_t> group(static_cast<size_t>(n)), counts;
  for (int64_t i = 0; i < n; ++i) {
    auto [it, fresh] = group_of_key.emplace(keys[i], static_cast<int64_t>(counts.size()));
    if (fresh) counts.push_back(0);
    group[i] = it->second;
    ++counts[it->second];
  }
  bounds.assign(counts.size() + 1, 0);
  for (size_t g = 0; g < counts.size(); ++g) bounds[g + 1] = bounds[g] + counts[g];
  std::vector<int64_t> next(bounds.begin(), bounds.end() - 1);
  order.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[next[group[i]]++] = i;
  return false;
}
}  // namespace

namespace {
// Under age_from='finish' a group's age is its finish step: throws InvalidArgument unless each group's members
// (grouped as in `groups`, named by `keys`) share one.
template <class Groups>
void check_one_finish_per_group(const Groups& groups, const int64_t* finish_steps, const int64_t* keys) {
  for (size_t g = 0; g + 1 < groups.bounds.size(); ++g) {
    const int64_t first = groups.order[groups.bounds[g]];
    for (int64_t k = groups.bounds[g] + 1; k < groups.bounds[g + 1]; ++k)
      if (finish_steps[groups.order[k]] != finish_steps[first])
        throw InvalidArgument(concat("finish_step: under age_from='finish' a group shares one finish step; group ",
                                     keys[first], " has finish_step ", finish_steps[first], " and ",
                                     finish_steps[groups.order[k]]));
  }
}
}  // namespace

bool StalenessRing::wait_for_room(int64_t n, std::optional<double> timeout, const char* call,
                                  std::optional<SteadyTime>& deadline) {
  if (size_ + n <= config_.capacity || config_.on_full == OnFull::kEvictOldest) return true;
  if (config_.on_full == OnFull::kBlock && is_probe(timeout))
    throw WouldBlock(concat(call, " waits for room: ", n, " entries need room, ", size_, " of capacity=",
                            config_.capacity, " are ready"));
  if (config_.on_full == OnFull::kError || !timeout)
    throw Full(concat("ring full: ", n, " entries do not fit, ", size_, " of capacity=", config_.capacity,
                      " are ready; take more often, raise capacity, use on_full='evict_oldest'",
                      config_.on_full == OnFull::kBlock ? ", or pass timeout= to wait for room" : " or 'block'"));
  if (!deadline) deadline = deadline_after(*timeout);  // one deadline for every wait of the call
  SteadyTime last_check = SteadyClock::now();
  for (;;) {
    room_cv_.wait_until(mutex_, next_wake(*deadline));
    check_interrupt(last_check);
    check_open();
    if (size_ + n <= config_.capacity) return false;  // room after waiting: the caller re-validates its arguments
    if (SteadyClock::now() >= *deadline) break;
  }
  throw Timeout(concat(call, " timed out after ", *timeout, " s waiting for room: ", n, " entries need room, ",
                       size_, " of capacity=", config_.capacity,
                       " are ready; take more often, raise capacity or use on_full='evict_oldest'"));
}

namespace {
// Writes the `n` entries of one group at physical rows [p, p + n) (no wrap). Member j is the call's
// entry order[j], or j when `order` is null (then the ids are copied as blocks); restrict pointers
// tell the compiler the column stores cannot change the inputs, so nothing is reloaded per entry.
inline void write_group(const ColumnPointers& c, int64_t p, int64_t n, const int64_t* __restrict traj_ids,
                        const int64_t* __restrict group_ids, const int64_t* __restrict order, int64_t group_id,
                        int64_t step, int64_t finish, int64_t dispatch_ns, int64_t complete_ns, int32_t group_len,
                        int64_t meta) {
  int64_t* __restrict traj = c.traj_id + p;
  int64_t* __restrict group = c.group_id + p;
  if (n < 16) {  // a GRPO-sized group: one fused pass beats eight short column loops
    int64_t *__restrict step_col = c.sample_step + p, *__restrict finish_col = c.finish_step + p;
    int64_t *__restrict dispatch_col = c.dispatch_ns + p, *__restrict complete_col = c.complete_ns + p;
    int64_t* __restrict meta_col = c.meta + p;
    int32_t *__restrict uses_col = c.uses + p, *__restrict len_col = c.group_len + p;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t src = order ? order[j] : j;
      traj[j] = traj_ids[src];
      group[j] = group_ids ? group_ids[src] : group_id;
      step_col[j] = step, finish_col[j] = finish, dispatch_col[j] = dispatch_ns, complete_col[j] = complete_ns;
      meta_col[j] = meta, uses_col[j] = 0, len_col[j] = group_len;
    }
    return;
  }
  if (order) {
    for (int64_t j = 0; j < n; ++j) traj[j] = traj_ids[order[j]];
    if (group_ids)
      for (int64_t j = 0; j < n; ++j) group[j] = group_ids[order[j]];
    else
      std::fill_n(group, n, group_id);
  } else {
    std::copy_n(traj_ids, n, traj);
    if (group_ids)
      std::copy_n(group_ids, n, group);
    else
      std::fill_n(group, n, group_id);
  }
  std::fill_n(c.sample_step + p, n, step);
  std::fill_n(c.finish_step + p, n, finish);
  std::fill_n(c.dispatch_ns + p, n, dispatch_ns);
  std::fill_n(c.complete_ns + p, n, complete_ns);
  std::fill_n(c.meta + p, n, meta);
  std::fill_n(c.uses + p, n, 0);
  std::fill_n(c.group_len + p, n, group_len);
}
}  // namespace

void StalenessRing::append_group(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* order,
                                 int64_t len, int64_t group_id, int64_t sample_step, int64_t dispatch_ns,
                                 int64_t complete_ns, const int64_t* finish_steps, int64_t n_finish, int64_t meta) {
  const ColumnPointers c = columns_.get();  // local copies: the column stores cannot alias them
  const int64_t cap = config_.capacity;
  int64_t p = head_ + size_;
  p -= p >= cap ? cap : 0;
  const int64_t* const members = order;  // the call's indices of the members, before the fast path below drops them
  // One finish step for the whole group, or the dispatch step; one per trajectory is written below.
  const int64_t finish = n_finish == 1 ? finish_steps[0] : sample_step;
  const int64_t age_stamp = config_.age_from == AgeFrom::kFinish && n_finish > 1
                                ? finish_steps[members ? members[0] : 0]
                                : (config_.age_from == AgeFrom::kFinish ? finish : sample_step);
  if (size_ > 0 && age_stamp < age_steps()[p == 0 ? cap - 1 : p - 1]) sorted_ = false;
  // Members are in increasing call order; if the last is len - 1 past the first they are consecutive.
  if (order && order[len - 1] - order[0] == len - 1) {
    traj_ids += order[0];
    group_ids = group_ids ? group_ids + order[0] : nullptr;
    order = nullptr;
  }
  // At most two contiguous runs: up to the end of the columns, then from row 0.
  const int64_t first = std::min(len, cap - p);
  if (len > 1) lone_unused_ = false;
  mirrored_ = false;  // a completed group: its prompt's id, its own completion time
  write_group(c, p, first, traj_ids, group_ids, order, group_id, sample_step, finish, dispatch_ns, complete_ns,
              static_cast<int32_t>(len), meta);
  if (first < len) {
    const int64_t rest = len - first;
    write_group(c, 0, rest, order ? traj_ids : traj_ids + first, group_ids && !order ? group_ids + first : group_ids,
                order ? order + first : nullptr, group_id, sample_step, finish, dispatch_ns, complete_ns,
                static_cast<int32_t>(len), meta);
  }
  if (n_finish > 1) {
    for (int64_t j = 0; j < len; ++j) c.finish_step[phys(size_ + j)] = finish_steps[members ? members[j] : j];
  }
  if (n_finish > 0 || config_.age_from == AgeFrom::kFinish) note_spans(size_, len);
  stamp_expiry(size_, len);
  size_ += len;
  if (config_.unique_ids)
    for (int64_t j = 0; j < len; ++j) live_ids_.insert(traj_ids[order ? order[j] : j]);
}

void StalenessRing::append_runs(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* bounds,
                                int64_t n_groups, const int64_t* sample_steps, int64_t n_steps, int64_t n,
                                int64_t stamp, const int64_t* finish_steps, int64_t n_finish, const int32_t* slots,
                                int64_t n_slots) {
  const ColumnPointers c = columns_.get();  // local copies: the column stores cannot alias them
  const int64_t cap = config_.capacity;
  const int64_t start = head_ + size_ >= cap ? head_ + size_ - cap : head_ + size_;
  // Sorted stays true iff the age stamps continue the ring's last one without a descent.
  const bool by_finish = config_.age_from == AgeFrom::kFinish && n_finish > 0;
  const int64_t* keys = by_finish ? finish_steps : sample_steps;
  const int64_t n_keys = by_finish ? n_finish : n_steps;
  int64_t prev = size_ > 0 ? age_steps()[start == 0 ? cap - 1 : start - 1] : std::numeric_limits<int64_t>::min();
  bool descends = false;
  for (int64_t i = 0; i < n_keys; ++i) descends |= keys[i] < prev, prev = keys[i];
  if (descends) sorted_ = false;
  if (group_ids || n_finish > 0) mirrored_ = false;
  for (int64_t done = 0, p = start; done < n; p = 0) {  // at most two contiguous runs
    const int64_t run = std::min(n - done, cap - p);
    std::copy_n(traj_ids + done, run, c.traj_id + p);
    std::copy_n((group_ids ? group_ids : traj_ids) + done, run, c.group_id + p);  // ungrouped: its own group
    if (n_steps == 1) {
      std::fill_n(c.sample_step + p, run, sample_steps[0]);
    } else {
      std::copy_n(sample_steps + done, run, c.sample_step + p);
    }
    if (n_finish == 0) {  // each trajectory finished with the weights it started with
      if (n_steps == 1)
        std::fill_n(c.finish_step + p, run, sample_steps[0]);
      else
        std::copy_n(sample_steps + done, run, c.finish_step + p);
    } else if (n_finish == 1) {
      std::fill_n(c.finish_step + p, run, finish_steps[0]);
    } else {
      std::copy_n(finish_steps + done, run, c.finish_step + p);
    }
    std::fill_n(c.dispatch_ns + p, run, stamp);
    std::fill_n(c.complete_ns + p, run, stamp);
    if (!slots || n_slots == 1) {
      std::fill_n(c.meta + p, run, make_meta(-1, slots ? slots[0] : 0, false, false));
    } else {
      for (int64_t j = 0; j < run; ++j) c.meta[p + j] = make_meta(-1, slots[done + j], false, false);
    }
    std::fill_n(c.uses + p, run, 0);
    if (!bounds) std::fill_n(c.group_len + p, run, 1);
    done += run;
  }
  if (bounds) {
    lone_unused_ = false;  // groups of one are possible here, but rare enough not to scan for
    int32_t* group_len = c.group_len;
    for (int64_t g = 0, p = start; g < n_groups; ++g) {
      const int32_t len = static_cast<int32_t>(bounds[g + 1] - bounds[g]);
      if (p + len <= cap) {  // GRPO-sized groups: a plain loop, no call per group
        for (int32_t j = 0; j < len; ++j) group_len[p + j] = len;
        p = p + len == cap ? 0 : p + len;
      } else {
        for (int32_t j = 0; j < len; ++j, p = p + 1 == cap ? 0 : p + 1) group_len[p] = len;
      }
    }
  }
  if (n_finish > 0) note_spans(size_, n);
  stamp_expiry(size_, n);
  size_ += n;
  if (config_.unique_ids)
    for (int64_t j = 0; j < n; ++j) live_ids_.insert(traj_ids[j]);
}

void StalenessRing::note_spans(int64_t first, int64_t count) {
  if (spans_) return;
  const ColumnPointers& c = columns_.get();
  for (int64_t i = first; i < first + count && !spans_; ++i) spans_ = c.finish_step[phys(i)] != c.sample_step[phys(i)];
}

void StalenessRing::evict_oldest_groups(int64_t need) {
  // Walks whole groups from the head with local cursors (the loads cannot alias them).
  const int32_t* group_len = columns_.get().group_len;
  const int64_t cap = config_.capacity, excess = size_ + need - cap;
  int64_t evicted = 0, head = head_;
  while (evicted < excess) {
    if (group_len[head] == 1 && excess - evicted >= 8 && cap - head >= 8) {  // eight singletons at once
      uint32_t not_one = 0;
      for (int j = 0; j < 8; ++j) not_one |= static_cast<uint32_t>(group_len[head + j] ^ 1);
      if (not_one == 0) {
        evicted += 8;
        head += 8;
        head -= head == cap ? cap : 0;
        continue;
      }
    }
    const int64_t len = group_len[head];
    evicted += len;
    head += len;
    head -= head >= cap ? cap : 0;
  }
  evict_prefix(evicted);
}

void StalenessRing::evict_prefix(int64_t count) {
  if (bias_ || tagged_) observe_lost(count, true);
  if (leave_hooks()) note_prefix_left(count, ReleaseReason::kEvicted);
  if (paced()) pace_forget_prefix(count);
  remove_prefix(count);
  ledger_.evicted += count;
  evicted_unreported_ += count;
}

int64_t StalenessRing::evict_oldest(int64_t groups) {
  if (groups < 0) throw InvalidArgument(concat("groups=", groups, " must be >= 0; pass how many groups to evict"));
  MutexLock lock(mutex_);
  check_open();
  const int32_t* group_len = columns_.get().group_len;
  int64_t evicted = 0;
  for (int64_t g = 0; g < groups && evicted < size_; ++g) evicted += group_len[phys(evicted)];
  if (evicted == 0) return 0;
  evict_prefix(evicted);
  room_cv_.notify_all();  // blocked puts under on_full="block" may fit now
  if (paced()) admit_cv_.notify_all();  // the admission limit counts ready entries: fewer may admit more
  return evicted;
}

void StalenessRing::complete(const int64_t* traj_ids, const int64_t* prompt_ids, int64_t n,
                             std::optional<double> timeout, const int64_t* finish_steps, int64_t n_finish,
                             const int64_t* lengths) {
  check_timeout(timeout);
  MutexLock lock(mutex_);
  check_open();
  expire_due();
  if (n == 0) return;
  if (n > config_.capacity)
    throw InvalidArgument(concat("traj_ids: ", n, " trajectories exceed capacity=", config_.capacity,
                                 "; raise capacity or complete fewer prompts per call"));
  if (auto dup = first_duplicate(traj_ids, n))
    throw InvalidArgument(concat("traj_ids: trajectory ", *dup, " appears twice; complete each trajectory once"));
  if (n_finish != 0 && n_finish != 1 && n_finish != n)
    throw InvalidArgument(concat("finish_step: ", n_finish, " steps for ", n,
                                 " trajectories; pass one step or one per trajectory"));
  if (lengths)
    for (int64_t i = 0; i < n; ++i)
      if (lengths[i] < 0 || lengths[i] >= kNoLength)
        throw InvalidArgument(concat("lengths: ", lengths[i], " for trajectory ", traj_ids[i],
                                     " is not a token count; pass ints in [0, 2**32 - 1)"));
  Groups groups;
  group_stably(prompt_ids, n, groups.order, groups.bounds);
  const size_t n_groups = groups.bounds.size() - 1;
  if (n_finish > 1 && config_.age_from == AgeFrom::kFinish) check_one_finish_per_group(groups, finish_steps, prompt_ids);
  std::optional<SteadyTime> deadline;
  for (;;) {  // validate, then wait for room; after a wait, validate again (another thread may have failed a prompt)
    expire_due();
    for (size_t g = 0; g < n_groups; ++g) {
      const int64_t prompt = prompt_ids[groups.order[groups.bounds[g]]];
      if (!in_flight_.contains(prompt))
        throw InvalidArgument(concat("prompt_ids: prompt ", prompt,
                                     " is not in flight; dispatch it first (it may already be "
                                     "completed, failed or expired)"));
      if (n_finish == 0) continue;
      const int64_t started = in_flight_.at(prompt).sample_step;
      for (int64_t k = groups.bounds[g]; k < groups.bounds[g + 1]; ++k) {
        const int64_t finish = finish_steps[n_finish == 1 ? 0 : groups.order[k]];
        if (finish < started)
          throw InvalidArgument(concat("finish_step=", finish, " of trajectory ", traj_ids[groups.order[k]],
                                       " is before step ", started, ", the stamp of prompt ", prompt,
                                       " (its dispatch step, or the step restamp_in_flight raised it to); pass the "
                                       "step of the weights in force when it finished (>= ", started, ")"));
      }
    }
    check_not_live(traj_ids, n);
    if (wait_for_room(n, timeout, "complete", deadline)) break;
  }
  if (size_ + n > config_.capacity) evict_oldest_groups(n);
  const int64_t stamp = now_ns();
  for (size_t g = 0; g < n_groups; ++g) {
    const int64_t* members = groups.order.data() + groups.bounds[g];
    const int64_t len = groups.bounds[g + 1] - groups.bounds[g];
    const int64_t prompt = prompt_ids[members[0]];
    const InFlightPrompt rec = in_flight_.at(prompt);
    append_group(traj_ids, nullptr, members, len, prompt, rec.sample_step, rec.dispatch_ns, stamp, finish_steps,
                 n_finish, rec.meta);
    if (paced()) ready_groups_.add(age_steps()[phys(size_ - 1)]);
    in_flight_.erase(prompt);
    // What the bound does to the data: the group's lengths, its rollout latency, its prompt's record.
    const int64_t latency_us = std::max<int64_t>(stamp - rec.dispatch_ns, 0) / 1000;
    bias_->add(Fate::kGenerated, Quantity::kLatency, latency_us, len);
    if (lengths) {
      int64_t* meta = columns_.get().meta;
      for (int64_t j = 0; j < len; ++j) {
        const int64_t length = lengths[members[j]];
        meta[phys(size_ - len + j)] = (rec.meta & ~kNoLength) | length;
        bias_->add(Fate::kGenerated, Quantity::kLength, length);
      }
    }
    attempts_.on_complete(prompt);
    plain_meta_ = false;
    if (rec.meta & kMetaProtected) attempts_.count_protected(), protected_seen_ = true;
    source_counts_[static_cast<size_t>(meta_slot(rec.meta))].generated += len;
  }
  if (paced()) pace_restore_order();
  for (int64_t i = 0; i < n_finish; ++i) advance_clock_by_stamp(finish_steps[i]);  // weights that existed
  ledger_.completed += static_cast<int64_t>(n_groups);
  ledger_.put_total += n;
  lock.unlock();  // wake consumers after the lock is free, so they do not wake only to block on it
  ready_cv_.notify_all();
  if (paced()) admit_cv_.notify_all();  // under age_from='finish' a completion can move a group's stamp forward
}

void StalenessRing::put(const int64_t* traj_ids, const int64_t* group_ids, const int64_t* sample_steps,
                        int64_t n_steps, int64_t n, std::optional<double> timeout, const int64_t* finish_steps,
                        int64_t n_finish, const int32_t* slots, int64_t n_slots) {
  check_timeout(timeout);
  MutexLock lock(mutex_);
  check_open();
  if (n == 0) return;
  if (n_steps != 1 && n_steps != n)
    throw InvalidArgument(concat("sample_step: ", n_steps, " stamps for ", n,
                                 " trajectories; pass one stamp or one per trajectory"));
  if (n > config_.capacity)
    throw InvalidArgument(concat("traj_ids: ", n, " trajectories exceed capacity=", config_.capacity,
                                 "; raise capacity or put fewer per call"));
  if (auto dup = first_duplicate(traj_ids, n))
    throw InvalidArgument(concat("traj_ids: trajectory ", *dup, " appears twice; put each trajectory once"));
  check_slots(slots, n_slots, n, "trajectories");
  int64_t max_step = -1;
  for (int64_t i = 0; i < n_steps; ++i) {
    if (sample_steps[i] < 0)
      throw InvalidArgument(concat("sample_step=", sample_steps[i], " is negative; steps are ints >= 0"));
    max_step = std::max(max_step, sample_steps[i]);
  }
  if (n_finish != 0 && n_finish != 1 && n_finish != n)
    throw InvalidArgument(concat("finish_step: ", n_finish, " steps for ", n,
                                 " trajectories; pass one step or one per trajectory"));
  for (int64_t i = 0; i < std::max(n_finish, n_finish > 0 ? n_steps : 0); ++i) {
    const int64_t finish = finish_steps[n_finish == 1 ? 0 : i], started = sample_steps[n_steps == 1 ? 0 : i];
    if (finish < started)
      throw InvalidArgument(concat("finish_step=", finish, " of trajectory ", traj_ids[i],
                                   " is before its sample_step=", started,
                                   "; pass the step of the weights in force when it finished"));
  }
  Groups groups;
  bool contiguous = true;
  if (group_ids) {
    contiguous = group_stably(group_ids, n, groups.order, groups.bounds);
    for (size_t g = 0; g + 1 < groups.bounds.size() && n_steps > 1; ++g) {
      const int64_t first = groups.order[groups.bounds[g]];
      for (int64_t k = groups.bounds[g] + 1; k < groups.bounds[g + 1]; ++k)
        if (sample_steps[groups.order[k]] != sample_steps[first])
          throw InvalidArgument(concat("sample_step: group ", group_ids[first], " has entries stamped ",
                                       sample_steps[first], " and ", sample_steps[groups.order[k]],
                                       "; a group shares one sample_step"));
    }
    if (n_finish > 1 && config_.age_from == AgeFrom::kFinish) check_one_finish_per_group(groups, finish_steps, group_ids);
    for (size_t g = 0; g + 1 < groups.bounds.size() && slots && n_slots > 1; ++g) {
      const int64_t first = groups.order[groups.bounds[g]];
      for (int64_t k = groups.bounds[g] + 1; k < groups.bounds[g + 1]; ++k)
        if (slots[groups.order[k]] != slots[first])
          throw InvalidArgument(concat("source: group ", group_ids[first], " has entries tagged ", slots[first] - 1,
                                       " and ", slots[groups.order[k]] - 1, "; a group shares one source"));
    }
  }
  // Under pace the groups are admitted like dispatched prompts, each at its age stamp.
  StepCounts asked;
  int64_t asked_groups = 0;
  if (paced()) {
    const bool by_finish = config_.age_from == AgeFrom::kFinish && n_finish > 0;
    auto stamp_of = [&](int64_t i) {
      return by_finish ? finish_steps[n_finish == 1 ? 0 : i] : sample_steps[n_steps == 1 ? 0 : i];
    };
    if (group_ids) {
      for (size_t g = 0; g + 1 < groups.bounds.size(); ++g) ++asked[stamp_of(groups.order[groups.bounds[g]])];
      asked_groups = static_cast<int64_t>(groups.bounds.size()) - 1;
    } else {
      for (int64_t i = 0; i < n; ++i) ++asked[stamp_of(i)];
      asked_groups = n;
    }
    check_pace_call_size(asked_groups, "put");
  }
  std::optional<SteadyTime> deadline;
  bool waited = false;
  for (;;) {  // after a wait, validate again: another thread may have put one of these ids
    check_not_live(traj_ids, n);
    if (paced() && !wait_for_admission(asked, asked_groups, asked.begin()->first, false, timeout, "put",
                                       deadline, waited))
      continue;
    if (wait_for_room(n, timeout, "put", deadline)) break;
  }
  if (paced()) {
    ledger_.admitted += asked_groups;
    ledger_.admission_waits += waited;
  }
  if (size_ + n > config_.capacity) evict_oldest_groups(n);
  const int64_t stamp = now_ns();
  int64_t n_groups = n;
  if (group_ids) n_groups = static_cast<int64_t>(groups.bounds.size()) - 1;
  if (contiguous) {  // ungrouped, or GRPO groups as they usually arrive: whole columns at once
    append_runs(traj_ids, group_ids, group_ids ? groups.bounds.data() : nullptr, n_groups, sample_steps, n_steps, n,
                stamp, finish_steps, n_finish, slots, n_slots);
  } else {
    for (int64_t g = 0; g < n_groups; ++g) {
      const int64_t* members = groups.order.data() + groups.bounds[g];
      const int64_t step = sample_steps[n_steps > 1 ? members[0] : 0];
      const int32_t slot = slots ? slots[n_slots > 1 ? members[0] : 0] : 0;
      append_group(traj_ids, group_ids, members, groups.bounds[g + 1] - groups.bounds[g], 0, step, stamp, stamp,
                   finish_steps, n_finish, make_meta(-1, slot, false, false));
    }
  }
  if (!slots || n_slots == 1) {  // the usual call: one source for all, O(1)
    SourceCounts& counts = source_counts_[static_cast<size_t>(slots ? slots[0] : 0)];
    counts.dispatched += n_groups, counts.generated += n;
  } else {
    for (int64_t i = 0; i < n; ++i) ++source_counts_[static_cast<size_t>(slots[i])].generated;
    if (group_ids)
      for (int64_t g = 0; g < n_groups; ++g) ++source_counts_[static_cast<size_t>(slots[groups.order[groups.bounds[g]]])].dispatched;
    else
      for (int64_t i = 0; i < n; ++i) ++source_counts_[static_cast<size_t>(slots[i])].dispatched;
  }
  if (slots)
    for (int64_t i = 0; i < n_slots; ++i) tagged_ |= slots[i] != 0;
  plain_meta_ &= !tagged_;
  if (paced()) {
    for (const auto& [age_stamp, count] : asked) ready_groups_.add(age_stamp, count);
    pace_restore_order();
  }
  ledger_.dispatched += n_groups;
  ledger_.completed += n_groups;
  ledger_.put_total += n;
  advance_clock_by_stamp(max_step);
  for (int64_t i = 0; i < n_finish; ++i) advance_clock_by_stamp(finish_steps[i]);  // weights that existed
  lock.unlock();
  ready_cv_.notify_all();
}

}  // namespace pyfast_buffer
