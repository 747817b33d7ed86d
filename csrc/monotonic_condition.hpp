// A condition variable whose timed waits run on CLOCK_MONOTONIC on every libc the wheels target.
#pragma once

#include <pthread.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <system_error>

#include "mutex.hpp"
#include "thread_annotations.hpp"
#include "wake_fd.hpp"

namespace pyfast_buffer {

/// Stands in for std::condition_variable (the subset the ring uses), waiting with a held Mutex, whose deadlines
/// are steady_clock time points waited for on CLOCK_MONOTONIC, so a wall-clock jump never shortens or
/// stretches a timeout.
///
/// Why not std::condition_variable: libstdc++ and libc++ wait on steady_clock through
/// pthread_cond_clockwait, which only glibc >= 2.30 has; built against an older glibc (manylinux_2_28)
/// or musl they fall back to CLOCK_REALTIME deadlines. A pthread condition created with
/// pthread_condattr_setclock(CLOCK_MONOTONIC) is monotonic on glibc 2.3.3+ and musl alike.
class MonotonicCondition {
 public:
  MonotonicCondition() {
    pthread_condattr_t attr;
    check(pthread_condattr_init(&attr), "pthread_condattr_init");
    check(pthread_condattr_setclock(&attr, CLOCK_MONOTONIC), "pthread_condattr_setclock");
    const int rc = pthread_cond_init(&cond_, &attr);
    pthread_condattr_destroy(&attr);
    check(rc, "pthread_cond_init");
  }
  ~MonotonicCondition() { pthread_cond_destroy(&cond_); }
  MonotonicCondition(const MonotonicCondition&) = delete;
  MonotonicCondition& operator=(const MonotonicCondition&) = delete;

  /// Wakes every waiter, and signals `wake` if one is set (set_wake).
  void notify_all() noexcept {
    pthread_cond_broadcast(&cond_);
    if (wake_ != nullptr) wake_->signal();
  }
  /// Wakes one waiter, and signals `wake` if one is set.
  void notify_one() noexcept {
    pthread_cond_signal(&cond_);
    if (wake_ != nullptr) wake_->signal();
  }
  /// Makes every notify also signal `wake` (the waiters outside the lock: an event loop's); set it at construction.
  void set_wake(WakeFd* wake) noexcept { wake_ = wake; }

  /// Blocks until notified (or a spurious wake-up); the caller holds `mu`, which the wait releases meanwhile.
  void wait(Mutex& mu) PFB_REQUIRES(mu) { pthread_cond_wait(&cond_, mu.native_handle()); }

  /// Blocks until notified or `deadline` passes, `mu` (held by the caller) released meanwhile; returns
  /// timeout iff the deadline has passed on return.
  std::cv_status wait_until(Mutex& mu, std::chrono::steady_clock::time_point deadline) PFB_REQUIRES(mu) {
    if (std::chrono::steady_clock::now() < deadline) {
      const timespec ts = to_monotonic_timespec(deadline);
      pthread_cond_timedwait(&cond_, mu.native_handle(), &ts);
    }
    return std::chrono::steady_clock::now() < deadline ? std::cv_status::no_timeout : std::cv_status::timeout;
  }

  /// Waits until `ready()` holds or `deadline` passes; returns the last value of `ready()`.
  template <class Predicate>
  bool wait_until(Mutex& mu, std::chrono::steady_clock::time_point deadline, Predicate ready) PFB_REQUIRES(mu) {
    while (!ready()) {
      if (wait_until(mu, deadline) == std::cv_status::timeout) return ready();
    }
    return true;
  }

 private:
  // steady_clock is CLOCK_MONOTONIC on Linux (libstdc++ and libc++), so its time points convert directly.
  static timespec to_monotonic_timespec(std::chrono::steady_clock::time_point deadline) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
    timespec ts;
    ts.tv_sec = static_cast<time_t>(ns / 1000000000);
    ts.tv_nsec = static_cast<long>(ns % 1000000000);
    return ts;
  }
  static void check(int rc, const char* what) {
    if (rc != 0) throw std::system_error(rc, std::generic_category(), what);
  }

  pthread_cond_t cond_;
  WakeFd* wake_ = nullptr;
};

}  // namespace pyfast_buffer
