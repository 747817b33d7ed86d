#include "compact_rows.hpp"

#include <cstdlib>

#include "cpu_features.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PYFAST_BUFFER_X86_SIMD 1
#endif

namespace pyfast_buffer {

#ifdef PYFAST_BUFFER_X86_SIMD

bool simd_compaction_available() {
  // PYFAST_BUFFER_NO_SIMD=1 forces the scalar pass (to test it on CPUs that have AVX-512).
  static const bool available = cpu_has_avx512f_vl() && std::getenv("PYFAST_BUFFER_NO_SIMD") == nullptr;
  return available;
}

namespace {
// Compress the fresh lanes into the low lanes of a register, then store all eight: the lanes past the
// kept ones land on rows already loaded (write <= read), so the full-width store is safe and cheaper
// than a masked compress-store.
__attribute__((target("avx512f,avx512vl"))) inline void move64(int64_t* col, int64_t read, int64_t write,
                                                                 __mmask8 keep) {
  const __m512i v = _mm512_loadu_si512(col + read);
  _mm512_storeu_si512(col + write, _mm512_maskz_compress_epi64(keep, v));
}

__attribute__((target("avx512f,avx512vl"))) inline void move32(int32_t* col, int64_t read, int64_t write,
                                                                 __mmask8 keep) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + read));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(col + write), _mm256_maskz_compress_epi32(keep, v));
}
}  // namespace

__attribute__((target("avx512f,avx512vl"))) int64_t compact_rows_simd(const ColumnPointers& c, const int64_t* key,
                                                                        int64_t read, int64_t write, int64_t n,
                                                                        int64_t cutoff) {
  const __m512i cut = _mm512_set1_epi64(cutoff);
  const int64_t start = write;
  for (int64_t end = read + n; read < end; read += 8) {
    const __mmask8 keep = _mm512_cmpge_epi64_mask(_mm512_loadu_si512(key + read), cut);
    move64(c.traj_id, read, write, keep);
    move64(c.group_id, read, write, keep);
    move64(c.sample_step, read, write, keep);
    move64(c.finish_step, read, write, keep);
    move64(c.dispatch_ns, read, write, keep);
    move64(c.complete_ns, read, write, keep);
    if (c.meta != nullptr) move64(c.meta, read, write, keep);  // null: every row's meta is the same, left in place
    move32(c.uses, read, write, keep);
    move32(c.group_len, read, write, keep);
    write += __builtin_popcount(keep);
  }
  return write - start;
}

#else

bool simd_compaction_available() { return false; }

int64_t compact_rows_simd(const ColumnPointers&, const int64_t*, int64_t, int64_t, int64_t, int64_t) { return 0; }

#endif

}  // namespace pyfast_buffer
