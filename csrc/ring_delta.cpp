// StalenessRing: export_delta, what changed since the previous export (the Ray index's append-only journal).
#include "ring_detail.hpp"

namespace pyfast_buffer {

RingDelta StalenessRing::export_delta(bool full) {
  MutexLock lock(mutex_);
  RingDelta d;
  if (full || !marks_.on()) marks_.all();
  RingState& s = d.rows;
  const ColumnPointers& c = columns_.get();
  const int64_t head = head_, cap = config_.capacity, sync = config_.parameter_sync_step;
  // Logical rows [first, last), oldest first, appended to every entry column.
  auto rows = [&s, &c, head, cap, sync](int64_t first, int64_t last) {
    const size_t at = s.traj_id.size(), n = static_cast<size_t>(last - first);
    for (auto* col : {&s.traj_id, &s.group_id, &s.sample_step, &s.finish_step, &s.dispatch_ns, &s.complete_ns,
                      &s.meta, &s.policy_version})
      col->resize(at + n);
    s.uses.resize(at + n), s.group_len.resize(at + n);
    int64_t p = head + first >= cap ? head + first - cap : head + first;
    for (size_t i = at; i < at + n; ++i, p = p + 1 == cap ? 0 : p + 1) {
      s.traj_id[i] = c.traj_id[p], s.group_id[i] = c.group_id[p], s.sample_step[i] = c.sample_step[p];
      s.finish_step[i] = c.finish_step[p], s.dispatch_ns[i] = c.dispatch_ns[p], s.complete_ns[i] = c.complete_ns[p];
      s.uses[i] = c.uses[p], s.group_len[i] = c.group_len[p], s.meta[i] = c.meta[p];
      s.policy_version[i] = sync > 0 ? c.sample_step[p] / sync : -1;
    }
  };
  // The changed rows in ring order: each run's, then the tail after the last run.
  const RingChangeMarks::Run* runs = marks_.runs();
  int64_t at = 0;
  for (int64_t k = 0; k < marks_.run_count(); ++k) {
    const RingChangeMarks::Run& r = runs[k];
    rows(at, at + r.changed);
    d.runs.insert(d.runs.end(), {r.changed, r.from, r.len});
    at += r.changed + r.len;
  }
  rows(at, size_);
  const int64_t now = lease_now();
  d.now_ns = now;
  ChangedIds& changed = in_flight_.changes();
  if (full || !changed.on() || changed.all()) {
    d.in_flight_all = true;
    for (const auto& [prompt, rec] : in_flight_.sorted_items()) append_in_flight(s, prompt, rec, now);
    changed.start();
  } else {
    for (int64_t prompt : changed.ids()) {
      if (in_flight_.contains(prompt))
        append_in_flight(s, prompt, in_flight_.at(prompt), now);
      else
        d.in_flight_gone.push_back(prompt);
    }
    changed.clear();
  }
  if (full) attempts_.mark_all();
  PromptAttempts::Changes att = attempts_.take_changes();
  d.attempts_all = att.all;
  d.attempts_moved = static_cast<int64_t>(att.moved.size());
  s.attempts = std::move(att.moved);
  s.attempts.insert(s.attempts.end(), att.updated.begin(), att.updated.end());
  d.attempts_gone = std::move(att.gone);
  export_scalars(s);
  marks_.reset(size_);
  return d;
}

}  // namespace pyfast_buffer
