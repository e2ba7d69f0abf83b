// GGUF files (llama.cpp's model container): a validated, read-only, zero-copy view over
// an mmap, and models split over several files.
//
// Layout (little-endian, versions 2 and 3; version 3 only added big-endian files, which
// we do not read):
//   "GGUF"  u32 version  u64 n_tensors  u64 n_kv
//   n_kv x      { string key, u32 value type, value }
//   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset }
//   padding to general.alignment (default 32), then the data section; each tensor's
//   offset is relative to its start and a multiple of the alignment.
// A string is u64 length + bytes (no terminator); an array is u32 element type,
// u64 count, then the elements (arrays may nest).
//
// open() validates everything before anything is handed out: every problem (truncation
// anywhere, bad magic or version, lengths and counts past the end, duplicate keys or
// tensors, bad dims, unknown types, misaligned, out-of-file or overlapping data) is a
// moe::Error naming the file, the key or tensor, and what was expected versus found.
// No count from the file is used to size an allocation before it is checked against
// the bytes that remain, so a hostile file fails at once instead of allocating.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "loader/gguf/gguf_types.h"
#include "loader/mapped_file.h"

namespace moe::gguf {

inline constexpr uint32_t kDefaultAlignment = 32;
// Arrays of arrays nest at most this deep (an array of scalars is depth 1). Real files
// use depth 1 (token lists, merges); the limit bounds the parser's recursion.
inline constexpr int kMaxArrayDepth = 8;
// The smallest valid file: magic, version and the two counts.
inline constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7,
  String = 8, Array = 9, U64 = 10, I64 = 11, F64 = 12,
};
// "UINT8", ..., "ARRAY" (gguf-py's names), or "type id N" for an unknown id.
std::string value_type_name(ValueType t);

// One metadata value. Numbers and bools (scalars and the elements of arrays of them)
// are read from the mapping on demand (little-endian, any alignment); strings are views
// of it. The GgufFile that holds the value keeps the mapping alive.
struct Value {
  ValueType type = ValueType::U8;
  ValueType elem_type = ValueType::U8;    // Array: the type of its elements
  uint64_t count = 0;                     // Array: number of elements
  const uint8_t* raw = nullptr;           // number or bool: its bytes; array of them: the first element's
  std::string_view str;                   // String
  std::vector<std::string_view> strings;  // Array of String: [count]
  std::vector<Value> items;               // Array of Array: [count]

  bool is_array() const { return type == ValueType::Array; }
  // Element i of an array of numbers or bools (i < count), or the scalar itself for
  // i = 0 of a scalar: as a wide integer (integers and bools) or a double (floats,
  // exact). Throws for other types; callers check the type first.
  __int128 int_at(uint64_t i = 0) const;
  double float_at(uint64_t i = 0) const;
};

// A short readable rendering: 42, 1.5, true, "text", [1, 2, ...] with at most
// max_items elements of each array shown (then "... (N total)").
std::string format_value(const Value& v, size_t max_items = 8);

struct KeyValue {
  std::string key;
  Value value;
};

// The metadata of one file with typed getters. A getter throws naming the key, the file
// and the type found when the key is missing or has the wrong type; integer getters
// accept any integer type whose value fits (checked), float getters F32 or F64.
// opt_* return nullopt for a missing key (and still throw for a wrong type).
class Metadata {
 public:
  const std::vector<KeyValue>& entries() const { return entries_; }  // in file order
  const Value* find(const std::string& key) const;
  bool contains(const std::string& key) const { return find(key) != nullptr; }

  uint32_t get_u32(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  int32_t get_i32(const std::string& key) const;
  int64_t get_i64(const std::string& key) const;
  float get_f32(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_str(const std::string& key) const;
  std::vector<std::string> get_str_array(const std::string& key) const;
  std::vector<int32_t> get_i32_array(const std::string& key) const;
  std::vector<float> get_f32_array(const std::string& key) const;

  std::optional<uint32_t> opt_u32(const std::string& key) const;
  std::optional<uint64_t> opt_u64(const std::string& key) const;
  std::optional<int32_t> opt_i32(const std::string& key) const;
  std::optional<int64_t> opt_i64(const std::string& key) const;
  std::optional<float> opt_f32(const std::string& key) const;
  std::optional<bool> opt_bool(const std::string& key) const;
  std::optional<std::string> opt_str(const std::string& key) const;
  std::optional<std::vector<std::string>> opt_str_array(const std::string& key) const;
  std::optional<std::vector<int32_t>> opt_i32_array(const std::string& key) const;
  std::optional<std::vector<float>> opt_f32_array(const std::string& key) const;

 private:
  friend class GgufParser;
  friend class GgufFile;
  std::string path_;  // for error messages
  std::vector<KeyValue> entries_;
  std::unordered_map<std::string, size_t> index_;
};

class GgufFile;

// One tensor of a file. ne is ggml's order: ne[0] is the innermost dimension (the row
// length, contiguous), unused dims are 1; PyTorch's shape is the reverse.
struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  int n_dims = 1;                             // 1..4
  std::array<int64_t, 4> ne{1, 1, 1, 1};      // ggml order, each >= 1
  uint64_t offset = 0;                        // absolute byte offset in the file
  uint64_t nbytes = 0;                        // ne[1]*ne[2]*ne[3] rows of row_bytes()
  const uint8_t* data = nullptr;              // offset bytes into the mapping
  const GgufFile* file = nullptr;             // the file it lies in (for errors)

  int64_t numel() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  uint64_t row_bytes() const { return nbytes / static_cast<uint64_t>(n_rows()); }
  // [ne[n_dims-1], ..., ne[0]]: the shape of the same tensor in the checkpoint it was
  // converted from (e.g. a Linear weight [out, in] is ne = {in, out}).
  Shape torch_shape() const;
  const uint8_t* row(int64_t r) const { return data + static_cast<uint64_t>(r) * row_bytes(); }
  // Dequantises row r (0 <= r < n_rows()) into dst[ne[0]]. Throws naming the tensor, the
  // file, its type and the supported types when the type is not supported.
  void dequantize_row(int64_t r, float* dst) const;
  // The codes / scales / offsets of row r (see gguf_types.h decompose_row); throws for
  // types without integer codes, naming the tensor.
  void decompose_row(int64_t r, const RowGroups& out) const;
  std::string describe() const;  // "'name' Q4_K ne=[256, 4]"
};

class GgufFile {
 public:
  static std::shared_ptr<GgufFile> open(const std::string& path);
  // The validation of open() over `size` bytes already in memory (open() maps the file
  // and calls this; the fuzzer hands it an exact-size heap buffer so AddressSanitizer
  // sees any read past the end). `data` is kept alive by the file; `path` names it in
  // errors; `backing` is handed on to the checkpoint's views (safetensors.h).
  static std::shared_ptr<GgufFile> from_bytes(std::shared_ptr<void> data, uint64_t size, const std::string& path,
                                              Backing backing = Backing::kHeap);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  // The mapping the tensors' data points into (kept alive by whoever holds it).
  const std::shared_ptr<void>& mapping() const { return mapping_; }
  Backing backing() const { return backing_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return file_size_; }
  uint32_t alignment() const { return alignment_; }
  // Absolute offset of the data section (a multiple of alignment()).
  uint64_t data_start() const { return data_start_; }

  const Metadata& metadata() const { return meta_; }
  // In the order of the file's tensor infos.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find(const std::string& name) const;
  // Throws naming the tensor and the file if absent.
  const GgufTensor& tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  friend class GgufParser;

  std::string path_;
  std::shared_ptr<void> mapping_;
  Backing backing_ = Backing::kHeap;
  uint64_t file_size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_start_ = 0;
  Metadata meta_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// A model in one file or split over parts named <prefix>-00001-of-0000N.gguf (what
// llama.cpp's gguf-split and gguf-py write): every part carries split.no (0-based),
// split.count and split.tensors.count; open() takes the first part, opens all of them,
// checks they belong together, and presents one tensor map. The model's metadata is the
// first part's (the others hold only the split keys).
class GgufModel {
 public:
  static GgufModel open(const std::string& first_path);
  // A model of one already opened file (its split.count, if any, must be 1).
  static GgufModel from_file(std::shared_ptr<GgufFile> file);

  const std::vector<std::shared_ptr<GgufFile>>& parts() const { return parts_; }
  const Metadata& metadata() const { return parts_.front()->metadata(); }
  const GgufTensor* find(const std::string& name) const;
  // Throws naming the tensor and the model's first file if absent.
  const GgufTensor& tensor(const std::string& name) const;
  // Every tensor of every part, parts in order, each in its file's order.
  std::vector<const GgufTensor*> tensors() const;
  size_t n_tensors() const { return by_name_.size(); }

 private:
  std::vector<std::shared_ptr<GgufFile>> parts_;
  std::map<std::string, const GgufTensor*> by_name_;
  // Indexes every part's tensors by name (an error for a name in two parts).
  void index(const std::string& first_path);
};

// The path of part `no` (1-based) of `count` given any part's path; throws if `path`
// does not end in -NNNNN-of-NNNNN.gguf.
std::string split_path(const std::string& path, int no, int count);

}  // namespace moe::gguf
