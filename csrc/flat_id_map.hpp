// An open-addressing hash map from int64 ids to small values: flat arrays, no node per entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace pyfast_buffer {

/// Maps int64 keys (any value) to `V` in one power-of-two array of slots, linear probing, at most half
/// full; erase moves later entries of the probe run back (backward shift), so no tombstones build up and
/// a lookup stops at the first empty slot. The array grows by doubling and never shrinks (clear keeps it).
/// Pointers to values stay valid until the next insert or erase. Not thread-safe.
template <class V>
class FlatIdMap {
 public:
  /// Returns the value of `key`, or nullptr when absent.
  const V* find(int64_t key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (!s.full) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  /// Returns the value of `key`, or nullptr when absent.
  V* find(int64_t key) { return const_cast<V*>(static_cast<const FlatIdMap&>(*this).find(key)); }

  /// Returns true iff `key` is present.
  bool contains(int64_t key) const { return find(key) != nullptr; }

  /// Adds `key` (the caller has checked that it is absent) with `value`; returns the stored value.
  V& insert(int64_t key, V value) {
    if (2 * (size_ + 1) > slots_.size()) rehash(slots_.empty() ? kMinSlots : 2 * slots_.size());
    size_t i = home(key);
    while (slots_[i].full) i = (i + 1) & mask_;
    slots_[i].key = key, slots_[i].value = std::move(value), slots_[i].full = true;
    ++size_;
    return slots_[i].value;
  }

  /// Removes `key`; returns false (changing nothing) when it was absent.
  bool erase(int64_t key) {
    if (slots_.empty()) return false;
    size_t hole = home(key);
    for (;; hole = (hole + 1) & mask_) {
      if (!slots_[hole].full) return false;
      if (slots_[hole].key == key) break;
    }
    // Every later entry of the run whose home is not between the hole and itself may move into the hole.
    for (size_t j = (hole + 1) & mask_; slots_[j].full; j = (j + 1) & mask_) {
      const size_t want = home(slots_[j].key);
      if (((j - want) & mask_) >= ((j - hole) & mask_)) slots_[hole] = std::move(slots_[j]), hole = j;
    }
    slots_[hole] = Slot{};
    --size_;
    return true;
  }

  /// Removes every entry (the slot array keeps its size).
  void clear() {
    for (Slot& s : slots_) s = Slot{};
    size_ = 0;
  }

  /// Makes room for `n` entries without growing on the way.
  void reserve(size_t n) {
    size_t want = kMinSlots;
    while (want < 2 * n) want *= 2;
    if (want > slots_.size()) rehash(want);
  }

  /// Returns the number of entries.
  size_t size() const { return size_; }

  /// Calls `f(key, value)` for every entry, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.full) f(s.key, s.value);
  }

  /// Calls `f(key, value&)` for every entry, in no particular order; `f` may change values, never keys.
  template <class F>
  void for_each_mutable(F&& f) {
    for (Slot& s : slots_)
      if (s.full) f(s.key, s.value);
  }

 private:
  static constexpr size_t kMinSlots = 16;
  struct Slot {
    int64_t key = 0;
    V value{};
    bool full = false;
  };
  // Fibonacci hashing: the top bits of key * 2**64/phi; sequential ids (the usual case) spread evenly.
  size_t home(int64_t key) const {
    return static_cast<size_t>((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void rehash(size_t n_slots) {
    std::vector<Slot> old(n_slots);
    old.swap(slots_);
    mask_ = n_slots - 1;
    shift_ = 64;
    for (size_t n = n_slots; n > 1; n >>= 1) --shift_;
    for (Slot& s : old)
      if (s.full) {
        size_t i = home(s.key);
        while (slots_[i].full) i = (i + 1) & mask_;
        slots_[i] = std::move(s);
      }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;  // 64 - log2(slots_.size()); home() is only called with slots allocated
  size_t size_ = 0;
};

}  // namespace pyfast_buffer
