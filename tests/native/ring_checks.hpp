// Invariants of the core's exported state, shared by the fuzzer and the ThreadSanitizer driver.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

#include "staleness_ring.hpp"

namespace pyfast_buffer_checks {

using pyfast_buffer::Ledger;
using pyfast_buffer::RingConfig;
using pyfast_buffer::RingState;

/// Prints `what` and aborts, so libFuzzer saves the input and a CI run fails.
[[noreturn]] inline void fail_check(const std::string& what) {
  std::fprintf(stderr, "CHECK FAILED: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// Returns true iff every counter of the two ledgers is equal, released_overflow aside (it describes one
/// object's release log, not the state, and import_state keeps the importer's).
inline bool same_ledger(const Ledger& a, const Ledger& b) {
  return a.dispatched == b.dispatched && a.completed == b.completed && a.failed == b.failed &&
         a.put_total == b.put_total && a.taken == b.taken && a.retired == b.retired &&
         a.dropped_stale == b.dropped_stale && a.evicted == b.evicted && a.in_flight == b.in_flight &&
         a.buffer_left == b.buffer_left && a.max_age_changes == b.max_age_changes && a.expired == b.expired &&
         a.admitted == b.admitted && a.admission_refused == b.admission_refused &&
         a.admission_waits == b.admission_waits && a.trained_over_age == b.trained_over_age &&
         a.protected_admitted == b.protected_admitted && a.admitted_ahead == b.admitted_ahead &&
         a.retired_early == b.retired_early;
}

/// Returns true iff every cumulative counter of `after` is >= the one of `before`.
inline bool ledger_grew(const Ledger& before, const Ledger& after) {
  return after.dispatched >= before.dispatched && after.completed >= before.completed &&
         after.failed >= before.failed && after.put_total >= before.put_total && after.taken >= before.taken &&
         after.retired >= before.retired && after.dropped_stale >= before.dropped_stale &&
         after.evicted >= before.evicted && after.max_age_changes >= before.max_age_changes &&
         after.expired >= before.expired && after.admitted >= before.admitted &&
         after.admission_refused >= before.admission_refused && after.admission_waits >= before.admission_waits &&
         after.trained_over_age >= before.trained_over_age &&
         after.protected_admitted >= before.protected_admitted && after.admitted_ahead >= before.admitted_ahead &&
         after.retired_early >= before.retired_early;
}

/// Returns true iff the two states hold the same entries, prompts, ledger and clock; wall-clock
/// stamps (dispatch_ns, complete_ns) are compared only when `with_times` is set, the lease columns
/// (measured on the lease clock at export) only when `with_leases` is set.
inline bool same_state(const RingState& a, const RingState& b, bool with_times, bool with_leases = true) {
  bool same = a.traj_id == b.traj_id && a.group_id == b.group_id && a.sample_step == b.sample_step &&
              a.policy_version == b.policy_version && a.finish_step == b.finish_step && a.uses == b.uses &&
              a.group_len == b.group_len && a.meta == b.meta && a.next_take == b.next_take &&
              a.in_flight_prompt == b.in_flight_prompt && a.in_flight_step == b.in_flight_step &&
              same_ledger(a.ledger, b.ledger) && a.clock == b.clock && a.evicted_unreported == b.evicted_unreported;
  if (with_leases)
    same = same && a.in_flight_lease_left_ns == b.in_flight_lease_left_ns && a.in_flight_held_ns == b.in_flight_held_ns;
  if (with_times)
    same = same && a.dispatch_ns == b.dispatch_ns && a.complete_ns == b.complete_ns &&
           a.in_flight_dispatch_ns == b.in_flight_dispatch_ns;
  return same;
}

/// Returns a short dump of a state for failure messages.
inline std::string describe(const RingState& s) {
  std::ostringstream out;
  out << "clock=" << s.clock << " ready=[";
  for (size_t i = 0; i < s.traj_id.size(); ++i)
    out << (i ? " " : "") << s.traj_id[i] << "/g" << s.group_id[i] << "/s" << s.sample_step[i] << "/u" << s.uses[i]
        << "/l" << s.group_len[i];
  out << "] in_flight=[";
  for (size_t i = 0; i < s.in_flight_prompt.size(); ++i)
    out << (i ? " " : "") << s.in_flight_prompt[i] << "@" << s.in_flight_step[i] << "/lease"
        << s.in_flight_lease_left_ns[i] << "/held" << s.in_flight_held_ns[i];
  const Ledger& l = s.ledger;
  out << "] ledger(dispatched=" << l.dispatched << " completed=" << l.completed << " failed=" << l.failed
      << " put_total=" << l.put_total << " taken=" << l.taken << " retired=" << l.retired
      << " dropped_stale=" << l.dropped_stale << " evicted=" << l.evicted << " in_flight=" << l.in_flight
      << " buffer_left=" << l.buffer_left << " max_age_changes=" << l.max_age_changes << " expired=" << l.expired
      << ") evicted_unreported=" << s.evicted_unreported;
  return out.str();
}

/// Returns `s` as an open ring with a frozen lease clock exports it right after importing it: a closed
/// ring keeps prompts whose lease has passed (lease left 0), an open one fails them, as expired, at once.
inline RingState expired_on_import(RingState s) {
  for (size_t i = s.in_flight_prompt.size(); i-- > 0;) {
    if (s.in_flight_lease_left_ns[i] != 0) continue;
    for (auto* c : {&s.in_flight_prompt, &s.in_flight_step, &s.in_flight_dispatch_ns, &s.in_flight_lease_left_ns,
                    &s.in_flight_held_ns})
      c->erase(c->begin() + static_cast<std::ptrdiff_t>(i));
    ++s.ledger.failed, ++s.ledger.expired, --s.ledger.in_flight;
  }
  return s;
}

/// Returns "" when `s` is a state a ring of `config` may hold, else what is wrong: the ledger's two
/// identities, its cached sizes, groups contiguous and uniform with group_len equal to their run
/// (policy_version is not checked: a checkpoint may come from a buffer with another parameter_sync_step),
/// uses below max_uses, stamps within [0, clock], in-flight prompts sorted and unique, lease columns
/// (-1 or time left, time held >= 0) in range, expired within [0, failed].
inline std::string structure_error(const RingState& s, const RingConfig& config) {
  const size_t n = s.traj_id.size();
  if (s.group_id.size() != n || s.sample_step.size() != n || s.policy_version.size() != n ||
      s.dispatch_ns.size() != n || s.complete_ns.size() != n || s.uses.size() != n || s.group_len.size() != n)
    return "ready columns differ in length";
  if (static_cast<int64_t>(n) > config.capacity) return "more ready entries than capacity";
  if (!s.ledger.balanced()) return "ledger does not balance";
  if (s.ledger.buffer_left != static_cast<int64_t>(n)) return "ledger.buffer_left differs from the ready count";
  if (s.ledger.in_flight != static_cast<int64_t>(s.in_flight_prompt.size()))
    return "ledger.in_flight differs from the in-flight table";
  if (s.evicted_unreported < 0 || s.evicted_unreported > s.ledger.evicted) return "evicted_unreported out of range";
  for (size_t i = 0; i < n;) {
    const int64_t len = s.group_len[i];
    if (len < 1 || i + static_cast<size_t>(len) > n) return "group_len does not fit at entry " + std::to_string(i);
    for (size_t j = i; j < i + static_cast<size_t>(len); ++j) {
      if (s.group_len[j] != len || s.group_id[j] != s.group_id[i] || s.sample_step[j] != s.sample_step[i] ||
          s.uses[j] != s.uses[i])
        return "group at entry " + std::to_string(i) + " is not uniform";
      if (s.uses[j] < 0 || s.uses[j] >= config.max_uses) return "uses out of range at " + std::to_string(j);
      if (s.sample_step[j] < 0 || s.sample_step[j] > s.clock) return "sample_step outside [0, clock]";
    }
    i += static_cast<size_t>(len);
  }
  const size_t m = s.in_flight_prompt.size();
  if (s.in_flight_step.size() != m || s.in_flight_dispatch_ns.size() != m || s.in_flight_lease_left_ns.size() != m ||
      s.in_flight_held_ns.size() != m)
    return "in-flight columns differ";
  if (s.ledger.expired < 0 || s.ledger.expired > s.ledger.failed) return "ledger.expired not within [0, failed]";
  for (size_t i = 0; i < m; ++i) {
    if (s.in_flight_lease_left_ns[i] < -1 || s.in_flight_held_ns[i] < 0) return "lease columns out of range";
    if (i > 0 && s.in_flight_prompt[i] <= s.in_flight_prompt[i - 1]) return "in-flight prompts not sorted/unique";
    if (s.in_flight_step[i] < 0 || s.in_flight_step[i] > s.clock) return "in-flight step outside [0, clock]";
  }
  return "";
}

}  // namespace pyfast_buffer_checks
