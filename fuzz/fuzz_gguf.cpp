// libFuzzer: arbitrary bytes as a GGUF file. GgufFile::from_bytes (the validation open()
// runs on its mapping) gets a heap copy of exactly the input's size, so a read past the
// end is an AddressSanitizer report. It must either throw moe::Error or hand out a file
// that keeps the promises of gguf_file.h:
//   - every metadata value can be read whole (each element of each array, nested ones
//     too) and rendered; keys are unique and find() returns them;
//   - every tensor has 1..4 dims, each >= 1, a known type, ne[0] a multiple of its block
//     size, nbytes = rows x row bytes, data aligned, inside the file and disjoint from
//     the others; names are unique and find() works;
//   - the first row of a supported tensor dequantises (every byte of it read), and for
//     the integer-coded types scale * q - offset equals the dequantised value bit for
//     bit (or +0 for a reference -0) wherever the block's scales are finite.
// Typed getters on every key either return or throw moe::Error. A valid file is then
// mapped as a model (gguf_checkpoint.h) and its tokenizer converted (gguf_tokenizer.h):
// each either succeeds or throws moe::Error. Anything else (a crash,
// a sanitizer report, another exception, a broken promise) is a bug in the reader.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "fuzz_assert.h"
#include "loader/gguf/gguf_checkpoint.h"
#include "loader/gguf/gguf_file.h"
#include "loader/gguf/gguf_tokenizer.h"
#include "loader/gguf/gguf_types.h"

namespace {

using namespace moe::gguf;

// Reads every element of a value (so ASan checks each lies inside the buffer).
uint64_t walk(const Value& v) {
  uint64_t sink = 0;
  switch (v.type) {
    case ValueType::String:
      for (char c : v.str) sink += static_cast<uint8_t>(c);
      return sink;
    case ValueType::Array:
      if (v.elem_type == ValueType::String) {
        FUZZ_ASSERT(v.strings.size() == v.count);
        for (auto s : v.strings)
          for (char c : s) sink += static_cast<uint8_t>(c);
      } else if (v.elem_type == ValueType::Array) {
        FUZZ_ASSERT(v.items.size() == v.count);
        for (const Value& item : v.items) sink += walk(item);
      } else {
        for (uint64_t i = 0; i < v.count; ++i) {
          if (v.elem_type == ValueType::F32 || v.elem_type == ValueType::F64) sink += std::isnan(v.float_at(i));
          else sink += static_cast<uint64_t>(v.int_at(i));
        }
      }
      return sink;
    case ValueType::F32: case ValueType::F64:
      return std::isnan(v.float_at());
    default:
      return static_cast<uint64_t>(v.int_at());
  }
}

// Every getter on every key: a value or a moe::Error (wrong type, out of range).
template <class Fn>
void try_get(Fn&& fn) {
  try {
    fn();
  } catch (const moe::Error&) {
  }
}

void check_metadata(const Metadata& m) {
  std::set<std::string> keys;
  uint64_t sink = 0;
  for (const KeyValue& kv : m.entries()) {
    FUZZ_ASSERT(keys.insert(kv.key).second);
    FUZZ_ASSERT(m.find(kv.key) == &kv.value);
    sink += walk(kv.value);
    sink += format_value(kv.value, 4).size();
    const std::string& k = kv.key;
    try_get([&] { sink += m.get_u32(k); });
    try_get([&] { sink += m.get_i64(k); });
    try_get([&] { sink += static_cast<uint64_t>(std::isnan(m.get_f32(k))); });
    try_get([&] { sink += m.get_str(k).size(); });
    try_get([&] { sink += m.get_str_array(k).size(); });
    try_get([&] { sink += m.get_i32_array(k).size(); });
    try_get([&] { sink += m.get_f32_array(k).size(); });
  }
  (void)sink;
}

bool symmetric(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q5_0 || t == GgmlType::Q8_0 || t == GgmlType::Q6_K;
}

void check_tensor(const GgufFile& f, const GgufTensor& t) {
  FUZZ_ASSERT(f.find(t.name) == &t);
  FUZZ_ASSERT(t.n_dims >= 1 && t.n_dims <= 4);
  for (int d = 0; d < 4; ++d) FUZZ_ASSERT(t.ne[d] >= 1 && (d < t.n_dims || t.ne[d] == 1));
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(t.type));
  FUZZ_ASSERT(info != nullptr);
  FUZZ_ASSERT(t.ne[0] % info->block_size == 0);
  FUZZ_ASSERT(t.row_bytes() == ggml_row_bytes(t.type, t.ne[0]));
  FUZZ_ASSERT(t.nbytes == t.row_bytes() * static_cast<uint64_t>(t.n_rows()));
  FUZZ_ASSERT(t.offset >= f.data_start() && t.offset % f.alignment() == 0);
  FUZZ_ASSERT(t.offset <= f.file_size() && t.nbytes <= f.file_size() - t.offset);
  FUZZ_ASSERT(t.torch_shape().size() == static_cast<size_t>(t.n_dims));
  (void)t.describe();

  // The first row only, and not a huge one: an input can describe a row of millions of
  // F32 weights in a few MB, which would only slow the fuzzer down.
  if (!info->supported) {
    std::vector<float> one(1);
    try {
      t.dequantize_row(0, one.data());
      FUZZ_ASSERT(false);
    } catch (const moe::Error&) {
    }
    return;
  }
  if (t.ne[0] > (1 << 16)) return;
  const int64_t n = t.ne[0];
  std::vector<float> ref(static_cast<size_t>(n));
  t.dequantize_row(0, ref.data());
  const auto layout = group_layout(t.type);
  if (!layout) return;
  std::vector<uint8_t> q(static_cast<size_t>(n));
  std::vector<float> scale(static_cast<size_t>(n / layout->group_size)), offset(scale.size());
  t.decompose_row(0, RowGroups{q.data(), scale.data(), offset.data()});
  for (int64_t j = 0; j < n; ++j) {
    FUZZ_ASSERT(q[j] < (1u << layout->bits));
    const float s = scale[j / layout->group_size], o = offset[j / layout->group_size];
    if (!std::isfinite(s) || !std::isfinite(o)) continue;  // inf / NaN f16 scales: not promised
    const float p = s * static_cast<float>(q[j]);
    const float w = p - o;
    uint32_t wb, rb;
    std::memcpy(&wb, &w, 4);
    std::memcpy(&rb, &ref[j], 4);
    FUZZ_ASSERT(wb == rb || (symmetric(t.type) && rb == 0x80000000u && wb == 0));
  }
}

void check_file(const GgufFile& f, uint64_t size) {
  FUZZ_ASSERT(f.file_size() == size);
  FUZZ_ASSERT(f.version() == 2 || f.version() == 3);
  FUZZ_ASSERT(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  FUZZ_ASSERT(f.data_start() % f.alignment() == 0);
  check_metadata(f.metadata());
  std::set<std::string> names;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const GgufTensor& t : f.tensors()) {
    FUZZ_ASSERT(names.insert(t.name).second);
    check_tensor(f, t);
    ranges.emplace_back(t.offset, t.offset + t.nbytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) FUZZ_ASSERT(ranges[i].first >= ranges[i - 1].second);
  try_get([&] { (void)f.tensor("\x01 surely absent"); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::shared_ptr<void> buf(std::malloc(size == 0 ? 1 : size), std::free);
  if (size) std::memcpy(buf.get(), data, size);
  std::shared_ptr<GgufFile> f;
  try {
    f = GgufFile::from_bytes(buf, size, "fuzz.gguf");
  } catch (const moe::Error&) {
    return 0;
  }
  check_file(*f, size);
  // What a valid file is handed on to: the model's config and tensor map, and the
  // tokenizer converter. Each must throw moe::Error or succeed; the tokenizer converter's
  // output must be JSON, and every mapped tensor must lie inside the file.
  try {
    const CheckpointTables t = checkpoint_tables(GgufModel::from_file(f));
    for (const auto& table : t.files)
      for (const moe::TensorInfo& ti : table->tensors()) FUZZ_ASSERT(ti.offset + ti.nbytes <= size);
  } catch (const moe::Error&) {
  }
  try {
    const TokenizerFiles tf = tokenizer_files(f->metadata(), "fuzz.gguf");
    FUZZ_ASSERT(nlohmann::json::accept(tf.tokenizer_json) && nlohmann::json::accept(tf.tokenizer_config_json));
  } catch (const moe::Error&) {
  }
  return 0;
}
