// A cache of packed weights (--weights-cache DIR): the second start of a model maps the
// tensors the first one packed instead of repacking them.
//
// Packing is most of a start: a 1.5 GB Q4_0 GGUF takes ~7 s to load on a 2-core Zen 4
// (most of it the kernel zeroing fresh anonymous pages, the rest repacking), while
// `cat` reads the file in 0.2 s. A cached start maps one file that the page cache
// already holds: no page is zeroed, nothing is repacked.
//
// One file per checkpoint, parallel layout, load options and rank:
//   DIR/<checkpoint name>-<hash of its path and the layout>.r<rank>.moe-ep-cache
// holding the records (loaded artifacts: a Linear, an MLP block) this rank loaded,
// each under a key that spells out everything its load read (tensor keys, shapes,
// shard rules, options). The file's identity line names the checkpoint's files (path,
// size, mtime, inode), the moe-ep executable (path, size, mtime: another build may pack
// differently) and the ISA level; a file whose identity differs is stale and is
// rebuilt whole, as is one that fails any check (magic, version, sizes, offsets,
// shapes, the index's and every tensor's checksum). Nothing read from the file is
// trusted before it is checked. A start that missed any record writes the file anew
// (all records it used; dropped ones leave), atomically: a temp file, fsync, rename.
// Two ranks never share a file; two jobs on one layout race only to replace it whole.
//
// Tensors of a hit are views of a private writable mapping: EPLB's slot moves write to
// their own copies of the pages (copy on write), never to the file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace moe {

// One loaded artifact as named contiguous tensors and integers.
struct CacheRecord {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, int64_t> ints;
  // Undefined tensors are not stored (tensor() gives them back undefined); a view that is
  // not contiguous is stored as a contiguous copy.
  void put(const std::string& name, const Tensor& t);
  void put(const std::string& name, int64_t v) { ints[name] = v; }
  Tensor tensor(const std::string& name) const;  // undefined when absent
  int64_t get(const std::string& name) const;    // an error naming the field when absent
  size_t nbytes() const;
};

struct WeightsCacheParams {
  std::string dir;         // --weights-cache DIR; created when missing
  std::string model_path;  // the checkpoint: a directory or a GGUF file (its parts too)
  // Everything else that decides this rank's weights and is not in the record keys:
  // dtype, quantisation options, the parallel layout, the placement, rank and world.
  std::string layout;
  int rank = 0;
  bool verbose = true;  // a line on stderr: hit, miss (and why), written
};

class WeightsCache {
 public:
  // Opens (maps and checks) the rank's file when there is a valid one; otherwise starts
  // empty and says why on stderr (verbose). Errors only when DIR is not a directory and
  // cannot be made one (a read-only DIR serves its valid files; commit() then fails).
  static std::unique_ptr<WeightsCache> open(const WeightsCacheParams& p);
  ~WeightsCache();

  // The record under `key` (its tensors checked against their checksums now), or
  // nullopt: a miss, after which the caller loads the artifact and add()s it.
  std::optional<CacheRecord> find(const std::string& key);
  void add(const std::string& key, CacheRecord r);
  // A found record its decoder refused (`why`): counted as a miss, repacked, rewritten.
  void reject(const std::string& key, const std::string& why);
  // Writes the file when any find() missed; else nothing. Returns the bytes written.
  // Errors (disk full, read-only DIR) name the file and errno.
  uint64_t commit();

  const std::string& path() const { return path_; }
  bool file_valid() const { return mapped_ != nullptr; }  // a valid file was mapped at open
  size_t hits() const { return hits_; }
  size_t misses() const { return misses_; }
  uint64_t bytes_mapped() const { return mapped_bytes_; }

  // The identity of the checkpoint's files (for the file's identity line; public for tests).
  static std::string checkpoint_identity(const std::string& model_path);

  struct Mapped;  // the checked mapping of a cache file (weights_cache.cpp)

 private:
  WeightsCache() = default;
  WeightsCacheParams p_;
  std::string path_, identity_;
  std::shared_ptr<Mapped> mapped_;              // the valid file, or null
  std::map<std::string, CacheRecord> records_;  // the records this start used, in key order
  size_t hits_ = 0, misses_ = 0;
  uint64_t mapped_bytes_ = 0;
};

// The record of `key`, or the artifact `load()` builds, recorded for the next start.
// `cache` may be null (no cache): then simply load().
template <class T, class Load, class Encode, class Decode>
T cached_load(WeightsCache* cache, const std::string& key, Load&& load, Encode&& encode, Decode&& decode) {
  if (!cache) return load();
  if (auto r = cache->find(key)) {
    // A record that passed the file's checks but not its decoder's (sizes, formats) is
    // repacked like a missing one; the decoder's error says why.
    try {
      return decode(*r);
    } catch (const std::exception& e) {
      cache->reject(key, e.what());
    }
  }
  T t = load();
  cache->add(key, encode(t));
  return t;
}

// A fast 64-bit checksum of bytes (xxHash64's round structure, our code; not a defence
// against a forger, who can rewrite a checksum: against torn, truncated or bit-rotted
// files). Chunks of 1 MiB are hashed on the OpenMP threads.
uint64_t cache_checksum(const void* data, size_t bytes);

}  // namespace moe
