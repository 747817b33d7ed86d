// StalenessRing: export_delta, what changed since the previous export (the Ray index's append-only journal).
#include "ring_detail.hpp"

#include <algorithm>

namespace pyfast_buffer {

RingDelta StalenessRing::export_delta(bool full) {
  MutexLock lock(mutex_);
  RingDelta d;
  if (full || !marks_.on()) marks_.all();
  RingState& s = d.rows;
  const ColumnPointers& c = columns_.get();
  const int64_t head = head_, cap = config_.capacity, sync = config_.parameter_sync_step;
  // Logical rows [first, last), oldest first, appended to every entry column: each column is one or two
  // contiguous copies (the ring wraps at most once), so a whole export under the lock runs at memcpy speed.
  auto rows = [&s, &c, head, cap, sync](int64_t first, int64_t last) {
    if (last <= first) return;
    const int64_t p = head + first >= cap ? head + first - cap : head + first;
    const int64_t n = last - first, before_wrap = std::min(n, cap - p);
    auto copy = [p, n, before_wrap](auto& out, const auto* col) {
      out.reserve(out.size() + static_cast<size_t>(n));
      out.insert(out.end(), col + p, col + p + before_wrap);
      out.insert(out.end(), col, col + (n - before_wrap));
    };
    copy(s.traj_id, c.traj_id), copy(s.group_id, c.group_id), copy(s.sample_step, c.sample_step);
    copy(s.finish_step, c.finish_step), copy(s.dispatch_ns, c.dispatch_ns), copy(s.complete_ns, c.complete_ns);
    copy(s.uses, c.uses), copy(s.group_len, c.group_len), copy(s.meta, c.meta);
    const size_t at = s.policy_version.size();
    s.policy_version.resize(at + static_cast<size_t>(n), -1);
    if (sync > 0)
      for (size_t i = at; i < s.policy_version.size(); ++i) s.policy_version[i] = s.sample_step[i] / sync;
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
