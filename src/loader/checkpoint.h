// A Hugging Face model directory: config.json plus safetensors weights; or a GGUF file
// (llama.cpp's format: loader/gguf/gguf_checkpoint.h), which presents the same config
// and keys.
//
// Weights are found, in order of preference, through
//   1. model.safetensors.index.json ("weight_map": key -> shard file in the directory),
//   2. model.safetensors,
//   3. every *.safetensors file in the directory (sorted by name).
// With an index, shards are opened (mmapped, header validated) lazily on the first
// access to one of their keys; an index-listed key missing from its shard is an error
// naming both when accessed. Without one, every file is opened at open() to learn its
// keys (only headers are read), and a key present in two files is an error naming both.
//
// Shard file names from the index must be plain names in the directory: no path
// separators, no "." or "..". (Symlinks, as the Hugging Face cache uses, are followed.)
//
// A Checkpoint is a cheap handle: copies share the opened shards. All methods are
// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "loader/safetensors.h"

namespace moe {

class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);

  const nlohmann::json& config() const;
  const std::string& dir() const;

  bool has(const std::string& key) const;
  // Opens the key's shard if needed. Throws "tensor 'X' not found in checkpoint DIR".
  const TensorInfo& info(const std::string& key) const;
  // Zero-copy, read-only view over the shard's mapping (counted in bytes_touched()).
  Tensor view(const std::string& key) const;
  // The bytes of `key` as stored, U8 [nbytes], zero-copy and counted (a GGUF quantised
  // tensor's blocks: loader/gguf/gguf_experts.h).
  Tensor view_raw(const std::string& key) const;
  // Bytes [begin, end) of them, counting only those.
  Tensor view_raw(const std::string& key, uint64_t begin, uint64_t end) const;
  // Elements [elem_begin, elem_begin + numel(shape)) of `key`, shaped `shape`: a
  // zero-copy view that touches (and counts) only those bytes.
  Tensor view_elems(const std::string& key, int64_t elem_begin, const Shape& shape) const;
  // Rows [begin, end) of dim 0 of `key` (e.g. experts [b, e) of a stacked [E, ...]
  // tensor), touching only those rows.
  Tensor view_rows(const std::string& key, int64_t begin, int64_t end) const;
  // Copies `count` pieces of `piece` elements of `key`, `stride` elements apart from
  // `elem_begin`, into dst (packed), touching (and counting) only those bytes.
  void copy_strided(const std::string& key, int64_t elem_begin, int64_t piece, int64_t stride, int64_t count,
                    void* dst) const;
  // Starts background reads of elements [elem_begin, elem_begin + n) of `key`
  // (madvise WILLNEED; nothing counted). Unknown keys are ignored.
  void prefetch_elems(const std::string& key, int64_t elem_begin, int64_t n) const;
  // Done with elements [elem_begin, elem_begin + n) of `key`: their whole pages leave
  // this process's mapping (SafetensorsFile::release_elems; the page cache keeps them).
  // Unknown keys are ignored.
  void release_elems(const std::string& key, int64_t elem_begin, int64_t n) const;
  std::vector<std::string> keys() const;  // sorted
  // The sorted keys that start with `prefix` (cheap: a range of the key map).
  std::vector<std::string> keys_with_prefix(const std::string& prefix) const;
  // Opens every shard (headers only, no tensor data), so that a broken shard is
  // reported now rather than at first access. Returns the number of shard files.
  size_t open_all_shards() const;
  // Sum of the sizes of every shard file (opens them all).
  uint64_t total_file_bytes() const;
  // Sum over opened shards of their header bytes (8 + N).
  uint64_t header_bytes_opened() const;
  // Full path of the file holding `key` (dir/shard); throws like info() if unknown.
  std::string file_of(const std::string& key) const;
  // Sum of bytes_touched() over the shards opened so far.
  uint64_t bytes_touched() const;
  // Sum of bytes_released() over the shards opened so far.
  uint64_t bytes_released() const;
  // Number of shard files opened (mmapped) so far; with an index, a lazily growing count.
  size_t shards_opened() const;

 private:
  struct State;
  explicit Checkpoint(std::shared_ptr<State> s) : s_(std::move(s)) {}
  std::shared_ptr<State> s_;
};

}  // namespace moe
