// The one pybind11 file: argument marshalling, GIL release, exception mapping.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "staleness_ring.hpp"

namespace py = pybind11;
namespace pfb = pyfast_buffer;

namespace {

using I64Array = py::array_t<int64_t, py::array::c_style>;
using I32Array = py::array_t<int32_t, py::array::c_style>;

// An owned copy of an optional int32 array (source slots), empty when absent.
std::vector<int32_t> owned32(const std::optional<I32Array>& a) {
  return a ? std::vector<int32_t>(a->data(), a->data() + a->size()) : std::vector<int32_t>();
}

pfb::Strategy parse_strategy(const std::string& s) {
  if (s == "drop") return pfb::Strategy::kDrop;
  if (s == "wait") return pfb::Strategy::kWait;
  if (s == "pace") return pfb::Strategy::kPace;
  throw pfb::InvalidArgument("strategy='" + s + "' is unknown; use 'drop', 'wait' or 'pace'");
}

pfb::AgeFrom parse_age_from(const std::string& s) {
  if (s == "start") return pfb::AgeFrom::kStart;
  if (s == "finish") return pfb::AgeFrom::kFinish;
  throw pfb::InvalidArgument("age_from='" + s + "' is unknown; use 'start' or 'finish'");
}

pfb::OnFull parse_on_full(const std::string& s) {
  if (s == "evict_oldest") return pfb::OnFull::kEvictOldest;
  if (s == "block") return pfb::OnFull::kBlock;
  if (s == "error") return pfb::OnFull::kError;
  throw pfb::InvalidArgument("on_full='" + s + "' is unknown; use 'evict_oldest', 'block' or 'error'");
}

// Returns an owned copy of a caller's id array, taken while the GIL is held: the core reads only this copy,
// so a caller (or another thread) rewriting the array during the call cannot make the call read it twice.
std::vector<int64_t> owned(const I64Array& ids) { return std::vector<int64_t>(ids.data(), ids.data() + ids.size()); }

// An interned attribute name, made once (under the GIL) and kept for the life of the process.
PyObject* interned(const char* name) { return PyUnicode_InternFromString(name); }

// `object.name` and `object.name()` through CPython's own fast paths: pybind11's generic call packs an argument
// tuple each time, which costs more than put_tensor's copy of 512 ids.
py::object attribute(const py::handle& object, PyObject* name) {
  PyObject* value = PyObject_GetAttr(object.ptr(), name);
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}
py::object method(const py::handle& object, PyObject* name) {
  PyObject* value = PyObject_CallMethodNoArgs(object.ptr(), name);
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}

// Runs Python's signal handlers for a core call blocked with the GIL released; a handler that raises
// (KeyboardInterrupt) aborts the call, which has changed nothing yet.
void check_signals() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// The Python-visible ring: the core plus the arrays whose memory it borrows.
struct PyRing {
  std::vector<py::object> borrowed_arrays;  // destroyed after `ring`, which points into them
  std::unique_ptr<pfb::StalenessRing> ring;
};

const char* blocked_by_name(pfb::BlockedBy b) {
  switch (b) {
    case pfb::BlockedBy::kTooFewReady: return "too_few_ready";
    case pfb::BlockedBy::kInFlightAtMaxAge: return "in_flight_at_max_age";
    default: return "none";
  }
}

// Returns an exact Python int of a 128-bit value (age sums may pass 2**63).
py::int_ to_pyint(pfb::Int128 v) {
  if (v >= INT64_MIN && v <= INT64_MAX) return py::int_(static_cast<int64_t>(v));
  const bool negative = v < 0;
  const pfb::Int128 magnitude = negative ? -v : v;  // |v| < 2**127: ages sums are far below
  py::object high = py::int_(static_cast<uint64_t>(magnitude >> 64));
  py::object out = high.attr("__lshift__")(64).attr("__or__")(py::int_(static_cast<uint64_t>(magnitude)));
  return py::int_(negative ? out.attr("__neg__")() : out);
}

py::tuple attempts_tuple(const std::array<int64_t, 6>& a) { return py::make_tuple(a[0], a[1], a[2], a[3], a[4], a[5]); }

py::tuple stats_tuple(const pfb::TakeStats& s) {
  py::tuple hist(pfb::kAgeBuckets);
  for (int i = 0; i < pfb::kAgeBuckets; ++i) hist[i] = py::int_(s.age_hist[i]);
  py::tuple sources(s.sources.size());
  for (size_t i = 0; i < s.sources.size(); ++i)
    sources[i] = py::make_tuple(s.sources[i][0] - 1, s.sources[i][1], s.sources[i][2]);  // (source, taken, dropped)
  return py::make_tuple(s.taken, s.dropped_stale, s.retired, s.evicted, blocked_by_name(s.blocked_by),
                        to_pyint(s.age_sum), s.age_max, hist, s.buffer_left, s.in_flight, s.sampled_total, s.max_age,
                        s.expired, s.trained_over_age, to_pyint(s.span_sum), s.span_max, s.admitted,
                        s.admission_refused, s.admission_waits, attempts_tuple(s.attempts), sources,
                        s.protected_admitted, s.admitted_ahead, s.retired_early);
}

// The starved gauge of every tagged source that has any starved prompt: {source: count}.
py::dict starved_by_source(const pfb::AttemptCounters& a) {
  py::dict d;
  for (int slot = 1; slot < pfb::kSourceSlots; ++slot)
    if (a.starved_by_slot[slot]) d[py::int_(slot - 1)] = a.starved_by_slot[slot];
  return d;
}

// Cumulative counts per source slot as an int64 array of shape (kSourceSlots, 6), slot 0 (untagged) first.
py::array_t<int64_t> source_counts_array(const std::array<pfb::SourceCounts, pfb::kSourceSlots>& counts) {
  py::array_t<int64_t> out({static_cast<py::ssize_t>(pfb::kSourceSlots), py::ssize_t{6}});
  auto v = out.mutable_unchecked<2>();
  for (int slot = 0; slot < pfb::kSourceSlots; ++slot) {
    const pfb::SourceCounts& c = counts[slot];
    const int64_t row[6] = {c.dispatched, c.generated, c.taken, c.trained, c.dropped, c.evicted};
    for (int k = 0; k < 6; ++k) v(slot, k) = row[k];
  }
  return out;
}

// The bias monitor as numpy arrays: counts (1 + kWindowParts, kBiasSketches, kSketchBuckets) with the
// cumulative sketches first, n and sum (1 + kWindowParts, kBiasSketches), and the window position.
py::object bias_arrays(const pfb::BiasMonitor* b) {
  if (!b) return py::none();
  constexpr int parts = 1 + pfb::kWindowParts;
  py::array_t<int64_t> counts({py::ssize_t{parts}, py::ssize_t{pfb::kBiasSketches}, py::ssize_t{pfb::kSketchBuckets}});
  py::array_t<int64_t> n({py::ssize_t{parts}, py::ssize_t{pfb::kBiasSketches}});
  py::array_t<double> sum({py::ssize_t{parts}, py::ssize_t{pfb::kBiasSketches}});
  auto c = counts.mutable_unchecked<3>();
  auto nv = n.mutable_unchecked<2>();
  auto sv = sum.mutable_unchecked<2>();
  for (int part = 0; part < parts; ++part)
    for (int k = 0; k < pfb::kBiasSketches; ++k) {
      const pfb::Sketch& sk = part == 0 ? b->total[k] : b->window[part - 1][k];
      for (int i = 0; i < pfb::kSketchBuckets; ++i) c(part, k, i) = sk.counts[i];
      nv(part, k) = sk.n, sv(part, k) = sk.sum;
    }
  return py::make_tuple(counts, n, sum, b->current, b->takes_in_current, b->rotations);
}

py::dict ledger_dict(const pfb::Ledger& l) {
  py::dict d;
  d["dispatched"] = l.dispatched, d["completed"] = l.completed, d["failed"] = l.failed;
  d["put_total"] = l.put_total, d["sampled_total"] = l.put_total, d["taken"] = l.taken;
  d["retired"] = l.retired, d["dropped_stale"] = l.dropped_stale, d["evicted"] = l.evicted;
  d["in_flight"] = l.in_flight, d["buffer_left"] = l.buffer_left;
  d["max_age_changes"] = l.max_age_changes, d["expired"] = l.expired;
  d["released_overflow"] = l.released_overflow;
  d["admitted"] = l.admitted, d["admission_refused"] = l.admission_refused;
  d["admission_waits"] = l.admission_waits, d["trained_over_age"] = l.trained_over_age;
  d["protected_admitted"] = l.protected_admitted, d["admitted_ahead"] = l.admitted_ahead;
  d["retired_early"] = l.retired_early;
  return d;
}

// Returns d[key] as int64, or `fallback` when a state_dict written before the key existed lacks it.
int64_t optional_int(const py::dict& d, const char* key, int64_t fallback) {
  return d.contains(key) ? d[key].cast<int64_t>() : fallback;
}

template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(static_cast<py::ssize_t>(heap->size()), heap->data(), owner);
}

template <class T>
std::vector<T> from_numpy(const py::dict& d, const char* key,
                          std::optional<std::pair<size_t, T>> fallback = std::nullopt) {
  if (fallback && !d.contains(key)) return std::vector<T>(fallback->first, fallback->second);
  auto a = py::array_t<T, py::array::c_style | py::array::forcecast>::ensure(d[key]);
  if (!a || a.ndim() != 1) throw pfb::InvalidArgument(std::string("state_dict: '") + key + "' must be a 1-d integer array");
  return std::vector<T>(a.data(), a.data() + a.size());
}

std::unique_ptr<PyRing> make_ring(int64_t capacity, int64_t max_age, const std::string& strategy, int64_t max_uses,
                                  const std::string& on_full, int64_t parameter_sync_step,
                                  std::optional<py::tuple> columns, bool track_released, int64_t release_bound,
                                  bool unique_ids, int64_t prompts_per_step, int64_t lookahead,
                                  const std::string& age_from, int64_t max_attempts, int64_t attempts_bound) {
  pfb::RingConfig cfg{capacity,       max_age,       parse_strategy(strategy), max_uses,
                      parse_on_full(on_full), parameter_sync_step, track_released, release_bound,
                      unique_ids,     prompts_per_step, lookahead, parse_age_from(age_from), max_attempts,
                      attempts_bound};
  auto out = std::make_unique<PyRing>();
  if (!columns) {
    out->ring = std::make_unique<pfb::StalenessRing>(cfg, nullptr);
    out->ring->set_interrupt_check(check_signals);
    return out;
  }
  if (columns->size() != 9) throw pfb::InvalidArgument("columns: pass 7 int64 and 2 int32 arrays");
  pfb::ColumnPointers ptrs;
  int64_t* wide[7];
  for (int i = 0; i < 7; ++i) {
    auto a = py::cast<I64Array>((*columns)[i]);
    // The core writes through these pointers: a converted copy would silently leave the caller's memory unused.
    if (!a.is((*columns)[i]) || a.size() < capacity)
      throw pfb::InvalidArgument("columns: pass contiguous int64 arrays of capacity entries");
    wide[i] = a.mutable_data();
    out->borrowed_arrays.push_back(a);
  }
  int32_t* narrow[2];
  for (int i = 0; i < 2; ++i) {
    auto a = py::cast<I32Array>((*columns)[7 + i]);
    if (!a.is((*columns)[7 + i]) || a.size() < capacity)
      throw pfb::InvalidArgument("columns: pass contiguous int32 arrays of capacity entries");
    narrow[i] = a.mutable_data();
    out->borrowed_arrays.push_back(a);
  }
  ptrs.traj_id = wide[0], ptrs.group_id = wide[1], ptrs.sample_step = wide[2];
  ptrs.finish_step = wide[3], ptrs.dispatch_ns = wide[4], ptrs.complete_ns = wide[5], ptrs.meta = wide[6];
  ptrs.uses = narrow[0], ptrs.group_len = narrow[1];
  out->ring = std::make_unique<pfb::StalenessRing>(cfg, &ptrs);
  out->ring->set_interrupt_check(check_signals);
  return out;
}

// The dict of a RingState (export_state, export_delta): numpy columns, the ledger, the scalars.
py::dict state_dict_of(pfb::RingState&& s) {
  py::dict d;
  d["traj_id"] = to_numpy(std::move(s.traj_id)), d["group_id"] = to_numpy(std::move(s.group_id));
  d["sample_step"] = to_numpy(std::move(s.sample_step));
  d["policy_version"] = to_numpy(std::move(s.policy_version));
  d["dispatch_ns"] = to_numpy(std::move(s.dispatch_ns));
  d["complete_ns"] = to_numpy(std::move(s.complete_ns));
  d["uses"] = to_numpy(std::move(s.uses)), d["group_len"] = to_numpy(std::move(s.group_len));
  d["finish_step"] = to_numpy(std::move(s.finish_step));
  d["next_take"] = s.next_take;
  d["meta"] = to_numpy(std::move(s.meta));
  d["in_flight_meta"] = to_numpy(std::move(s.in_flight_meta));
  std::vector<int64_t> ids, attempts, trained, pending, slot, lost, flags, since;
  for (const pfb::AttemptRecord& r : s.attempts) {
    ids.push_back(r.prompt_id), attempts.push_back(r.attempts), trained.push_back(r.trained);
    pending.push_back(r.pending), slot.push_back(r.slot), lost.push_back(r.lost_trajs);
    flags.push_back(int64_t{r.last_lost} | int64_t{r.retried} << 1), since.push_back(r.since_trained);
  }
  py::dict att;
  att["prompt_id"] = to_numpy(std::move(ids)), att["attempts"] = to_numpy(std::move(attempts));
  att["trained"] = to_numpy(std::move(trained)), att["pending"] = to_numpy(std::move(pending));
  att["slot"] = to_numpy(std::move(slot)), att["lost_trajs"] = to_numpy(std::move(lost));
  att["flags"] = to_numpy(std::move(flags)), att["since_trained"] = to_numpy(std::move(since));
  d["attempts"] = att;
  const pfb::AttemptCounters& a = s.attempt_counters;
  py::dict counters;
  counters["retries"] = a.retries, counters["prompts_retried"] = a.prompts_retried;
  counters["regenerations"] = a.regenerations, counters["protected"] = a.protected_groups;
  counters["forgotten"] = a.forgotten;
  d["attempt_counters"] = counters;
  d["source_counts"] = source_counts_array(s.source_counts);
  d["in_flight_prompt"] = to_numpy(std::move(s.in_flight_prompt));
  d["in_flight_step"] = to_numpy(std::move(s.in_flight_step));
  d["in_flight_dispatch_ns"] = to_numpy(std::move(s.in_flight_dispatch_ns));
  d["in_flight_lease_left_ns"] = to_numpy(std::move(s.in_flight_lease_left_ns));
  d["in_flight_held_ns"] = to_numpy(std::move(s.in_flight_held_ns));
  d["ledger"] = ledger_dict(s.ledger);
  d["clock"] = s.clock;
  d["evicted_unreported"] = s.evicted_unreported;
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Native core of pyfast_buffer: a staleness-aware ring of trajectory ids.";
  py::register_exception<pfb::Closed>(m, "BufferClosedError", PyExc_ValueError);
  auto full = py::register_exception<pfb::Full>(m, "BufferFullError", PyExc_RuntimeError);
  // Registered after its base, so that its translator runs first.
  py::register_exception<pfb::AdmissionFull>(m, "AdmissionError", full.ptr());
  // A probe's "would wait" (kProbeTimeout): a TimeoutError, so nothing that expects one is surprised; the
  // awaitable API (aio.py) catches it and awaits a wake-up. Translated below, before its base Timeout.
  static py::exception<pfb::WouldBlock> would_block(m, "WouldBlock", PyExc_TimeoutError);
  m.attr("PROBE_TIMEOUT") = pfb::kProbeTimeout;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const pfb::WouldBlock& e) {
      py::set_error(would_block, e.what());
    } catch (const pfb::Timeout& e) {
      py::set_error(PyExc_TimeoutError, e.what());
    } catch (const pfb::OutOfMemory& e) {
      py::set_error(PyExc_MemoryError, e.what());
    }
  });
  m.attr("AGE_BUCKETS") = pfb::kAgeBuckets;
  m.attr("BYTES_PER_ENTRY") = pfb::kBytesPerEntry;
  m.attr("BATCH_COLUMNS") = pfb::kBatchColumns;

  py::class_<PyRing>(m, "Ring")
      .def(py::init(&make_ring), py::arg("capacity"), py::arg("max_age"), py::arg("strategy"), py::arg("max_uses"),
           py::arg("on_full"), py::arg("parameter_sync_step"), py::arg("columns") = py::none(),
           py::arg("track_released") = false, py::arg("release_bound") = 0, py::arg("unique_ids") = false,
           py::arg("prompts_per_step") = 0, py::arg("lookahead") = 0, py::arg("age_from") = "start",
           py::arg("max_attempts") = 0, py::arg("attempts_bound") = 0)
      .def("released",
           [](PyRing& self) {
             pfb::Released r = self.ring->take_released();
             return py::make_tuple(to_numpy(std::move(r.ids)), to_numpy(std::move(r.reasons)));
           })
      .def(
          "dispatch",
          [](PyRing& self, const I64Array& prompt_ids, int64_t step, std::optional<double> lease,
             std::optional<double> timeout, std::optional<I32Array> slots) {
            const std::vector<int64_t> ids = owned(prompt_ids);
            const std::vector<int32_t> sl = owned32(slots);
            py::gil_scoped_release release;  // a paced dispatch may block: never while holding the GIL
            self.ring->dispatch(ids.data(), static_cast<int64_t>(ids.size()), step, lease, timeout,
                                slots ? sl.data() : nullptr, static_cast<int64_t>(sl.size()));
          },
          py::arg("prompt_ids"), py::arg("step"), py::arg("lease") = py::none(), py::arg("timeout") = py::none(),
          py::arg("slots") = py::none())
      .def("admissible",
           [](PyRing& self, int64_t step) {
             py::gil_scoped_release release;
             return self.ring->admissible(step);
           })
      .def("renew",
           [](PyRing& self, const I64Array& prompt_ids, double lease) {
             const std::vector<int64_t> ids = owned(prompt_ids);
             py::gil_scoped_release release;
             self.ring->renew(ids.data(), static_cast<int64_t>(ids.size()), lease);
           })
      .def("restamp_in_flight",
           [](PyRing& self, int64_t step) {
             py::gil_scoped_release release;
             return self.ring->restamp_in_flight(step);
           })
      .def("expire_in_flight",
           [](PyRing& self, double older_than_s) {
             py::gil_scoped_release release;
             return self.ring->expire_in_flight(older_than_s);
           })
      .def("_set_lease_clock", [](PyRing& self, std::optional<int64_t> now_ns) { self.ring->set_lease_clock(now_ns); })
      .def("complete",
           [](PyRing& self, const I64Array& traj_ids, const I64Array& prompt_ids, std::optional<double> timeout,
              std::optional<I64Array> finish_steps, std::optional<I64Array> lengths) {
             if (traj_ids.size() != prompt_ids.size() || (lengths && lengths->size() != traj_ids.size()))
               throw pfb::InvalidArgument("traj_ids, prompt_ids and lengths differ in length");
             const std::vector<int64_t> t = owned(traj_ids), p = owned(prompt_ids);
             const std::vector<int64_t> f = finish_steps ? owned(*finish_steps) : std::vector<int64_t>();
             const std::vector<int64_t> l = lengths ? owned(*lengths) : std::vector<int64_t>();
             py::gil_scoped_release release;
             self.ring->complete(t.data(), p.data(), static_cast<int64_t>(t.size()), timeout, f.data(),
                                 static_cast<int64_t>(f.size()), lengths ? l.data() : nullptr);
           },
           py::arg("traj_ids"), py::arg("prompt_ids"), py::arg("timeout") = py::none(),
           py::arg("finish_steps") = py::none(), py::arg("lengths") = py::none())
      .def("fail",
           [](PyRing& self, const I64Array& prompt_ids) {
             const std::vector<int64_t> ids = owned(prompt_ids);
             py::gil_scoped_release release;
             self.ring->fail(ids.data(), static_cast<int64_t>(ids.size()));
           })
      .def("put",
           [](PyRing& self, const I64Array& traj_ids, std::optional<I64Array> group_ids, const I64Array& sample_steps,
              std::optional<double> timeout, std::optional<I64Array> finish_steps,
              std::optional<I32Array> slots) {
             if (group_ids && group_ids->size() != traj_ids.size())
               throw pfb::InvalidArgument("traj_ids and group_ids differ in length");
             const std::vector<int64_t> t = owned(traj_ids), s = owned(sample_steps);
             const std::vector<int64_t> g = group_ids ? owned(*group_ids) : std::vector<int64_t>();
             const std::vector<int64_t> f = finish_steps ? owned(*finish_steps) : std::vector<int64_t>();
             const std::vector<int32_t> sl = owned32(slots);
             const int64_t n = static_cast<int64_t>(t.size()), n_steps = static_cast<int64_t>(s.size());
             py::gil_scoped_release release;
             self.ring->put(t.data(), group_ids ? g.data() : nullptr, s.data(), n_steps, n, timeout, f.data(),
                            static_cast<int64_t>(f.size()), slots ? sl.data() : nullptr, static_cast<int64_t>(sl.size()));
           },
           py::arg("traj_ids"), py::arg("group_ids"), py::arg("sample_steps"), py::arg("timeout") = py::none(),
           py::arg("finish_steps") = py::none(), py::arg("slots") = py::none())
      // put's common call (ungrouped ids, one stamp): no per-call steps array, no optional arguments to convert.
      .def("put_one_stamp",
           [](PyRing& self, const I64Array& traj_ids, int64_t sample_step, std::optional<double> timeout) {
             const std::vector<int64_t> t = owned(traj_ids);
             py::gil_scoped_release release;
             self.ring->put(t.data(), nullptr, &sample_step, 1, static_cast<int64_t>(t.size()), timeout);
           })
      // The same from a torch tensor, read through its data pointer: a tensor has no buffer protocol, and making a
      // numpy view of it per call costs more than the put. The checks, the address and the copy run with the GIL
      // held and no Python code between them, so no other thread can resize the tensor between reading its address
      // and copying from it. Returns false, having done nothing, for anything but a 1-d contiguous CPU int64 tensor
      // whose memory holds its values (not a negative view).
      .def("put_tensor",
           [](PyRing& self, const py::object& traj_ids, const py::object& int64_dtype, int64_t sample_step,
              std::optional<double> timeout) {
             static PyObject* const dtype = interned("dtype");
             static PyObject* const is_cpu = interned("is_cpu");
             static PyObject* const ndim = interned("ndim");
             static PyObject* const is_contiguous = interned("is_contiguous");
             static PyObject* const numel = interned("numel");
             static PyObject* const data_ptr = interned("data_ptr");
             static PyObject* const is_neg = interned("is_neg");
             // A negative view (torch._neg_view) keeps the un-negated values in memory with a bit saying "negate
             // on read": its memory is not its values, so it takes the general route (which refuses it by name).
             if (!attribute(traj_ids, dtype).is(int64_dtype) || attribute(traj_ids, is_cpu).ptr() != Py_True ||
                 attribute(traj_ids, ndim).cast<int64_t>() != 1 ||
                 method(traj_ids, is_contiguous).ptr() != Py_True || method(traj_ids, is_neg).ptr() != Py_False)
               return false;
             const int64_t n = method(traj_ids, numel).cast<int64_t>();
             const auto address = method(traj_ids, data_ptr).cast<std::uintptr_t>();
             if (n > 0 && address == 0) return false;  // storage freed under the tensor (resized to 0)
             const int64_t* first = reinterpret_cast<const int64_t*>(address);
             const std::vector<int64_t> t(first, first + n);
             py::gil_scoped_release release;
             self.ring->put(t.data(), nullptr, &sample_step, 1, n, timeout);
             return true;
           })
      .def("take",
           [](PyRing& self, I64Array& out, int64_t batch_size, int64_t current_step, std::optional<double> timeout,
              bool bounded) {
             // A batch never exceeds the capacity, so out needs room for min(batch_size, capacity) rows.
             const int64_t rows = std::min(batch_size, self.ring->config().capacity);
             if (out.ndim() != 1 || out.size() < pfb::kBatchColumns * rows)
               throw pfb::InvalidArgument("out must be a 1-d int64 array of BATCH_COLUMNS * min(batch_size, capacity)");
             int64_t* cols = out.mutable_data();
             pfb::TakeStats stats;
             {
               py::gil_scoped_release release;
               stats = self.ring->take(batch_size, current_step, timeout, cols, bounded);
             }
             return stats_tuple(stats);
           },
           py::arg("out"), py::arg("batch_size"), py::arg("current_step"), py::arg("timeout"),
           py::arg("bounded") = true, py::pos_only())
      .def("evict_stale",
           [](PyRing& self, int64_t current_step) {
             pfb::TakeStats stats;
             {
               py::gil_scoped_release release;
               stats = self.ring->evict_stale(current_step);
             }
             return stats_tuple(stats);
           })
      .def("evict_oldest",
           [](PyRing& self, int64_t groups) {
             py::gil_scoped_release release;
             return self.ring->evict_oldest(groups);
           })
      .def("ledger", [](PyRing& self) { return ledger_dict(self.ring->ledger()); })
      .def("set_source_max_age",
           [](PyRing& self, int64_t source, int64_t max_age) {
             if (source < 0 || source > pfb::kMaxSource)
               throw pfb::InvalidArgument("source_max_age: source " + std::to_string(source) +
                                          " is out of range; use sources in [0, 63]");
             self.ring->set_source_max_age(static_cast<int32_t>(source + 1), max_age);
           })
      .def("source_max_ages",
           [](const PyRing& self) {
             py::dict d;
             const auto ages = self.ring->source_max_ages();
             for (int slot = 1; slot < pfb::kSourceSlots; ++slot)
               if (ages[slot] >= 0) d[py::int_(slot - 1)] = ages[slot];
             return d;
           })
      .def("starved",
           [](const PyRing& self, int64_t min_attempts) {
             py::dict d;
             for (const auto& [id, attempts] : self.ring->starved(min_attempts)) d[py::int_(id)] = attempts;
             return d;
           })
      .def("attempts",
           [](const PyRing& self) {
             const pfb::AttemptCounters a = self.ring->attempt_counters();
             const std::array<int64_t, 6> totals = {a.retries,          a.prompts_retried, a.regenerations,
                                                    a.protected_groups, a.starved,         a.forgotten};
             return py::make_tuple(attempts_tuple(totals), starved_by_source(a));
           })
      .def("source_counts", [](const PyRing& self) { return source_counts_array(self.ring->source_counts()); })
      .def("bias",
           [](const PyRing& self) {
             std::unique_ptr<pfb::BiasMonitor> b = self.ring->bias();
             return bias_arrays(b.get());
           })
      .def("__len__", [](const PyRing& self) { return self.ring->size(); })
      .def_property(
          "max_age", [](const PyRing& self) { return self.ring->max_age(); },
          [](PyRing& self, int64_t max_age) { self.ring->set_max_age(max_age); })
      .def_property_readonly("in_flight", [](PyRing& self) { return self.ring->in_flight(); })
      .def_property_readonly("closed", [](const PyRing& self) { return self.ring->closed(); })
      .def_property_readonly("borrows_columns", [](const PyRing& self) { return self.ring->borrows_columns(); })
      .def("close", [](PyRing& self) { self.ring->close(); })
      .def("set_wake_fd", [](PyRing& self, int fd) { self.ring->set_wake_fd(fd); }, py::arg("fd"))
      .def("arm_wake", [](PyRing& self) { self.ring->arm_wake(); })
      .def("next_lease_deadline_ns", [](PyRing& self) { return self.ring->next_lease_deadline_ns(); })
      .def(
          "begin_admission_wait",
          [](PyRing& self, const I64Array& prompt_ids) {
            const std::vector<int64_t> ids = owned(prompt_ids);
            return self.ring->begin_admission_wait(ids.data(), static_cast<int64_t>(ids.size()));
          },
          py::arg("prompt_ids"))
      .def(
          "end_admission_wait", [](PyRing& self, bool protected_call) { self.ring->end_admission_wait(protected_call); },
          py::arg("protected_call"))
      .def("__repr__", [](const PyRing& self) { return self.ring->debug_string(); })
      .def("export_state", [](PyRing& self) { return state_dict_of(self.ring->export_state()); })
      .def("export_delta",
           [](PyRing& self, bool full) {
             pfb::RingDelta delta = self.ring->export_delta(full);
             py::dict d = state_dict_of(std::move(delta.rows));
             d["runs"] = to_numpy(std::move(delta.runs));
             d["in_flight_all"] = delta.in_flight_all, d["in_flight_gone"] = to_numpy(std::move(delta.in_flight_gone));
             d["attempts_all"] = delta.attempts_all, d["attempts_moved"] = delta.attempts_moved;
             d["attempts_gone"] = to_numpy(std::move(delta.attempts_gone));
             d["now_ns"] = delta.now_ns;
             return d;
           },
           py::arg("full"))
      .def("import_state", [](PyRing& self, const py::dict& d) {
        pfb::RingState s;
        s.traj_id = from_numpy<int64_t>(d, "traj_id"), s.group_id = from_numpy<int64_t>(d, "group_id");
        s.sample_step = from_numpy<int64_t>(d, "sample_step");
        s.policy_version = from_numpy<int64_t>(d, "policy_version");
        s.dispatch_ns = from_numpy<int64_t>(d, "dispatch_ns"), s.complete_ns = from_numpy<int64_t>(d, "complete_ns");
        s.uses = from_numpy<int32_t>(d, "uses"), s.group_len = from_numpy<int32_t>(d, "group_len");
        if (d.contains("finish_step")) s.finish_step = from_numpy<int64_t>(d, "finish_step");  // else: sample_step
        s.next_take = optional_int(d, "next_take", 0);
        s.meta = from_numpy<int64_t>(d, "meta", std::make_pair(s.traj_id.size(), pfb::kPutMeta));
        s.in_flight_prompt = from_numpy<int64_t>(d, "in_flight_prompt");
        s.in_flight_step = from_numpy<int64_t>(d, "in_flight_step");
        s.in_flight_dispatch_ns = from_numpy<int64_t>(d, "in_flight_dispatch_ns");
        const size_t m = s.in_flight_prompt.size();  // state_dicts from before leases lack the lease columns
        s.in_flight_lease_left_ns = from_numpy<int64_t>(d, "in_flight_lease_left_ns", std::make_pair(m, int64_t{-1}));
        s.in_flight_held_ns = from_numpy<int64_t>(d, "in_flight_held_ns", std::make_pair(m, int64_t{0}));
        // An in-flight prompt saved before sources and attempts: untagged, observed, not protected.
        s.in_flight_meta = from_numpy<int64_t>(d, "in_flight_meta", std::make_pair(m, pfb::make_meta(-1, 0, false, true)));
        if (d.contains("attempts")) {
          py::dict att = d["attempts"];
          const auto ids = from_numpy<int64_t>(att, "prompt_id"), attempts = from_numpy<int64_t>(att, "attempts");
          const auto trained = from_numpy<int64_t>(att, "trained"), pending = from_numpy<int64_t>(att, "pending");
          const auto slot = from_numpy<int64_t>(att, "slot"), lost = from_numpy<int64_t>(att, "lost_trajs");
          const auto flags = from_numpy<int64_t>(att, "flags"), since = from_numpy<int64_t>(att, "since_trained");
          const size_t k = ids.size();
          if (attempts.size() != k || trained.size() != k || pending.size() != k || slot.size() != k ||
              lost.size() != k || flags.size() != k || since.size() != k)
            throw pfb::InvalidArgument("state_dict: the attempts columns have different lengths");
          for (size_t i = 0; i < k; ++i) {
            auto narrow = [](int64_t v) { return static_cast<int32_t>(std::clamp<int64_t>(v, -1, INT32_MAX)); };
            s.attempts.push_back({ids[i], narrow(attempts[i]), narrow(trained[i]), narrow(pending[i]), narrow(slot[i]),
                                  narrow(since[i]), lost[i], (flags[i] & 1) != 0, (flags[i] & 2) != 0});
          }
          py::dict counters = d["attempt_counters"];
          s.attempt_counters.retries = counters["retries"].cast<int64_t>();
          s.attempt_counters.prompts_retried = counters["prompts_retried"].cast<int64_t>();
          s.attempt_counters.regenerations = counters["regenerations"].cast<int64_t>();
          s.attempt_counters.protected_groups = counters["protected"].cast<int64_t>();
          s.attempt_counters.forgotten = counters["forgotten"].cast<int64_t>();
        }
        if (d.contains("source_counts")) {
          auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(d["source_counts"]);
          if (!a || a.ndim() != 2 || a.shape(0) != pfb::kSourceSlots || a.shape(1) != 6)
            throw pfb::InvalidArgument("state_dict: 'source_counts' must be an int array of shape (65, 6)");
          auto v = a.unchecked<2>();
          for (int slot = 0; slot < pfb::kSourceSlots; ++slot)
            s.source_counts[slot] = {v(slot, 0), v(slot, 1), v(slot, 2), v(slot, 3), v(slot, 4), v(slot, 5)};
        }
        py::dict l = d["ledger"];
        s.ledger.dispatched = l["dispatched"].cast<int64_t>(), s.ledger.completed = l["completed"].cast<int64_t>();
        s.ledger.failed = l["failed"].cast<int64_t>(), s.ledger.put_total = l["put_total"].cast<int64_t>();
        s.ledger.taken = l["taken"].cast<int64_t>(), s.ledger.retired = l["retired"].cast<int64_t>();
        s.ledger.dropped_stale = l["dropped_stale"].cast<int64_t>(), s.ledger.evicted = l["evicted"].cast<int64_t>();
        s.ledger.max_age_changes = optional_int(l, "max_age_changes", 0);
        s.ledger.expired = optional_int(l, "expired", 0);
        s.ledger.admitted = optional_int(l, "admitted", 0);
        s.ledger.admission_refused = optional_int(l, "admission_refused", 0);
        s.ledger.admission_waits = optional_int(l, "admission_waits", 0);
        s.ledger.trained_over_age = optional_int(l, "trained_over_age", 0);
        s.ledger.protected_admitted = optional_int(l, "protected_admitted", 0);
        s.ledger.admitted_ahead = optional_int(l, "admitted_ahead", 0);
        s.ledger.retired_early = optional_int(l, "retired_early", 0);
        s.clock = d["clock"].cast<int64_t>();
        s.evicted_unreported = d["evicted_unreported"].cast<int64_t>();
        py::gil_scoped_release release;
        self.ring->import_state(s);
      });
}
