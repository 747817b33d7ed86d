// Exceptions thrown by the core; bindings.cpp maps each to one Python type.
#pragma once

#include <stdexcept>
#include <string>

namespace pyfast_buffer {

/// Thrown when an argument is invalid for the call or the buffer's state; the buffer is left unchanged.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Thrown when a blocking call's timeout elapses; the message names what it was waiting for.
class Timeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown instead of waiting by a call given the probe timeout (kProbeTimeout) that would have to wait; nothing
/// changed and nothing was counted. The message names what it would wait for.
class WouldBlock : public Timeout {
 public:
  using Timeout::Timeout;
};

/// Thrown by every state-changing call on a closed buffer and by waiters that close() wakes.
class Closed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown when the ring's memory cannot be allocated; the message names the capacity and the bytes needed.
class OutOfMemory : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown when entries do not fit and on_full is error; the buffer is left unchanged.
class Full : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown when a paced dispatch or put without a timeout does not fit the admission limit; only the
/// admission_refused counter changes.
class AdmissionFull : public Full {
 public:
  using Full::Full;
};

}  // namespace pyfast_buffer
