// The KV-cache blocks of the served model: who holds each one, and which full blocks
// are known by their content so a later request whose prompt starts the same way reads
// them instead of prefilling them again (prefix caching, as vLLM's and SGLang's).
//
// A block is in one of three states:
//   held:   one or more requests read it (ref > 0);
//   cached: no request holds it, but its content is known (published): a request
//           whose tokens match takes it back; evicted least-recently-released first,
//           and only when a block is needed and no free one is left;
//   free:   no request holds it and its content is not known.
// A full block is found by a 64-bit key that chains the key of the block before it with
// its own block_size token ids (the first from the request's cache_salt), but the key
// is only the index: a match also checks the block's token ids, and that the block was
// published as the successor of the very block matched before it (each published block
// records its predecessor's serial number; serials are never reused), and for a first
// block, the salt. So a block is shared only by requests whose whole prefix up to its
// end is the same, token for token, whatever the keys do: a crafted collision of two
// keys can make a block unshareable, never make one request read another's prefix.
//
// Scheduler thread only (not thread-safe).
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

namespace moe::serve {

class BlockPool {
 public:
  // prefix_cache false: released blocks are always free (nothing is published).
  BlockPool(int64_t n_blocks, int64_t block_size, bool prefix_cache);

  // The key of the first block of a request with this cache_salt ("" for none).
  static uint64_t root_key(const std::string& salt);
  // The key of a block whose predecessor's key is `parent` and whose block_size token
  // ids are `ids`.
  static uint64_t chain_key(uint64_t parent, const int32_t* ids, int64_t n);

  // The longest run of published blocks (held or cached) that starts a sequence of
  // `tokens` with this salt, at most max_blocks of them; keys[j] is block j's key
  // (chain_key). Each block returned gains a reference (released like a taken one).
  // *serial: the serial naming the matched prefix (0 for none), for publish().
  std::vector<int32_t> match(const std::vector<uint64_t>& keys, const std::vector<int32_t>& tokens,
                             const std::string& salt, int64_t max_blocks, uint64_t* serial);
  // Blocks take() can hand out now: free ones plus cached ones no request holds.
  int64_t available() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  // One block with a reference: a free one, else the least recently released cached
  // one (its content is forgotten). available() must be > 0.
  int32_t take();
  // Drops one reference. At zero a published block becomes cached (the most recently
  // released), any other block free.
  void release(int32_t b);
  // Block b (held by the caller) is full and its K/V are in the cache: other requests
  // whose prefix is the same may share it. `parent` is the serial that publish (or
  // match) returned for the block before it, 0 for a first block (then `salt` counts).
  // Returns the serial that names the prefix up to b's end, for the next block: b's own,
  // or, when another block already holds the same prefix, that block's (b then stays
  // private and is freed at release). With the prefix cache off: 0, nothing published.
  uint64_t publish(int32_t b, uint64_t key, const int32_t* ids, uint64_t parent, const std::string& salt);

  bool prefix_cache() const { return prefix_cache_; }
  int64_t n_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t n_held() const { return n_blocks() - available(); }
  int64_t n_cached() const { return static_cast<int64_t>(lru_.size()); }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }

 private:
  struct Block {
    int32_t ref = 0;
    bool published = false;               // in by_key_ under `key`
    uint64_t key = 0, serial = 0, parent = 0;
    std::vector<int32_t> ids;             // its token ids, when published
    std::string salt;                     // a published first block's cache_salt
    std::list<int32_t>::iterator in_lru;  // valid while cached
  };
  void forget(int32_t b);  // unpublish: its content is no longer known
  int64_t block_size_;
  bool prefix_cache_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;  // taken from the back
  std::list<int32_t> lru_;     // cached blocks, least recently released first
  std::unordered_map<uint64_t, int32_t> by_key_;
  uint64_t next_serial_ = 1;
};

}  // namespace moe::serve
