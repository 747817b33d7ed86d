// Switches callgrind's instrumentation on and off from a Python process (loaded with ctypes by
// benchmarks/native/python_calls.py): the perf guard counts a Python call's instructions between the two
// switches only, not the seconds of import before them. Outside valgrind both are no-ops.
#include <valgrind/callgrind.h>

/// Starts counting from zero.
extern "C" void pfb_callgrind_on() {
  CALLGRIND_ZERO_STATS;
  CALLGRIND_START_INSTRUMENTATION;
}

/// Stops counting; the totals at exit are what ran between the switches.
extern "C" void pfb_callgrind_off() { CALLGRIND_STOP_INSTRUMENTATION; }
