// A file descriptor the ring writes a byte to when its waiters should look again, so that an event loop can
// wait on the ring without a thread per waiter (the awaitable API, pyfast_buffer/aio.py).
#pragma once

#include <unistd.h>

#include <atomic>

namespace pyfast_buffer {

/// Writes one byte to a caller's non-blocking fd at the first signal() after each arm(), nothing otherwise: a
/// reader that re-arms before it looks at the ring again misses no change and reads at most one byte per look.
class WakeFd {
 public:
  /// Sets the fd written to (-1: none); the caller keeps it open, and non-blocking, until it sets another.
  void set(int fd) noexcept { fd_.store(fd, std::memory_order_release); }
  /// Lets the next signal() write a byte.
  void arm() noexcept { armed_.store(true, std::memory_order_release); }
  /// Writes one byte if armed (disarming), else nothing; never blocks and ignores write errors (a full pipe
  /// already holds a wake-up).
  void signal() noexcept {
    const int fd = fd_.load(std::memory_order_acquire);
    if (fd < 0 || !armed_.exchange(false, std::memory_order_acq_rel)) return;
    const char byte = 1;
    const ssize_t written = ::write(fd, &byte, 1);
    (void)written;
  }

 private:
  std::atomic<int> fd_{-1};
  std::atomic<bool> armed_{false};
};

}  // namespace pyfast_buffer
