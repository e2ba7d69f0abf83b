#include "serve/engine/block_pool.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace moe::serve {

namespace {

// MurmurHash3's 64-bit finaliser: every input bit flips each output bit with
// probability ~1/2, so keys of prefixes that differ in one token spread over the map.
uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

}  // namespace

BlockPool::BlockPool(int64_t n_blocks, int64_t block_size, bool prefix_cache)
    : block_size_(block_size), prefix_cache_(prefix_cache), blocks_(static_cast<size_t>(n_blocks)) {
  MOE_CHECK(n_blocks >= 1 && block_size >= 1, "internal: a block pool of {} blocks of {}", n_blocks, block_size);
  // Taken from the back: block 0 first, as the scheduler before prefix caching did.
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

uint64_t BlockPool::root_key(const std::string& salt) {
  uint64_t h = 0x6a09e667f3bcc908ull;  // any fixed start; sqrt(2)'s fraction bits
  for (unsigned char c : salt) h = fmix64(h ^ c) + 0x9e3779b97f4a7c15ull;
  return fmix64(h ^ salt.size());
}

uint64_t BlockPool::chain_key(uint64_t parent, const int32_t* ids, int64_t n) {
  uint64_t h = fmix64(parent);
  for (int64_t i = 0; i < n; ++i) h = fmix64(h ^ static_cast<uint32_t>(ids[i])) + 0x9e3779b97f4a7c15ull;
  return fmix64(h);
}

std::vector<int32_t> BlockPool::match(const std::vector<uint64_t>& keys, const std::vector<int32_t>& tokens,
                                      const std::string& salt, int64_t max_blocks, uint64_t* serial) {
  std::vector<int32_t> out;
  uint64_t parent = 0;
  if (prefix_cache_) {
    const int64_t n = std::min<int64_t>(max_blocks, static_cast<int64_t>(keys.size()));
    for (int64_t j = 0; j < n; ++j) {
      auto it = by_key_.find(keys[j]);
      if (it == by_key_.end()) break;
      const Block& b = blocks_[it->second];
      const int32_t* want = tokens.data() + j * block_size_;
      const bool same = b.parent == parent && (j > 0 || b.salt == salt) &&
                        std::equal(b.ids.begin(), b.ids.end(), want, want + block_size_);
      if (!same) break;
      out.push_back(it->second);
      parent = b.serial;
    }
    for (int32_t id : out) {
      Block& b = blocks_[id];
      if (b.ref++ == 0) lru_.erase(b.in_lru);
    }
  }
  *serial = parent;
  return out;
}

int32_t BlockPool::take() {
  MOE_CHECK(available() > 0, "internal: no KV block to take");
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = lru_.front();
    lru_.pop_front();
    forget(id);
  }
  blocks_[id].ref = 1;
  return id;
}

void BlockPool::release(int32_t id) {
  Block& b = blocks_[id];
  MOE_CHECK(b.ref > 0, "internal: KV block {} released more often than taken", id);
  if (--b.ref > 0) return;
  if (b.published) {
    b.in_lru = lru_.insert(lru_.end(), id);
  } else {
    free_.push_back(id);
  }
}

void BlockPool::forget(int32_t id) {
  Block& b = blocks_[id];
  if (b.published) {
    auto it = by_key_.find(b.key);
    if (it != by_key_.end() && it->second == id) by_key_.erase(it);
  }
  b.published = false;
  b.ids.clear();
  b.salt.clear();
}

uint64_t BlockPool::publish(int32_t id, uint64_t key, const int32_t* ids, uint64_t parent, const std::string& salt) {
  if (!prefix_cache_) return 0;
  Block& b = blocks_[id];
  MOE_CHECK(b.ref > 0 && !b.published, "internal: publishing KV block {} that is not held or already published", id);
  auto it = by_key_.find(key);
  if (it != by_key_.end()) {
    const int32_t other = it->second;
    Block& o = blocks_[other];
    const bool same_prefix = o.parent == parent && (parent != 0 || o.salt == salt) &&
                             std::equal(o.ids.begin(), o.ids.end(), ids, ids + block_size_);
    if (same_prefix) return o.serial;  // computed twice (two requests at once): share the first
    if (o.ref > 0) return next_serial_++;  // a held block under this key: b stays private
    // A cached block under the key whose prefix is gone (its predecessor was evicted
    // and computed again, under a new serial) or collides: it can never match again.
    lru_.erase(o.in_lru);
    forget(other);
    free_.push_back(other);
  }
  b.published = true;
  b.key = key;
  b.serial = next_serial_++;
  b.parent = parent;
  b.ids.assign(ids, ids + block_size_);
  if (parent == 0) b.salt = salt;
  by_key_.emplace(key, id);
  return b.serial;
}

}  // namespace moe::serve
