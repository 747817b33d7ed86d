// Run-time CPU feature checks that work the same under GCC, Clang and zig's toolchain.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

namespace pyfast_buffer {

/// True iff the CPU has AVX-512F and AVX-512VL and the OS saves the ZMM/opmask registers.
/// Read from CPUID and XCR0 directly: __builtin_cpu_supports needs libgcc's CPU model, which
/// other runtimes (zig's compiler-rt, used for the manylinux_2_28 build) leave unset.
inline bool cpu_has_avx512f_vl() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE: XGETBV usable
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0xE6u) != 0xE6u) return false;  // SSE, AVX, opmask, ZMM0-15 and ZMM16-31 state enabled
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (b & (1u << 16)) && (b & (1u << 31));  // AVX512F, AVX512VL
}

}  // namespace pyfast_buffer
#endif
