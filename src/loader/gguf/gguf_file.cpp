// GgufFile: mapping a file and validating its header, metadata and tensor infos.
#include "loader/gguf/gguf_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/ranges.h>

#include "core/check.h"
#include "loader/mapped_file.h"

namespace moe::gguf {

namespace {

std::string where_of(const std::string& path) { return fmt::format("gguf file '{}'", path); }

// Bytes of one element of an array of `t` (for String and Array: the least an element
// can take, its length or type + count fields), used to reject a count that cannot fit
// in what is left of the file before anything is allocated for it.
uint64_t min_elem_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::Bool: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::String: return 8;
    case ValueType::Array: return 4 + 8;
  }
  return 1;
}

bool fixed_size(ValueType t) { return t != ValueType::String && t != ValueType::Array; }

// The least a tensor info takes: name length, n_dims, one dim, type, offset.
constexpr uint64_t kMinTensorInfo = 8 + 4 + 8 + 4 + 8;
// The least a key-value pair takes: key length, value type, a one-byte value.
constexpr uint64_t kMinKeyValue = 8 + 4 + 1;

}  // namespace

// Reads the file front to back; every read checks the bytes left first. `ctx_*` name the
// key or tensor being read, for the messages.
class GgufParser {
 public:
  GgufParser(GgufFile* f, const uint8_t* base, uint64_t size)
      : f_(f), p_(base), size_(size), where_(where_of(f->path_)) {}

  void run() {
    header();
    for (uint64_t i = 0; i < n_kv_; ++i) key_value(i);
    alignment();
    tensor_infos();
    tensor_data();
  }

 private:
  GgufFile* f_;
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string where_;
  uint64_t n_tensors_ = 0, n_kv_ = 0;
  const char* ctx_kind_ = "header";  // "key", "tensor" or "header"
  std::string ctx_name_;

  uint64_t left() const { return size_ - pos_; }

  // "the header", "key 'general.name'", "tensor #3" (before its name is read).
  std::string ctx() const {
    if (ctx_name_.empty()) return "the header";
    return fmt::format("{} {}", ctx_kind_, ctx_name_);
  }

  void need(uint64_t n, const char* what) {
    MOE_CHECK(n <= left(), "{}: truncated: {} of {} needs {} bytes at offset {}, but the file ends at {} ({} left)",
              where_, what, ctx(), n, pos_, size_, left());
  }
  uint32_t u32(const char* what) {
    need(4, what);
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | p_[pos_ + i];
    pos_ += 4;
    return v;
  }
  uint64_t u64(const char* what) {
    need(8, what);
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p_[pos_ + i];
    pos_ += 8;
    return v;
  }
  std::string_view str(const char* what) {
    const uint64_t start = pos_;
    const uint64_t n = u64(what);
    MOE_CHECK(n <= left(), "{}: {} of {} at offset {} claims {} bytes, past the end of the file ({} bytes left)",
              where_, what, ctx(), start, n, left());
    std::string_view s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }

  void header() {
    need(kHeaderBytes, "the fixed header (magic, version, tensor and key counts)");
    MOE_CHECK(std::memcmp(p_, "GGUF", 4) == 0,
              "{}: bad magic: the file starts with bytes {:02x} {:02x} {:02x} {:02x}, expected 'GGUF' (47 47 55 46)",
              where_, p_[0], p_[1], p_[2], p_[3]);
    pos_ = 4;
    const uint32_t v = u32("version");
    if (v != 2 && v != 3) {
      const uint32_t swapped = __builtin_bswap32(v);
      MOE_CHECK(swapped != 2 && swapped != 3, "{}: version {} read little-endian is {} byte-swapped: a big-endian "
                "file, which this reader does not support (expected a little-endian version 2 or 3)", where_, v,
                swapped);
      MOE_FAIL("{}: unsupported version {}, expected 2 or 3{}", where_, v,
               v == 1 ? " (version 1 used 32-bit counts and is not supported)" : "");
    }
    f_->version_ = v;
    n_tensors_ = u64("tensor count");
    n_kv_ = u64("metadata key-value count");
    MOE_CHECK(n_kv_ <= left() / kMinKeyValue, "{}: header claims {} metadata key-value pairs, but only {} bytes "
              "are left (each takes at least {}): truncated or corrupt", where_, n_kv_, left(), kMinKeyValue);
    MOE_CHECK(n_tensors_ <= left() / kMinTensorInfo, "{}: header claims {} tensors, but only {} bytes are left "
              "(each tensor info takes at least {}): truncated or corrupt", where_, n_tensors_, left(), kMinTensorInfo);
  }

  ValueType value_type(const char* what) {
    const uint64_t at = pos_;
    const uint32_t t = u32(what);
    MOE_CHECK(t <= static_cast<uint32_t>(ValueType::F64), "{}: {} of {} at offset {} is {}, expected 0..12 (UINT8 .. "
              "FLOAT64)", where_, what, ctx(), at, t);
    return static_cast<ValueType>(t);
  }

  Value value(ValueType t, int depth) {
    Value v;
    v.type = t;
    if (t == ValueType::String) {
      v.str = str("string value");
    } else if (t == ValueType::Array) {
      array(&v, depth + 1);
    } else {
      need(min_elem_bytes(t), "value");
      v.raw = p_ + pos_;
      pos_ += min_elem_bytes(t);
    }
    return v;
  }

  void array(Value* v, int depth) {
    MOE_CHECK(depth <= kMaxArrayDepth, "{}: {} has arrays nested more than {} deep (at offset {})", where_, ctx(),
              kMaxArrayDepth, pos_);
    v->elem_type = value_type("array element type");
    const uint64_t at = pos_;
    v->count = u64("array count");
    const uint64_t each = min_elem_bytes(v->elem_type);
    MOE_CHECK(v->count <= left() / each, "{}: {} at offset {}: an array of {} {} needs at least {} bytes each, but "
              "only {} bytes are left in the file: truncated or corrupt", where_, ctx(), at, v->count,
              value_type_name(v->elem_type), each, left());
    if (fixed_size(v->elem_type)) {
      v->raw = p_ + pos_;
      pos_ += v->count * each;  // <= left(), checked above
    } else if (v->elem_type == ValueType::String) {
      v->strings.reserve(v->count);
      for (uint64_t i = 0; i < v->count; ++i) v->strings.push_back(str("string element"));
    } else {
      v->items.reserve(v->count);
      for (uint64_t i = 0; i < v->count; ++i) {
        Value item;
        item.type = ValueType::Array;
        array(&item, depth + 1);
        v->items.push_back(std::move(item));
      }
    }
  }

  void key_value(uint64_t i) {
    ctx_kind_ = "key";
    ctx_name_ = fmt::format("#{}", i);
    const uint64_t at = pos_;
    const std::string key(str("name"));
    ctx_name_ = fmt::format("'{}'", key);
    Metadata& m = f_->meta_;
    MOE_CHECK(!m.index_.count(key), "{}: key '{}' appears twice (again at offset {}); expected unique keys", where_,
              key, at);
    const ValueType t = value_type("value type");
    Value v = value(t, 0);
    m.index_.emplace(key, m.entries_.size());
    m.entries_.push_back({key, std::move(v)});
  }

  void alignment() {
    ctx_kind_ = "header";
    ctx_name_.clear();
    if (f_->meta_.contains("general.alignment")) {
      const uint32_t al = f_->meta_.get_u32("general.alignment");
      MOE_CHECK(al != 0 && (al & (al - 1)) == 0, "{}: key 'general.alignment' is {}, expected a power of two",
                where_, al);
      f_->alignment_ = al;
    }
  }

  void tensor_infos() {
    MOE_CHECK(n_tensors_ <= left() / kMinTensorInfo, "{}: header claims {} tensors, but only {} bytes are left after "
              "the metadata (each tensor info takes at least {}): truncated or corrupt", where_, n_tensors_, left(),
              kMinTensorInfo);
    f_->tensors_.reserve(n_tensors_);
    for (uint64_t i = 0; i < n_tensors_; ++i) tensor_info(i);
  }

  void tensor_info(uint64_t i) {
    ctx_kind_ = "tensor";
    ctx_name_ = fmt::format("#{}", i);
    GgufTensor t;
    const uint64_t at = pos_;
    t.name = std::string(str("name"));
    ctx_name_ = fmt::format("'{}'", t.name);
    MOE_CHECK(!f_->index_.count(t.name), "{}: tensor '{}' appears twice (again at offset {}); expected unique names",
              where_, t.name, at);
    const uint32_t n_dims = u32("n_dims");
    MOE_CHECK(n_dims >= 1 && n_dims <= 4, "{}: tensor '{}' has n_dims {}, expected 1 to 4", where_, t.name, n_dims);
    t.n_dims = static_cast<int>(n_dims);
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t v = u64("a dimension");
      MOE_CHECK(v >= 1 && v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                "{}: tensor '{}' has ne[{}] = {}, expected a dimension >= 1 (and < 2^63)", where_, t.name, d, v);
      t.ne[d] = static_cast<int64_t>(v);
      MOE_CHECK(!__builtin_mul_overflow(numel, t.ne[d], &numel), "{}: tensor '{}' has ne {}: its element count "
                "overflows int64", where_, t.name, fmt::join(t.ne.begin(), t.ne.begin() + d + 1, " x "));
    }
    const uint32_t type = u32("ggml type");
    const GgmlTypeInfo* info = ggml_type_info(type);
    MOE_CHECK(info, "{}: tensor '{}' has unknown ggml type id {} (known: {})", where_, t.name, type,
              ggml_known_types());
    t.type = info->type;
    MOE_CHECK(t.ne[0] % info->block_size == 0, "{}: tensor '{}' ({}): its row length ne[0] = {} is not a multiple "
              "of the {} block size {}", where_, t.name, info->name, t.ne[0], info->name, info->block_size);
    // The element count fits int64, but up to 8 bytes per element (F64, I64) do not
    // have to fit uint64.
    uint64_t row = 0;
    MOE_CHECK(!__builtin_mul_overflow(static_cast<uint64_t>(t.ne[0] / info->block_size), info->block_bytes, &row) &&
                  !__builtin_mul_overflow(row, static_cast<uint64_t>(t.n_rows()), &t.nbytes),
              "{}: tensor '{}' ({} ne {}): its byte size overflows", where_, t.name, info->name,
              fmt::join(t.ne.begin(), t.ne.begin() + t.n_dims, " x "));
    t.offset = u64("data offset");  // relative to the data section until tensor_data()
    t.file = f_;
    f_->index_.emplace(t.name, f_->tensors_.size());
    f_->tensors_.push_back(std::move(t));
  }

  void tensor_data() {
    ctx_kind_ = "header";
    ctx_name_.clear();
    const uint64_t al = f_->alignment_;
    const uint64_t start = (pos_ + al - 1) / al * al;  // pos_ <= size_ < 2^64 - 2^32: no overflow
    f_->data_start_ = start;
    if (f_->tensors_.empty()) return;
    MOE_CHECK(start <= size_, "{}: the data section starts at offset {} (the tensor infos end at {}, padded to the "
              "alignment {}), past the end of the file ({} bytes)", where_, start, pos_, al, size_);
    const uint64_t room = size_ - start;
    for (GgufTensor& t : f_->tensors_) {
      MOE_CHECK(t.offset % al == 0, "{}: tensor '{}' has data offset {}, expected a multiple of the alignment {}",
                where_, t.name, t.offset, al);
      MOE_CHECK(t.offset <= room && t.nbytes <= room - t.offset, "{}: tensor '{}' ({} ne {}, {} bytes) at data "
                "offset {} runs past the end of the file: the data section has {} bytes (file size {}, data "
                "section from offset {})", where_, t.name, ggml_type_name(t.type),
                fmt::join(t.ne.begin(), t.ne.begin() + t.n_dims, " x "), t.nbytes, t.offset, room, size_, start);
      t.offset += start;
      t.data = p_ + t.offset;
    }
    // Overlapping data means a hand-made (or hostile) file: writers lay tensors one
    // after another. Sorted by offset, each must start at or after the previous end.
    std::vector<const GgufTensor*> order;
    order.reserve(f_->tensors_.size());
    for (const GgufTensor& t : f_->tensors_) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const GgufTensor* a, const GgufTensor* b) {
      return a->offset != b->offset ? a->offset < b->offset : a->nbytes < b->nbytes;
    });
    for (size_t i = 1; i < order.size(); ++i) {
      const GgufTensor& a = *order[i - 1];
      const GgufTensor& b = *order[i];
      MOE_CHECK(b.offset >= a.offset + a.nbytes, "{}: the data of tensors '{}' [{}, {}) and '{}' [{}, {}) overlap; "
                "expected disjoint ranges", where_, a.name, a.offset, a.offset + a.nbytes, b.name, b.offset,
                b.offset + b.nbytes);
    }
  }
};

std::string value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "UINT8";
    case ValueType::I8: return "INT8";
    case ValueType::U16: return "UINT16";
    case ValueType::I16: return "INT16";
    case ValueType::U32: return "UINT32";
    case ValueType::I32: return "INT32";
    case ValueType::F32: return "FLOAT32";
    case ValueType::Bool: return "BOOL";
    case ValueType::String: return "STRING";
    case ValueType::Array: return "ARRAY";
    case ValueType::U64: return "UINT64";
    case ValueType::I64: return "INT64";
    case ValueType::F64: return "FLOAT64";
  }
  return fmt::format("type id {}", static_cast<uint32_t>(t));
}

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
  const std::string where = where_of(path);
  MappedFile m = map_file_readonly(path, where, kHeaderBytes, [](uint64_t size) {
    return fmt::format("truncated: the file is {} bytes, the header alone needs {}", size, kHeaderBytes);
  });
  return from_bytes(std::move(m.data), m.size, path, Backing::kFileMapping);
}

std::shared_ptr<GgufFile> GgufFile::from_bytes(std::shared_ptr<void> data, uint64_t size, const std::string& path,
                                               Backing backing) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->meta_.path_ = path;
  f->file_size_ = size;
  f->mapping_ = std::move(data);
  f->backing_ = backing;
  MOE_CHECK(size >= kHeaderBytes, "{}: truncated: the file is {} bytes, the header alone needs {}", where_of(path),
            size, kHeaderBytes);
  GgufParser(f.get(), static_cast<const uint8_t*>(f->mapping_.get()), size).run();
  return f;
}

const GgufTensor* GgufFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find(name);
  MOE_CHECK(t, "{}: no tensor named '{}' ({} tensors in the file)", where_of(path_), name, tensors_.size());
  return *t;
}

// ---------------------------------------------------------------------------------------
// GgufTensor

Shape GgufTensor::torch_shape() const {
  Shape s;
  for (int d = n_dims - 1; d >= 0; --d) s.push_back(ne[d]);
  return s;
}

std::string GgufTensor::describe() const {
  return fmt::format("'{}' {} ne=[{}]", name, ggml_type_name(type), fmt::join(ne.begin(), ne.begin() + n_dims, ", "));
}

void GgufTensor::dequantize_row(int64_t r, float* dst) const {
  const std::string path = file ? file->path() : "?";
  require_supported(type, name, path);
  MOE_CHECK(r >= 0 && r < n_rows(), "gguf file '{}': tensor {}: row {} out of range [0, {})", path, describe(), r,
            n_rows());
  gguf::dequantize_row(type, row(r), dst, ne[0]);
}

void GgufTensor::decompose_row(int64_t r, const RowGroups& out) const {
  const std::string path = file ? file->path() : "?";
  require_supported(type, name, path);
  MOE_CHECK(group_layout(type).has_value(), "gguf file '{}': tensor {} has no integer codes to decompose (a float "
            "type)", path, describe());
  MOE_CHECK(r >= 0 && r < n_rows(), "gguf file '{}': tensor {}: row {} out of range [0, {})", path, describe(), r,
            n_rows());
  gguf::decompose_row(type, row(r), ne[0], out);
}

}  // namespace moe::gguf
