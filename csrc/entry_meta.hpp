// The per-entry `meta` column: response length, source slot, and the protected and observed flags.
#pragma once

#include <cstdint>

namespace pyfast_buffer {

/// Bits 0-31: response length (kNoLength when not given); bits 32-39: source slot (0 untagged, s + 1 for
/// source s); bit 40: protected (max_attempts); bit 41: observed (entered by complete, so its dispatch
/// and completion stamps time a real rollout). Put entries are unobserved.
constexpr int64_t kNoLength = 0xFFFFFFFFll;
constexpr int kMetaSlotShift = 32;
constexpr int64_t kMetaProtected = int64_t{1} << 40;
constexpr int64_t kMetaObserved = int64_t{1} << 41;

/// Returns the meta of an entry with `length` (< 0: none), source slot `slot`, and the two flags.
inline int64_t make_meta(int64_t length, int32_t slot, bool protect, bool observed) {
  return (length < 0 ? kNoLength : length) | (static_cast<int64_t>(slot) << kMetaSlotShift) |
         (protect ? kMetaProtected : 0) | (observed ? kMetaObserved : 0);
}

/// Returns the response length in `meta`, or -1 when none was given.
inline int64_t meta_length(int64_t meta) {
  const int64_t length = meta & kNoLength;
  return length == kNoLength ? -1 : length;
}

/// Returns the source slot in `meta` (0: untagged).
inline int32_t meta_slot(int64_t meta) { return static_cast<int32_t>((meta >> kMetaSlotShift) & 0xFF); }

/// Returns what decides the bound of an entry with `meta`: its slot, plus 256 when protected (bits 32-40).
inline int32_t meta_cut_index(int64_t meta) { return static_cast<int32_t>((meta >> kMetaSlotShift) & 0x1FF); }

/// Returns true iff the entry came through dispatch and complete.
inline bool meta_observed(int64_t meta) { return (meta & kMetaObserved) != 0; }

/// The meta of an untagged put entry.
constexpr int64_t kPutMeta = kNoLength;

}  // namespace pyfast_buffer
