// StalenessRing: the ledger, max_age, size and close, state export/import (checkpoints) and debug_string.
#include "ring_detail.hpp"

#include <unordered_set>
#include <vector>

namespace pyfast_buffer {

namespace {
const char* on_full_name(OnFull f) {
  switch (f) {
    case OnFull::kEvictOldest: return "evict_oldest";
    case OnFull::kBlock: return "block";
    default: return "error";
  }
}
}  // namespace

Ledger StalenessRing::ledger() {
  MutexLock lock(mutex_);
  expire_due();
  Ledger copy = ledger_;
  copy.in_flight = in_flight_.size();
  copy.buffer_left = size_;
  return copy;
}

int64_t StalenessRing::max_age() const {
  MutexLock lock(mutex_);
  return max_age_;
}

void StalenessRing::set_max_age(int64_t max_age) {
  if (max_age < 0) throw InvalidArgument(concat("max_age=", max_age, " must be >= 0"));
  MutexLock lock(mutex_);
  if (max_age == max_age_) return;
  max_age_ = max_age;
  expiry_valid_ = false;  // the stale-before steps of entries without their own bound move with it
  ++ledger_.max_age_changes;
  lock.unlock();
  ready_cv_.notify_all();  // under wait, a raised bound may unblock a waiting take
  admit_cv_.notify_all();  // under pace, a raised bound gives lagged prompts more slots
}

int64_t StalenessRing::size() const {
  MutexLock lock(mutex_);
  return size_;
}

int64_t StalenessRing::in_flight() {
  MutexLock lock(mutex_);
  expire_due();
  return in_flight_.size();
}

bool StalenessRing::closed() const {
  MutexLock lock(mutex_);
  return closed_;
}

void StalenessRing::close() {
  {
    MutexLock lock(mutex_);
    closed_ = true;
  }
  ready_cv_.notify_all();
  room_cv_.notify_all();
  admit_cv_.notify_all();
}

void StalenessRing::export_scalars(RingState& s) const {
  s.ledger = ledger_;
  s.ledger.in_flight = in_flight_.size();
  s.ledger.buffer_left = size_;
  s.clock = clock_;
  s.evicted_unreported = evicted_unreported_;
  s.next_take = next_take_;
  s.attempt_counters = attempts_.counters();
  s.source_counts = source_counts_;
}

RingState StalenessRing::export_state() {
  MutexLock lock(mutex_);
  expire_due();
  RingState s;
  const ColumnPointers& c = columns_.get();
  // The ring's geometry is copied into locals: a lambda's body is analysed without the caller's lock.
  const int64_t head = head_, size = size_, cap = config_.capacity;
  auto copy = [head, size, cap](auto& dst, const auto* col) {  // one column, oldest entry first
    dst.resize(static_cast<size_t>(size));
    for (int64_t i = 0, p = head; i < size; ++i, p = p + 1 == cap ? 0 : p + 1) dst[i] = col[p];
  };
  copy(s.traj_id, c.traj_id), copy(s.group_id, c.group_id), copy(s.sample_step, c.sample_step);
  copy(s.finish_step, c.finish_step), copy(s.dispatch_ns, c.dispatch_ns);
  copy(s.complete_ns, c.complete_ns), copy(s.uses, c.uses), copy(s.group_len, c.group_len);
  copy(s.meta, c.meta);
  s.policy_version.resize(s.sample_step.size());  // derived from sample_step: no column holds it
  for (size_t i = 0; i < s.sample_step.size(); ++i)
    s.policy_version[i] = config_.parameter_sync_step > 0 ? s.sample_step[i] / config_.parameter_sync_step : -1;
  const int64_t now = lease_now();
  for (const auto& [prompt, rec] : in_flight_.sorted_items()) append_in_flight(s, prompt, rec, now);
  export_scalars(s);
  s.attempts = attempts_.export_records();
  return s;
}

void StalenessRing::import_state(const RingState& s) {
  const int64_t n = static_cast<int64_t>(s.traj_id.size());
  const size_t un = s.traj_id.size();
  if (s.group_id.size() != un || s.sample_step.size() != un || s.policy_version.size() != un ||
      s.dispatch_ns.size() != un || s.complete_ns.size() != un || s.uses.size() != un || s.group_len.size() != un ||
      s.meta.size() != un)
    throw InvalidArgument("state_dict: the ready columns have different lengths; pass a state_dict made by state_dict()");
  if (n > config_.capacity)
    throw InvalidArgument(concat("state_dict: ", n, " ready entries exceed capacity=", config_.capacity,
                                 "; load it into a buffer with capacity >= ", n));
  if (!s.finish_step.empty() && s.finish_step.size() != un)
    throw InvalidArgument("state_dict: finish_step and the other ready columns differ in length");
  const std::vector<int64_t>& finish = s.finish_step.empty() ? s.sample_step : s.finish_step;
  for (int64_t i = 0; i < n; ++i)
    if (finish[i] < s.sample_step[i] || finish[i] > s.clock)
      throw InvalidArgument(concat("state_dict: entry ", i, " has finish_step=", finish[i], " outside [sample_step=",
                                   s.sample_step[i], ", clock=", s.clock, "]"));
  if (s.next_take < 0)
    throw InvalidArgument(concat("state_dict: next_take=", s.next_take, " is negative; it was edited or is corrupt"));
  for (int64_t i = 0; i < n;) {
    const int64_t len = s.group_len[i];
    if (len < 1 || i + len > n)
      throw InvalidArgument(concat("state_dict: entry ", i, " has group_len=", len, " that does not fit the ring"));
    for (int64_t j = i; j < i + len; ++j) {
      if (s.group_len[j] != len || s.sample_step[j] != s.sample_step[i] || s.group_id[j] != s.group_id[i] ||
          s.uses[j] != s.uses[i] || meta_cut_index(s.meta[j]) != meta_cut_index(s.meta[i]))
        throw InvalidArgument(concat("state_dict: group at entry ", i, " is not contiguous and uniform"));
      if (config_.age_from == AgeFrom::kFinish && finish[j] != finish[i])
        throw InvalidArgument(concat("state_dict: group at entry ", i, " has finish steps ", finish[i], " and ",
                                     finish[j], ", which age_from='finish' forbids; load it with age_from='start'"));
      if (s.sample_step[j] < 0 || s.sample_step[j] > s.clock)
        throw InvalidArgument(concat("state_dict: entry ", j, " has sample_step=", s.sample_step[j],
                                     " outside [0, clock=", s.clock, "]"));
      if (s.uses[j] < 0 || s.uses[j] >= config_.max_uses)
        throw InvalidArgument(concat("state_dict: entry ", j, " has uses=", s.uses[j], ", not below max_uses=",
                                     config_.max_uses, "; load it into a buffer with a larger max_uses"));
    }
    i += len;
  }
  const size_t m = s.in_flight_prompt.size();
  if (s.in_flight_step.size() != m || s.in_flight_dispatch_ns.size() != m || s.in_flight_lease_left_ns.size() != m ||
      s.in_flight_held_ns.size() != m || s.in_flight_meta.size() != m)
    throw InvalidArgument("state_dict: the in-flight columns have different lengths");
  for (size_t i = 0; i < m; ++i)
    if (s.in_flight_lease_left_ns[i] < -1 || s.in_flight_held_ns[i] < 0)
      throw InvalidArgument(concat("state_dict: in-flight prompt ", s.in_flight_prompt[i], " has lease_left_ns=",
                                   s.in_flight_lease_left_ns[i], " and held_ns=", s.in_flight_held_ns[i],
                                   "; expected -1 (no lease) or >= 0, and >= 0"));
  if (auto dup = first_duplicate(s.in_flight_prompt.data(), static_cast<int64_t>(m)))
    throw InvalidArgument(concat("state_dict: prompt ", *dup, " is in flight twice"));
  for (size_t i = 0; i < m; ++i)
    if (s.in_flight_step[i] < 0 || s.in_flight_step[i] > s.clock)
      throw InvalidArgument(concat("state_dict: in-flight prompt ", s.in_flight_prompt[i], " has step ",
                                   s.in_flight_step[i], " outside [0, clock=", s.clock, "]"));
  auto meta_ok = [](int64_t meta) {
    return meta >= 0 && (meta >> kMetaSlotShift) < (int64_t{1} << 10) && meta_slot(meta) < kSourceSlots;
  };
  for (int64_t i = 0; i < n; ++i)
    if (!meta_ok(s.meta[i]))
      throw InvalidArgument(concat("state_dict: entry ", i, " has meta=", s.meta[i], "; it was edited or is corrupt"));
  for (size_t i = 0; i < m; ++i)
    if (!meta_ok(s.in_flight_meta[i]))
      throw InvalidArgument(concat("state_dict: in-flight prompt ", s.in_flight_prompt[i], " has meta=",
                                   s.in_flight_meta[i], "; it was edited or is corrupt"));
  for (const AttemptRecord& r : s.attempts)
    if (r.attempts < 0 || r.trained < 0 || r.pending < 0 || r.lost_trajs < 0 || r.slot < 0 || r.slot >= kSourceSlots ||
        r.since_trained < 0)
      throw InvalidArgument(concat("state_dict: the attempts record of prompt ", r.prompt_id,
                                   " is out of range; it was edited or is corrupt"));
  std::unordered_set<int64_t> live;
  if (config_.unique_ids) {
    live.reserve(un);
    for (int64_t i = 0; i < n; ++i)
      if (!live.insert(s.traj_id[i]).second)
        throw InvalidArgument(concat("state_dict: trajectory ", s.traj_id[i],
                                     " is ready twice, which unique_ids=True forbids; load it into a buffer without "
                                     "unique_ids"));
  }
  Ledger ledger = s.ledger;
  ledger.in_flight = static_cast<int64_t>(m);
  ledger.buffer_left = n;
  if (!ledger.in_range())
    throw InvalidArgument(concat("state_dict: a ledger counter lies outside [0, ", Ledger::kMaxCounter,
                                 "]; it was edited or is corrupt"));
  if (!ledger.balanced() || s.evicted_unreported < 0 || s.evicted_unreported > ledger.evicted)
    throw InvalidArgument("state_dict: the ledger does not balance with the entries it holds; it was edited or is corrupt");

  MutexLock lock(mutex_);
  check_open();
  const ColumnPointers& c = columns_.get();
  const std::vector<int64_t>& ages = config_.age_from == AgeFrom::kFinish ? finish : s.sample_step;
  bool sorted = true, protect = false, tagged = false;
  for (int64_t i = 0; i < n; ++i) {
    c.traj_id[i] = s.traj_id[i], c.group_id[i] = s.group_id[i], c.sample_step[i] = s.sample_step[i];
    c.finish_step[i] = finish[i], c.dispatch_ns[i] = s.dispatch_ns[i];
    c.complete_ns[i] = s.complete_ns[i], c.uses[i] = s.uses[i], c.group_len[i] = s.group_len[i];
    c.meta[i] = s.meta[i];
    protect |= (s.meta[i] & kMetaProtected) != 0;
    tagged |= meta_slot(s.meta[i]) != 0;
    if (i > 0 && ages[i] < ages[i - 1]) sorted = false;
  }
  head_ = 0;
  size_ = n;
  marks_.all();
  sorted_ = sorted;
  spans_ = false;
  note_spans(0, n);
  next_take_ = s.next_take;
  if (paced()) {
    pace_restore_order();
    pace_count_ready();
  }
  in_flight_.clear();
  const int64_t now = lease_now();
  for (size_t i = 0; i < m; ++i) {
    // A restored lease keeps the time it had left when exported; the time since dispatch likewise.
    const int64_t left = s.in_flight_lease_left_ns[i];
    const int64_t held = std::min(s.in_flight_held_ns[i], now);
    in_flight_.insert(s.in_flight_prompt[i], {s.in_flight_step[i], s.in_flight_dispatch_ns[i], now - held,
                                              left < 0 ? kNoLease : add_saturating(now, left), s.in_flight_meta[i]});
    tagged |= meta_slot(s.in_flight_meta[i]) != 0;
  }
  attempts_.import_records(s.attempts, s.attempt_counters);
  source_counts_ = s.source_counts;
  protected_seen_ = protect;
  expiry_valid_ = false;  // new rows: the next per-entry walk rebuilds the stale-before column
  tagged_ = tagged;
  plain_meta_ = std::all_of(s.meta.begin(), s.meta.end(), [](int64_t m) { return m == kPutMeta; }) && !tagged;
  lone_unused_ = std::all_of(s.uses.begin(), s.uses.end(), [](int32_t u) { return u == 0; }) &&
                 std::all_of(s.group_len.begin(), s.group_len.end(), [](int32_t len) { return len == 1; });
  mirrored_ = true;
  for (int64_t i = 0; i < n && mirrored_; ++i)
    mirrored_ = s.group_id[i] == s.traj_id[i] && finish[i] == s.sample_step[i] && s.complete_ns[i] == s.dispatch_ns[i];
  bool observed = m > 0 || !s.attempts.empty();
  for (int64_t i = 0; i < n && !observed; ++i) observed = meta_observed(s.meta[i]);
  if (!bias_ && observed) bias_ = std::make_unique<BiasMonitor>();
  ledger.released_overflow = ledger_.released_overflow;  // about this object's release log, not the state
  ledger_ = ledger;
  live_ids_.swap(live);
  clock_ = s.clock;
  clock_from_stamp_ = false;  // a state_dict does not say who set its clock
  evicted_unreported_ = s.evicted_unreported;
  ready_cv_.notify_all();
  room_cv_.notify_all();
  admit_cv_.notify_all();
}

std::string StalenessRing::debug_string() const {
  MutexLock lock(mutex_);
  return concat("StalenessBuffer(capacity=", config_.capacity, ", max_age=", max_age_, ", strategy='",
                strategy_name(config_.strategy), "', max_uses=", config_.max_uses, ", on_full='",
                on_full_name(config_.on_full), "'",
                paced() ? concat(", prompts_per_step=", config_.prompts_per_step, ", lookahead=", config_.lookahead) : "",
                config_.age_from == AgeFrom::kFinish ? ", age_from='finish'" : "", ", ready=", size_,
                ", in_flight=", in_flight_.size(),
                protected_waiting_ + unprotected_waiting_ > 0  // pace: calls waiting for admission now
                    ? concat(", admission_waiting=", protected_waiting_ + unprotected_waiting_,
                             ", protected_waiting=", protected_waiting_)
                    : "",
                ", clock=", clock_, ", pinned=", columns_.borrowed() ? "True" : "False",
                closed_ ? ", closed=True" : "", ")");
}

}  // namespace pyfast_buffer
