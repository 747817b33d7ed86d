// std::mutex with the capability annotations Clang's thread-safety analysis needs to see it.
#pragma once

#include <mutex>

#include "thread_annotations.hpp"

namespace pyfast_buffer {

/// A std::mutex the thread-safety analysis tracks; lock it through MutexLock.
class PFB_CAPABILITY("mutex") Mutex {
 public:
  /// Blocks until this thread holds the mutex.
  void lock() PFB_ACQUIRE() { mutex_.lock(); }

  /// Releases the mutex, which this thread holds.
  void unlock() PFB_RELEASE() { mutex_.unlock(); }

  /// Returns the pthread mutex, for a condition variable to wait on; the caller holds the mutex.
  std::mutex::native_handle_type native_handle() { return mutex_.native_handle(); }

 private:
  std::mutex mutex_;
};

/// Holds `mu` from construction until unlock() or destruction, whichever comes first.
class PFB_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) PFB_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() PFB_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  /// Releases the mutex early (to notify waiters after it is free); the destructor then does nothing.
  void unlock() PFB_RELEASE() {
    mu_.unlock();
    held_ = false;
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

/// Releases `mu`, which this thread holds, for the object's lifetime and takes it back on destruction,
/// also when an exception leaves the scope.
class PFB_SCOPED_CAPABILITY MutexUnlock {
 public:
  explicit MutexUnlock(Mutex& mu) PFB_RELEASE(mu) : mu_(mu) { mu_.unlock(); }
  ~MutexUnlock() PFB_RELEASE() { mu_.lock(); }
  MutexUnlock(const MutexUnlock&) = delete;
  MutexUnlock& operator=(const MutexUnlock&) = delete;

 private:
  Mutex& mu_;
};

}  // namespace pyfast_buffer
