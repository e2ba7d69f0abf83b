// Open-addressing hash maps for the tokenizer's hot lookups (vocabulary strings, BPE
// merge pairs): one probe array, the hash stored in the slot, keys in one arena. Built
// once at load, read-only afterwards (so safe to share between threads).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace moe::text {

// 64-bit hash of a byte string (multiply-xorshift over 8-byte words).
inline uint64_t hash_bytes(std::string_view s) {
  constexpr uint64_t k = 0x9E3779B97F4A7C15ull;
  uint64_t h = 0xA0761D6478BD642Full ^ (s.size() * k);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * k;
    h ^= h >> 29;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * k;
    h ^= h >> 29;
  }
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h | 1;  // never 0: 0 marks an empty slot
}

// string -> int32. insert() overwrites the value of an existing key.
class FlatStrMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    if (cap > slots_.size()) rehash(cap);
  }
  // Returns true when the key was new.
  bool insert(std::string_view key, int32_t value) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
    const uint64_t h = hash_bytes(key);
    size_t i = h & (slots_.size() - 1);
    while (slots_[i].hash != 0) {
      Slot& s = slots_[i];
      if (s.hash == h && key_of(s) == key) {
        s.value = value;
        return false;
      }
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = {h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), value};
    arena_.append(key);
    ++size_;
    return true;
  }
  const int32_t* find(std::string_view key) const {
    if (slots_.empty()) return nullptr;
    const uint64_t h = hash_bytes(key);
    size_t i = h & (slots_.size() - 1);
    while (slots_[i].hash != 0) {
      const Slot& s = slots_[i];
      if (s.hash == h && key_of(s) == key) return &s.value;
      i = (i + 1) & (slots_.size() - 1);
    }
    return nullptr;
  }
  size_t size() const { return size_; }
  // Calls f(key, value) for every entry.
  template <class F>
  void for_each(F f) const {
    for (const Slot& s : slots_)
      if (s.hash != 0) f(key_of(s), s.value);
  }

 private:
  struct Slot {
    uint64_t hash;
    uint32_t off, len;
    int32_t value;
  };
  std::string_view key_of(const Slot& s) const { return std::string_view(arena_).substr(s.off, s.len); }
  void rehash(size_t cap) {
    std::vector<Slot> old(cap, Slot{0, 0, 0, 0});
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.hash == 0) continue;
      size_t i = s.hash & (cap - 1);
      while (slots_[i].hash != 0) i = (i + 1) & (cap - 1);
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

// uint64 -> V (V trivially copyable). insert() overwrites.
template <class V>
class FlatU64Map {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    if (cap > slots_.size()) rehash(cap);
  }
  void insert(uint64_t key, V value) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
    size_t i = slot_of(key);
    while (slots_[i].used) {
      if (slots_[i].key == key) {
        slots_[i].value = value;
        return;
      }
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = {key, value, true};
    ++size_;
  }
  const V* find(uint64_t key) const {
    if (slots_.empty()) return nullptr;
    size_t i = slot_of(key);
    while (slots_[i].used) {
      if (slots_[i].key == key) return &slots_[i].value;
      i = (i + 1) & (slots_.size() - 1);
    }
    return nullptr;
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;
    V value;
    bool used;
  };
  size_t slot_of(uint64_t key) const {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    return h & (slots_.size() - 1);
  }
  void rehash(size_t cap) {
    std::vector<Slot> old(cap, Slot{0, V{}, false});
    old.swap(slots_);
    for (const Slot& s : old) {
      if (!s.used) continue;
      size_t i = slot_of(s.key);
      while (slots_[i].used) i = (i + 1) & (cap - 1);
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace moe::text
