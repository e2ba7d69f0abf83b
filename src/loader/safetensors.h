// safetensors files: a validated, read-only, zero-copy view over an mmap, and a writer.
//
// Format: 8-byte little-endian header length N, N bytes of JSON header, then the data
// area. The header maps tensor names to {dtype, shape, data_offsets: [begin, end)}
// (offsets relative to the data area) plus an optional "__metadata__" string map.
//
// open() validates the whole header before anything is handed out: every problem a
// file can have (truncation, bad JSON, unknown dtype, shape/byte-count mismatch,
// ranges past the end or overlapping, overflowing shapes) is a moe::Error naming the
// file, the tensor where one is involved, and what was expected versus found.
//
// view() returns a Tensor over the mapping (no copy; the Tensor keeps the mapping
// alive). view_elems() returns a sub-range of one tensor's elements (e.g. the rows of
// this rank's experts in a stacked [E, ...] tensor) without touching the rest. Pages
// of tensors nobody asked for are never touched, and bytes_touched() counts the
// distinct bytes handed out (the union of every range viewed) so callers can prove a
// rank reads only what it owns.
// The mapping is PROT_READ: views are read-only; writing through one faults.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/tensor.h"
#include "loader/mapped_file.h"

namespace moe {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t offset = 0;  // absolute byte offset in the file
  uint64_t nbytes = 0;
  // A GGUF quantised tensor (loader/gguf/gguf_checkpoint.h) holds its ggml type id here
  // (-1: a plain tensor of `dtype`). `dtype` is then F32, the type of its values once
  // dequantised: every read (view, view_elems, copy_strided) returns an owned f32 copy,
  // computed block by block with the reference dequantiser (exact), and `nbytes` counts
  // the quantised bytes.
  int32_t ggml_type = -1;
  bool quantized() const { return ggml_type >= 0; }
};

// The header-length cap of the reference implementation.
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

// "F32", "BF16", "F8_E4M3", ... <-> DType. from_name returns false for an unknown name.
const char* safetensors_dtype_name(DType t);
bool safetensors_dtype_from_name(const std::string& name, DType* out);

class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  // The validation and the views of open() over `size` bytes already in memory (open()
  // maps the file and calls this; the fuzzer hands it a heap buffer of exactly `size`
  // bytes, so AddressSanitizer sees a read one byte past the end, which a page-rounded
  // mapping would hide). `data` is kept alive by the views; `path` names it in errors.
  // `backing` says whether release_elems and prefetch_elems may madvise its pages.
  static std::shared_ptr<SafetensorsFile> from_bytes(std::shared_ptr<void> data, uint64_t size,
                                                     const std::string& path, Backing backing = Backing::kHeap);
  // The same views, byte counting and page release over a file of another format whose
  // caller has already parsed and validated it (a GGUF part: loader/gguf/
  // gguf_checkpoint.h), given its tensor table. Each tensor must lie inside [data_start,
  // size) and no two may overlap (checked: an error names both). metadata() is empty.
  static std::shared_ptr<SafetensorsFile> from_table(std::shared_ptr<void> data, uint64_t size, uint64_t data_start,
                                                     const std::string& path, std::vector<TensorInfo> tensors,
                                                     Backing backing = Backing::kHeap);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // In data-offset order (the order the tensors lie in the file).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // Zero-copy, read-only view; throws naming the key and the file if absent.
  Tensor view(const std::string& name);
  // The tensor's bytes as stored, U8 [nbytes], zero-copy (for a quantised GGUF tensor:
  // its blocks, which loader/gguf decomposes into the engine's integer formats).
  Tensor view_raw(const std::string& name);
  // Bytes [begin, end) of those, counting only them (a GGUF quantised tensor's whole
  // rows: row r is bytes [r * row_bytes, (r + 1) * row_bytes)).
  Tensor view_raw(const std::string& name, uint64_t begin, uint64_t end);
  // Elements [elem_begin, elem_begin + numel(shape)) of tensor `name` (row-major),
  // shaped `shape`: a zero-copy view that counts only those bytes. Throws naming the
  // tensor and the file if the range is outside the tensor.
  Tensor view_elems(const std::string& name, int64_t elem_begin, const Shape& shape);
  // Copies `count` pieces of `piece` elements of tensor `name` into dst (packed), the
  // first at element `elem_begin` and each `stride` elements after the previous one:
  // a strided slice (the input-dim slice of a row-parallel weight, an expert's I slice
  // of down_proj). Counts only those bytes as touched. Throws naming the tensor and the
  // file if a piece is outside the tensor.
  void copy_strided(const std::string& name, int64_t elem_begin, int64_t piece, int64_t stride, int64_t count,
                    void* dst);
  // Asks the kernel to start reading elements [elem_begin, elem_begin + n) of `name`
  // in the background (madvise WILLNEED; not counted as touched). Out-of-range
  // requests are clipped; errors are ignored (advisory).
  void prefetch_elems(const std::string& name, int64_t elem_begin, int64_t n) const;
  // Says the caller is done with elements [elem_begin, elem_begin + n) of `name` (e.g. a
  // tensor just packed into the engine's own layout): the pages of the mapping that only
  // released bytes share leave this process (madvise DONTNEED), so a rank holds each
  // weight once, in its packed form, instead of also holding the file's pages. The page
  // cache keeps them: a later view of the range refaults them from memory (never from
  // disk while the cache holds them), with the same bytes, so releasing is always safe,
  // only slower if the range is read again. A page shared with a neighbour is released
  // once both sides are (and the header's pages at open, the file's tail as it ends).
  // Out-of-range requests are clipped; bytes_touched() is not changed. Thread-safe.
  void release_elems(const std::string& name, int64_t elem_begin, int64_t n);

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t header_bytes() const { return header_bytes_; }  // N (the JSON part only)
  uint64_t data_start() const { return data_start_; }   // 8 + N for safetensors
  // Distinct bytes handed out by view() and view_elems() (overlaps counted once). Thread-safe.
  uint64_t bytes_touched() const { return bytes_touched_.load(std::memory_order_relaxed); }
  // Distinct bytes of tensor data released by release_elems (overlaps counted once).
  uint64_t bytes_released() const { return bytes_released_.load(std::memory_order_relaxed); }

 private:
  SafetensorsFile() = default;

  std::string path_;
  std::shared_ptr<void> mapping_;  // munmaps when the last view goes away
  Backing backing_ = Backing::kHeap;
  uint64_t file_size_ = 0;
  uint64_t header_bytes_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  // Counts the bytes of [begin, end) (absolute file offsets) not viewed before and
  // asks the kernel to read large ranges ahead.
  void touch(uint64_t begin, uint64_t end);
  // The same for `count` pieces of `piece` bytes, `stride` bytes apart, from `begin`.
  void touch_strided(uint64_t begin, uint64_t piece, uint64_t stride, uint64_t count);
  void advise(uint64_t begin, uint64_t end) const;
  // Dequantises elements [elem_begin, elem_begin + n) of a quantised tensor into dst,
  // touching (counting) the blocks that hold them.
  void dequantize_elems(const TensorInfo& info, int64_t elem_begin, int64_t n, float* dst);
  // Sorts tensors_ by offset, checks no two overlap, builds index_.
  void finish_table(const std::string& where);
  // Adds [begin, end) (absolute offsets) to released_ and drops the mapping's pages that
  // released bytes now cover whole; returns the bytes not released before.
  uint64_t release(uint64_t begin, uint64_t end);

  // A strided touch kept as one record rather than one range per piece: a MoE-TP
  // rank's slices of down_proj would otherwise cost a map node per row of every expert.
  struct Strided {
    uint64_t piece = 0, stride = 0, count = 0;
    uint64_t end(uint64_t begin) const { return begin + (count - 1) * stride + piece; }  // of the last piece
  };
  // With touched_mu_ held: adds [begin, end) to touched_ and returns the bytes that
  // were not in it; moves the strided records overlapping [begin, end) into touched_.
  uint64_t merge_locked(uint64_t begin, uint64_t end);
  void expand_strided_locked(uint64_t begin, uint64_t end);
  bool overlaps_locked(uint64_t begin, uint64_t end) const;

  std::mutex touched_mu_;
  std::map<uint64_t, uint64_t> touched_;  // disjoint, non-adjacent [begin, end) ranges
  // begin -> record; their spans (first piece to last) are disjoint from each other and
  // from touched_, so the bytes counted are always the union of everything viewed.
  std::map<uint64_t, Strided> strided_;
  std::atomic<uint64_t> bytes_touched_{0};

  std::mutex released_mu_;
  std::map<uint64_t, uint64_t> released_;  // disjoint, non-adjacent [begin, end) ranges, header included
  std::atomic<uint64_t> bytes_released_{0};
};

// Writes the standard format: header padded with spaces to a multiple of 8, data in
// the order given, packed. Writes path + ".tmp" and renames it over path, so a failure
// never leaves a half-written file. Tensors must be contiguous and names unique.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Nesting depth parse_json_strict accepts: real files nest 3 levels (a safetensors
// header's shape, an index's weight_map, config.json's rope_parameters); a deeper value
// would only make every recursive walk of it (dump(), a copy, a comparison) a stack
// overflow waiting for a large enough file.
inline constexpr int kMaxJsonDepth = 64;

// Parses JSON text; any parse error, an object holding the same key twice (which
// nlohmann would silently collapse) or values nested deeper than kMaxJsonDepth is a
// moe::Error that starts with `what` (e.g. the file name). Used for safetensors
// headers, model.safetensors.index.json and config.json.
nlohmann::json parse_json_strict(const std::string& text, const std::string& what);

}  // namespace moe
