#include "loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>

#include "core/json_brief.h"
#include "loader/gguf/gguf_types.h"
#include "loader/mapped_file.h"

namespace moe {

namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};

constexpr DTypeName kDTypeNames[] = {
    {DType::F64, "F64"},      {DType::F32, "F32"},         {DType::F16, "F16"},
    {DType::BF16, "BF16"},    {DType::I64, "I64"},         {DType::I32, "I32"},
    {DType::I16, "I16"},      {DType::I8, "I8"},           {DType::U8, "U8"},
    {DType::Bool, "BOOL"},    {DType::F8E4M3, "F8_E4M3"},  {DType::F8E5M2, "F8_E5M2"},
};

std::string known_dtypes() {
  std::string s;
  for (const auto& d : kDTypeNames) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// A JSON value as a non-negative integer; false for negatives, floats, non-numbers.
bool json_u64(const nlohmann::json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

std::string errno_str() { return std::strerror(errno); }


// Elements of a tensor: its bytes over the element size, or for a quantised GGUF tensor
// (whose bytes are blocks) the product of its shape (checked against its bytes when the
// table was built).
uint64_t elem_count(const TensorInfo& info) {
  if (!info.quantized()) return info.nbytes / dtype_size(info.dtype);
  uint64_t n = 1;
  for (int64_t d : info.shape) n *= static_cast<uint64_t>(d);
  return n;
}

// The absolute byte offset of element `e` (e <= elem_count): for a quantised tensor the
// start of the block holding it, or with round_up the end of that block (unless e
// starts a block), so [byte_of(b), byte_of(e, true)) holds every block of [b, e).
uint64_t byte_of(const TensorInfo& info, uint64_t e, bool round_up) {
  if (!info.quantized()) return info.offset + e * dtype_size(info.dtype);
  const auto& ti = gguf::ggml_type_info(static_cast<gguf::GgmlType>(info.ggml_type));
  const uint64_t row_len = static_cast<uint64_t>(info.shape.back());
  const uint64_t row_bytes = row_len / ti.block_size * ti.block_bytes;
  const uint64_t r = e / row_len, c = e % row_len;
  const uint64_t bs = static_cast<uint64_t>(ti.block_size);
  const uint64_t blk = round_up ? (c + bs - 1) / bs : c / bs;
  return info.offset + r * row_bytes + blk * ti.block_bytes;
}
}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  MOE_FAIL("dtype {} has no safetensors name", dtype_name(t));
}

bool safetensors_dtype_from_name(const std::string& name, DType* out) {
  for (const auto& d : kDTypeNames)
    if (name == d.name) {
      *out = d.dtype;
      return true;
    }
  return false;
}

nlohmann::json parse_json_strict(const std::string& text, const std::string& what) {
  // nlohmann keeps one value of a duplicated key without a word; track the keys of
  // every open object ourselves and report the first repeat after the parse.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    // Thrown from inside the parse, which stops at once: it would otherwise keep a
    // stack entry per level of a 100 MB "[[[[...".
    if ((ev == E::object_start || ev == E::array_start) && depth >= kMaxJsonDepth)
      MOE_FAIL("{}: values nested more than {} levels deep (real files nest 3)", what, kMaxJsonDepth);
    if (ev == E::object_start) {
      open_objects.emplace_back();
    } else if (ev == E::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (ev == E::key && !open_objects.empty() && parsed.is_string()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  // nlohmann stops at a NUL byte as if the input ended there; the reference parser
  // does not, so neither do we (nothing after a NUL may hide in a header).
  const size_t nul = text.find('\0');
  MOE_CHECK(nul == std::string::npos, "{}: not valid JSON: NUL byte at offset {}", what, nul);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    MOE_FAIL("{}: not valid JSON: {}", what, e.what());
  }
  MOE_CHECK(duplicate.empty(), "{}: key '{}' appears twice in one JSON object (expected unique keys)",
            what, duplicate);
  return j;
}

// ---------------------------------------------------------------------------------------
// Reading

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const std::string where = fmt::format("safetensors file '{}'", path);

  MappedFile m = map_file_readonly(path, where, 8, [](uint64_t size) {
    return fmt::format("file is {} bytes, expected at least 8 (the header length)", size);
  });
  return from_bytes(std::move(m.data), m.size, path, Backing::kFileMapping);
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::from_bytes(std::shared_ptr<void> data, uint64_t size,
                                                             const std::string& path, Backing backing) {
  const std::string where = fmt::format("safetensors file '{}'", path);
  MOE_CHECK(size >= 8, "{}: file is {} bytes, expected at least 8 (the header length)", where, size);
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->file_size_ = size;
  f->mapping_ = std::move(data);
  f->backing_ = backing;
  const auto* bytes = static_cast<const unsigned char*>(f->mapping_.get());

  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  MOE_CHECK(n <= kSafetensorsMaxHeader, "{}: header length {} exceeds the cap of {} bytes", where,
            n, kSafetensorsMaxHeader);
  MOE_CHECK(n <= size - 8,
            "{}: header length {} runs past the end of the file (expected at most {} = file size "
            "{} - 8)",
            where, n, size - 8, size);
  f->header_bytes_ = n;
  const uint64_t data_start = 8 + n;
  f->data_start_ = data_start;
  const uint64_t data_size = size - data_start;

  const nlohmann::json header =
      parse_json_strict(std::string(reinterpret_cast<const char*>(bytes + 8), n), where + " header");
  MOE_CHECK(header.is_object(), "{}: header is a JSON {}, expected a JSON object", where,
            header.type_name());

  struct Range {
    uint64_t begin, end;
    size_t idx;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      MOE_CHECK(entry.is_object(), "{}: __metadata__ is a JSON {}, expected an object of strings",
                where, entry.type_name());
      for (const auto& [k, v] : entry.items()) {
        MOE_CHECK(v.is_string(), "{}: __metadata__ entry '{}' is a JSON {}, expected a string",
                  where, k, v.type_name());
        f->metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string tw = fmt::format("{}: tensor '{}'", where, name);
    MOE_CHECK(entry.is_object(), "{}: entry is a JSON {}, expected an object", tw,
              entry.type_name());

    TensorInfo info;
    info.name = name;

    auto it = entry.find("dtype");
    MOE_CHECK(it != entry.end(), "{}: missing field 'dtype'", tw);
    MOE_CHECK(it->is_string(), "{}: dtype is {}, expected a string", tw, json_brief(*it));
    const std::string& dt = it->get_ref<const std::string&>();
    MOE_CHECK(safetensors_dtype_from_name(dt, &info.dtype),
              "{}: unknown dtype '{}' (expected one of {})", tw, dt, known_dtypes());

    it = entry.find("shape");
    MOE_CHECK(it != entry.end(), "{}: missing field 'shape'", tw);
    MOE_CHECK(it->is_array(), "{}: shape is {}, expected an array of non-negative integers", tw,
              json_brief(*it));
    // numel is computed left to right in int64 by Tensor; every prefix must fit.
    int64_t numel = 1;
    for (const auto& d : *it) {
      uint64_t v = 0;
      MOE_CHECK(json_u64(d, &v),
                "{}: shape {} has element {}, expected non-negative integers", tw,
                json_brief(*it), json_brief(d));
      MOE_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                "{}: shape dimension {} overflows int64", tw, v);
      info.shape.push_back(static_cast<int64_t>(v));
      MOE_CHECK(!__builtin_mul_overflow(numel, static_cast<int64_t>(v), &numel),
                "{}: shape {} overflows: the element count does not fit in 64 bits", tw,
                json_brief(*it));
    }
    const uint64_t esize = dtype_size(info.dtype);
    uint64_t nbytes = 0;
    MOE_CHECK(!__builtin_mul_overflow(static_cast<uint64_t>(numel), esize, &nbytes),
              "{}: shape {} of {} overflows: the byte count does not fit in 64 bits", tw,
              shape_str(info.shape), dt);

    it = entry.find("data_offsets");
    MOE_CHECK(it != entry.end(), "{}: missing field 'data_offsets'", tw);
    uint64_t begin = 0, end = 0;
    MOE_CHECK(it->is_array() && it->size() == 2 && json_u64((*it)[0], &begin) &&
                  json_u64((*it)[1], &end),
              "{}: data_offsets is {}, expected an array of 2 non-negative integers", tw,
              json_brief(*it));
    MOE_CHECK(begin <= end, "{}: data_offsets [{}, {}] has begin > end", tw, begin, end);
    MOE_CHECK(end - begin == nbytes,
              "{}: shape {} of {} needs {} bytes but data_offsets [{}, {}] span {} bytes", tw,
              shape_str(info.shape), dt, nbytes, begin, end, end - begin);
    MOE_CHECK(end <= data_size,
              "{}: data_offsets [{}, {}] run past the end of the data area ({} bytes; file is "
              "{} bytes, data starts at {})",
              tw, begin, end, data_size, size, data_start);
    info.offset = data_start + begin;
    info.nbytes = nbytes;
    ranges.push_back({begin, end, f->tensors_.size()});
    f->tensors_.push_back(std::move(info));
  }

  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const Range& a = ranges[i - 1];
    const Range& b = ranges[i];
    MOE_CHECK(b.begin >= a.end,
              "{}: tensors '{}' (data_offsets [{}, {}]) and '{}' (data_offsets [{}, {}]) overlap",
              where, f->tensors_[a.idx].name, a.begin, a.end, f->tensors_[b.idx].name, b.begin,
              b.end);
  }
  // Store in file order.
  std::vector<TensorInfo> ordered;
  ordered.reserve(ranges.size());
  for (const Range& r : ranges) ordered.push_back(std::move(f->tensors_[r.idx]));
  f->tensors_ = std::move(ordered);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_.emplace(f->tensors_[i].name, i);
  f->release(0, data_start);  // parsed: nothing reads the header's pages again
  return f;
}

SafetensorsFile::~SafetensorsFile() = default;

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t SafetensorsFile::merge_locked(uint64_t begin, uint64_t end) {
  expand_strided_locked(begin, end);
  uint64_t added = end - begin;
  // Merge [begin, end) with every range it overlaps or abuts.
  auto it = touched_.upper_bound(begin);
  if (it != touched_.begin() && std::prev(it)->second >= begin) --it;
  uint64_t lo = begin, hi = end;
  while (it != touched_.end() && it->first <= hi) {
    const uint64_t ov_lo = std::max(begin, it->first), ov_hi = std::min(end, it->second);
    if (ov_hi > ov_lo) added -= std::min(added, ov_hi - ov_lo);
    lo = std::min(lo, it->first);
    hi = std::max(hi, it->second);
    it = touched_.erase(it);
  }
  touched_.emplace(lo, hi);
  return added;
}

void SafetensorsFile::expand_strided_locked(uint64_t begin, uint64_t end) {
  auto it = strided_.lower_bound(begin);
  if (it != strided_.begin()) {
    const auto p = std::prev(it);
    if (p->second.end(p->first) > begin) it = p;
  }
  while (it != strided_.end() && it->first < end) {
    const uint64_t b = it->first;
    const Strided s = it->second;
    it = strided_.erase(it);
    for (uint64_t i = 0; i < s.count; ++i) merge_locked(b + i * s.stride, b + i * s.stride + s.piece);
  }
}

bool SafetensorsFile::overlaps_locked(uint64_t begin, uint64_t end) const {
  auto t = touched_.upper_bound(begin);
  if (t != touched_.begin() && std::prev(t)->second > begin) return true;
  if (t != touched_.end() && t->first < end) return true;
  auto s = strided_.upper_bound(begin);
  if (s != strided_.begin()) {
    const auto p = std::prev(s);
    if (p->second.end(p->first) > begin) return true;
  }
  return s != strided_.end() && s->first < end;
}

void SafetensorsFile::touch(uint64_t begin, uint64_t end) {
  if (end <= begin) return;
  {
    std::lock_guard<std::mutex> lock(touched_mu_);
    const uint64_t added = merge_locked(begin, end);
    if (added == 0) return;
    bytes_touched_.fetch_add(added, std::memory_order_relaxed);
  }
  advise(begin, end);
}

void SafetensorsFile::touch_strided(uint64_t begin, uint64_t piece, uint64_t stride, uint64_t count) {
  if (piece == 0 || count == 0) return;
  const Strided s{piece, stride, count};
  const uint64_t end = s.end(begin);
  if (count == 1 || stride <= piece) return touch(begin, end);  // the pieces cover their span
  {
    std::lock_guard<std::mutex> lock(touched_mu_);
    uint64_t added = 0;
    if (!overlaps_locked(begin, end)) {
      strided_.emplace(begin, s);
      added = piece * count;
    } else {  // seen before in part (the same slice loaded twice, or a whole view): exact union
      for (uint64_t i = 0; i < count; ++i) added += merge_locked(begin + i * stride, begin + i * stride + piece);
    }
    bytes_touched_.fetch_add(added, std::memory_order_relaxed);
  }
  for (uint64_t i = 0; i < count; ++i) advise(begin + i * stride, begin + i * stride + piece);
}

void SafetensorsFile::advise(uint64_t begin, uint64_t end) const {
  // Read-ahead of large ranges, on whole pages inside the range only, so no
  // neighbouring tensor's (or expert's) pages are pulled in on its behalf.
  constexpr uint64_t kAdviseMin = 256u << 10;
  if (backing_ != Backing::kFileMapping || end <= begin || end - begin < kAdviseMin) return;
  char* base = static_cast<char*>(mapping_.get());
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t lo = (begin + page - 1) / page * page;
  const uint64_t hi = end / page * page;
  if (hi > lo) ::madvise(base + lo, hi - lo, MADV_WILLNEED);  // advisory; ignore errors
}

void SafetensorsFile::prefetch_elems(const std::string& name, int64_t elem_begin, int64_t n) const {
  const TensorInfo* info = find(name);
  if (!info || elem_begin < 0 || n <= 0) return;
  const uint64_t total = elem_count(*info);
  const uint64_t b = std::min<uint64_t>(static_cast<uint64_t>(elem_begin), total);
  const uint64_t e = std::min<uint64_t>(total, b + static_cast<uint64_t>(n));
  advise(byte_of(*info, b, false), byte_of(*info, e, true));
}

uint64_t SafetensorsFile::release(uint64_t begin, uint64_t end) {
  end = std::min(end, file_size_);
  if (end <= begin) return 0;
  uint64_t added = end - begin, lo = begin, hi = end;
  {
    std::lock_guard<std::mutex> lock(released_mu_);
    auto it = released_.upper_bound(begin);
    if (it != released_.begin() && std::prev(it)->second >= begin) --it;
    while (it != released_.end() && it->first <= hi) {
      const uint64_t ov_lo = std::max(begin, it->first), ov_hi = std::min(end, it->second);
      if (ov_hi > ov_lo) added -= std::min(added, ov_hi - ov_lo);
      lo = std::min(lo, it->first);
      hi = std::max(hi, it->second);
      it = released_.erase(it);
    }
    released_.emplace(lo, hi);
  }
  // The pages [begin, end) touches that the merged [lo, hi) covers whole; the file's last
  // page counts as whole once its bytes up to the end of the file are.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t first = std::max(begin / page * page, (lo + page - 1) / page * page);
  const uint64_t last = std::min((end + page - 1) / page * page,
                                 hi >= file_size_ ? (file_size_ + page - 1) / page * page : hi / page * page);
  // Advisory: the range lies inside the mapping, so this fails only for reasons that
  // leave the pages mapped, which costs memory, not correctness.
  if (last > first && backing_ == Backing::kFileMapping)
    ::madvise(static_cast<char*>(mapping_.get()) + first, last - first, MADV_DONTNEED);
  return added;
}

void SafetensorsFile::release_elems(const std::string& name, int64_t elem_begin, int64_t n) {
  const TensorInfo* info = find(name);
  if (!info || elem_begin < 0 || n <= 0) return;
  const uint64_t total = elem_count(*info);
  const uint64_t b = std::min<uint64_t>(static_cast<uint64_t>(elem_begin), total);
  const uint64_t e = std::min<uint64_t>(total, b + static_cast<uint64_t>(n));
  // A quantised range is rounded out to whole blocks: releasing is always safe (the
  // pages refault from the page cache), only a neighbour's read may pay for it.
  const uint64_t added = release(byte_of(*info, b, false), byte_of(*info, e, true));
  bytes_released_.fetch_add(added, std::memory_order_relaxed);
}

void SafetensorsFile::dequantize_elems(const TensorInfo& info, int64_t elem_begin, int64_t n, float* dst) {
  const auto type = static_cast<gguf::GgmlType>(info.ggml_type);
  const auto& ti = gguf::ggml_type_info(type);
  const int64_t row_len = info.shape.back(), bs = ti.block_size;
  touch(byte_of(info, static_cast<uint64_t>(elem_begin), false),
        byte_of(info, static_cast<uint64_t>(elem_begin + n), true));
  // Piece by piece within rows: the blocks covering [c, c + len) of row r, dequantised
  // whole into a scratch row, then the wanted part copied out.
  std::vector<float> scratch;
  const auto* base = static_cast<const uint8_t*>(mapping_.get());
  for (int64_t e = elem_begin, end = elem_begin + n; e < end;) {
    const int64_t r = e / row_len, c = e % row_len;
    const int64_t len = std::min(end - e, row_len - c);
    const int64_t b0 = c / bs, b1 = (c + len + bs - 1) / bs;
    const uint8_t* src = base + byte_of(info, static_cast<uint64_t>(r * row_len + b0 * bs), false);
    if (c == b0 * bs && len == (b1 - b0) * bs) {
      gguf::dequantize_row(type, src, dst, len);
    } else {
      scratch.resize(static_cast<size_t>((b1 - b0) * bs));
      gguf::dequantize_row(type, src, scratch.data(), (b1 - b0) * bs);
      std::memcpy(dst, scratch.data() + (c - b0 * bs), static_cast<size_t>(len) * sizeof(float));
    }
    dst += len;
    e += len;
  }
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::from_table(std::shared_ptr<void> data, uint64_t size,
                                                             uint64_t data_start, const std::string& path,
                                                             std::vector<TensorInfo> tensors, Backing backing) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->mapping_ = std::move(data);
  f->backing_ = backing;
  f->file_size_ = size;
  f->data_start_ = data_start;
  for (const TensorInfo& t : tensors) {
    MOE_CHECK(t.offset >= data_start && t.offset <= size && t.nbytes <= size - t.offset,
              "'{}': tensor '{}' at bytes [{}, +{}) lies outside the data area [{}, {})", path, t.name, t.offset,
              t.nbytes, data_start, size);
    if (t.quantized()) {
      const auto* ti = gguf::ggml_type_info(static_cast<uint32_t>(t.ggml_type));
      MOE_CHECK(ti && ti->supported && !t.shape.empty() && t.shape.back() % ti->block_size == 0,
                "'{}': tensor '{}' has ggml type {} and shape {}: not a supported quantised type, or rows that "
                "its blocks do not divide", path, t.name, t.ggml_type, shape_str(t.shape));
      const uint64_t want = gguf::ggml_row_bytes(ti->type, t.shape.back()) * (elem_count(t) / t.shape.back());
      MOE_CHECK(want == t.nbytes, "'{}': tensor '{}' ({} {}) holds {} bytes, expected {}", path, t.name, ti->name,
                shape_str(t.shape), t.nbytes, want);
    } else {
      uint64_t n = dtype_size(t.dtype);
      for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
      MOE_CHECK(n == t.nbytes, "'{}': tensor '{}' ({} {}) holds {} bytes, expected {}", path, t.name,
                dtype_name(t.dtype), shape_str(t.shape), t.nbytes, n);
    }
  }
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  for (size_t i = 1; i < tensors.size(); ++i)
    MOE_CHECK(tensors[i].offset >= tensors[i - 1].offset + tensors[i - 1].nbytes,
              "'{}': tensors '{}' and '{}' overlap", path, tensors[i - 1].name, tensors[i].name);
  f->tensors_ = std::move(tensors);
  for (size_t i = 0; i < f->tensors_.size(); ++i) {
    auto [it, fresh] = f->index_.emplace(f->tensors_[i].name, i);
    MOE_CHECK(fresh, "'{}': tensor '{}' is listed twice", path, f->tensors_[i].name);
  }
  return f;
}

Tensor SafetensorsFile::view_raw(const std::string& name) {
  auto it = index_.find(name);
  MOE_CHECK(it != index_.end(), "tensor '{}' not found in safetensors file '{}'", name, path_);
  const TensorInfo& info = tensors_[it->second];
  touch(info.offset, info.offset + info.nbytes);
  return Tensor::wrap(static_cast<char*>(mapping_.get()) + info.offset, {static_cast<int64_t>(info.nbytes)}, DType::U8,
                      mapping_);
}

Tensor SafetensorsFile::view_raw(const std::string& name, uint64_t begin, uint64_t end) {
  auto it = index_.find(name);
  MOE_CHECK(it != index_.end(), "tensor '{}' not found in safetensors file '{}'", name, path_);
  const TensorInfo& info = tensors_[it->second];
  MOE_CHECK(begin <= end && end <= info.nbytes, "tensor '{}' in '{}' holds {} bytes: [{}, {}) is outside it", name,
            path_, info.nbytes, begin, end);
  touch(info.offset + begin, info.offset + end);
  return Tensor::wrap(static_cast<char*>(mapping_.get()) + info.offset + begin, {static_cast<int64_t>(end - begin)},
                      DType::U8, mapping_);
}

Tensor SafetensorsFile::view(const std::string& name) {
  auto it = index_.find(name);
  MOE_CHECK(it != index_.end(), "tensor '{}' not found in safetensors file '{}'", name, path_);
  const TensorInfo& info = tensors_[it->second];
  if (info.quantized()) return view_elems(name, 0, info.shape);
  touch(info.offset, info.offset + info.nbytes);
  return Tensor::wrap(static_cast<char*>(mapping_.get()) + info.offset, info.shape, info.dtype, mapping_);
}

Tensor SafetensorsFile::view_elems(const std::string& name, int64_t elem_begin, const Shape& shape) {
  auto it = index_.find(name);
  MOE_CHECK(it != index_.end(), "tensor '{}' not found in safetensors file '{}'", name, path_);
  const TensorInfo& info = tensors_[it->second];
  const uint64_t esize = dtype_size(info.dtype);
  const uint64_t total = elem_count(info);
  uint64_t n = 1;
  bool ok = elem_begin >= 0;
  for (int64_t d : shape) ok = ok && d >= 0 && !__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n);
  ok = ok && static_cast<uint64_t>(elem_begin) <= total && n <= total - static_cast<uint64_t>(elem_begin);
  MOE_CHECK(ok, "tensor '{}' in '{}' ({} {}): elements [{}, +{}) shaped {} are outside its {} elements", name,
            path_, safetensors_dtype_name(info.dtype), shape_str(info.shape), elem_begin, n, shape_str(shape),
            total);
  if (info.quantized()) {
    Tensor t = Tensor::empty(shape, DType::F32);
    dequantize_elems(info, elem_begin, static_cast<int64_t>(n), t.data<float>());
    return t;
  }
  const uint64_t begin = info.offset + static_cast<uint64_t>(elem_begin) * esize;
  touch(begin, begin + n * esize);
  return Tensor::wrap(static_cast<char*>(mapping_.get()) + begin, shape, info.dtype, mapping_);
}

void SafetensorsFile::copy_strided(const std::string& name, int64_t elem_begin, int64_t piece, int64_t stride,
                                   int64_t count, void* dst) {
  auto it = index_.find(name);
  MOE_CHECK(it != index_.end(), "tensor '{}' not found in safetensors file '{}'", name, path_);
  const TensorInfo& info = tensors_[it->second];
  const uint64_t esize = dtype_size(info.dtype);
  const uint64_t total = elem_count(info);
  // The last piece ends at elem_begin + (count - 1) * stride + piece, which must fit.
  bool ok = elem_begin >= 0 && piece >= 0 && stride >= 0 && count >= 0;
  if (ok && count > 0) {
    uint64_t end = 0;
    ok = !__builtin_mul_overflow(static_cast<uint64_t>(count - 1), static_cast<uint64_t>(stride), &end) &&
         !__builtin_add_overflow(end, static_cast<uint64_t>(elem_begin), &end) &&
         !__builtin_add_overflow(end, static_cast<uint64_t>(piece), &end) && end <= total;
  }
  MOE_CHECK(ok, "tensor '{}' in '{}' ({} {}): {} pieces of {} elements every {} from element {} are outside its {} "
            "elements", name, path_, safetensors_dtype_name(info.dtype), shape_str(info.shape), count, piece, stride,
            elem_begin, total);
  if (count == 0 || piece == 0) return;
  if (info.quantized()) {
    float* out = static_cast<float*>(dst);
    for (int64_t i = 0; i < count; ++i) dequantize_elems(info, elem_begin + i * stride, piece, out + i * piece);
    return;
  }
  const uint64_t begin = info.offset + static_cast<uint64_t>(elem_begin) * esize;
  const uint64_t piece_b = static_cast<uint64_t>(piece) * esize, stride_b = static_cast<uint64_t>(stride) * esize;
  touch_strided(begin, piece_b, stride_b, static_cast<uint64_t>(count));
  const char* src = static_cast<const char*>(mapping_.get()) + begin;
  char* out = static_cast<char*>(dst);
  for (int64_t i = 0; i < count; ++i) std::memcpy(out + i * piece_b, src + i * stride_b, piece_b);
}

// ---------------------------------------------------------------------------------------
// Writing

namespace {

struct TmpFile {
  std::string path;
  FILE* fp = nullptr;
  bool done = false;
  ~TmpFile() {
    if (fp) std::fclose(fp);
    if (!done) ::unlink(path.c_str());
  }
};

}  // namespace

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MOE_CHECK(name != "__metadata__", "writing '{}': '__metadata__' cannot be a tensor name", path);
    MOE_CHECK(names.insert(name).second, "writing '{}': tensor '{}' given twice", path, name);
    MOE_CHECK(t.defined(), "writing '{}': tensor '{}' is undefined", path, name);
    MOE_CHECK(t.is_contiguous(), "writing '{}': tensor '{}' ({}) is not contiguous", path, name,
              t.describe());
    const uint64_t nb = t.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + nb}}};
    offset += nb;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    MOE_FAIL("writing '{}': cannot encode the header: {}", path, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));

  TmpFile tmp;
  tmp.path = path + ".tmp";
  tmp.fp = std::fopen(tmp.path.c_str(), "wb");
  MOE_CHECK(tmp.fp, "writing '{}': cannot create '{}': {}", path, tmp.path, errno_str());
  auto put = [&](const void* p, size_t n) {
    MOE_CHECK(n == 0 || std::fwrite(p, 1, n, tmp.fp) == n, "writing '{}': write failed: {}", path,
              errno_str());
  };
  put(len, 8);
  put(text.data(), text.size());
  for (const auto& [name, t] : tensors) put(t.raw(), t.nbytes());
  MOE_CHECK(std::fflush(tmp.fp) == 0, "writing '{}': flush failed: {}", path, errno_str());
  MOE_CHECK(::fsync(::fileno(tmp.fp)) == 0, "writing '{}': fsync failed: {}", path, errno_str());
  const int rc = std::fclose(tmp.fp);
  tmp.fp = nullptr;
  MOE_CHECK(rc == 0, "writing '{}': close failed: {}", path, errno_str());
  MOE_CHECK(::rename(tmp.path.c_str(), path.c_str()) == 0, "writing '{}': rename from '{}' failed: {}",
            path, tmp.path, errno_str());
  tmp.done = true;
}

}  // namespace moe
