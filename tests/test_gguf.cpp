// GGUF reader and ggml block formats against files written by gguf-py (llama.cpp's
// Python library, tools/gen_gguf_fixtures.py): metadata values and types, tensor infos
// and offsets, dequantisation bit for bit, the exact integer-group decomposition, split
// models. Hostile files are in test_gguf_hostile.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/dtype.h"
#include "loader/gguf/gguf_file.h"
#include "loader/gguf/gguf_types.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace moe::gguf;

namespace {

std::string dir() { return std::string(MOE_FIXTURES_DIR) + "/gguf"; }

const json& golden() {
  static const json g = [] {
    std::ifstream in(dir() + "/golden.json");
    if (!in) throw std::runtime_error("cannot read " + dir() + "/golden.json (run tools/gen_gguf_fixtures.py)");
    return json::parse(in);
  }();
  return g;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Expects `fn` to throw moe::Error whose message contains every one of `words`.
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> words) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << *words.begin() << "'";
  } catch (const moe::Error& e) {
    for (const auto& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << "message: " << e.what() << "\nmissing: " << w;
  }
}

// Compares a metadata value with the JSON the script wrote (recursively for arrays).
void expect_value(const Value& v, const json& j, const std::string& where) {
  SCOPED_TRACE(where);
  auto element = [&](uint64_t i, ValueType t, const json& e) {
    switch (t) {
      case ValueType::String: EXPECT_EQ(std::string(v.strings.at(i)), e.get<std::string>()); break;
      case ValueType::Array: expect_value(v.items.at(i), e, where + "[" + std::to_string(i) + "]"); break;
      case ValueType::F32: case ValueType::F64: EXPECT_EQ(v.float_at(i), e.get<double>()); break;
      case ValueType::Bool: EXPECT_EQ(v.int_at(i) != 0, e.get<bool>()); break;
      default:
        if (e.is_number_unsigned()) EXPECT_TRUE(v.int_at(i) == static_cast<__int128>(e.get<uint64_t>()));
        else EXPECT_TRUE(v.int_at(i) == static_cast<__int128>(e.get<int64_t>()));
    }
  };
  if (j.is_array()) {
    ASSERT_TRUE(v.is_array());
    ASSERT_EQ(v.count, j.size());
    for (uint64_t i = 0; i < v.count; ++i) element(i, v.elem_type, j[i]);
  } else if (v.type == ValueType::String) {
    EXPECT_EQ(std::string(v.str), j.get<std::string>());
  } else {
    element(0, v.type, j);
  }
}

void expect_tensors(const std::vector<const GgufTensor*>& got, const json& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const GgufTensor& t = *got[i];
    const json& w = want[i];
    SCOPED_TRACE(w["name"].get<std::string>());
    EXPECT_EQ(t.name, w["name"].get<std::string>());
    EXPECT_EQ(static_cast<uint32_t>(t.type), w["type_id"].get<uint32_t>());
    EXPECT_EQ(std::string(ggml_type_name(t.type)), w["type"].get<std::string>());
    ASSERT_EQ(t.n_dims, static_cast<int>(w["ne"].size()));
    for (int d = 0; d < t.n_dims; ++d) EXPECT_EQ(t.ne[d], w["ne"][d].get<int64_t>());
    EXPECT_EQ(t.offset, w["offset"].get<uint64_t>());  // gguf-py's reader: absolute
    EXPECT_EQ(t.nbytes, w["nbytes"].get<uint64_t>());
    EXPECT_NE(t.data, nullptr);
    EXPECT_EQ(ggml_type_supported(t.type), w["supported"].get<bool>());
    if (w.contains("torch_shape")) {
      EXPECT_EQ(t.torch_shape(), w["torch_shape"].get<moe::Shape>());
    }
  }
}

// Every row of t dequantised equals gguf-py's values bit for bit (NaNs included).
void expect_dequant(const GgufTensor& t, const json& w) {
  SCOPED_TRACE(t.describe());
  const auto& want = w["f32_bits"];
  ASSERT_EQ(static_cast<int64_t>(want.size()), t.numel());
  std::vector<float> row(static_cast<size_t>(t.ne[0]));
  int64_t mismatches = 0;
  for (int64_t r = 0; r < t.n_rows(); ++r) {
    t.dequantize_row(r, row.data());
    for (int64_t j = 0; j < t.ne[0]; ++j) {
      const uint32_t expect = want[static_cast<size_t>(r * t.ne[0] + j)].get<uint32_t>();
      if (bits(row[j]) != expect && mismatches++ < 5)
        ADD_FAILURE() << "row " << r << " [" << j << "]: ours " << row[j] << " (0x" << std::hex << bits(row[j])
                      << "), gguf-py 0x" << expect << std::dec;
    }
  }
  EXPECT_EQ(mismatches, 0);
}

bool symmetric(GgmlType t) {
  return t == GgmlType::Q4_0 || t == GgmlType::Q5_0 || t == GgmlType::Q8_0 || t == GgmlType::Q6_K;
}

struct DecomposeStats {
  int64_t weights = 0, signed_zeros = 0;
};

// decompose_row's w = scale * q - offset against dequantize_row for `n_rows` rows of n
// weights at src (row_bytes apart). The only allowed difference: the reference's -0 is
// +0 in the decomposition, for the symmetric types (gguf_types.h says why).
void expect_exact_decomposition(GgmlType t, const uint8_t* src, int64_t n, int64_t n_rows, DecomposeStats* stats) {
  SCOPED_TRACE(ggml_type_name(t));
  const GroupLayout g = group_layout(t).value();
  const uint64_t row_bytes = ggml_row_bytes(t, n);
  std::vector<float> ref(n), scale(n / g.group_size), offset(n / g.group_size);
  std::vector<uint8_t> q(n);
  int64_t bad = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = src + r * row_bytes;
    dequantize_row(t, row, ref.data(), n);
    decompose_row(t, row, n, RowGroups{q.data(), scale.data(), offset.data()});
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_LT(q[j], 1u << g.bits);
      const float p = scale[j / g.group_size] * static_cast<float>(q[j]);
      const float w = p - offset[j / g.group_size];
      ++stats->weights;
      if (bits(w) == bits(ref[j])) continue;
      if (symmetric(t) && bits(ref[j]) == 0x80000000u && bits(w) == 0u) {
        ++stats->signed_zeros;
        continue;
      }
      if (bad++ < 5)
        ADD_FAILURE() << "row " << r << " [" << j << "]: q " << int(q[j]) << " scale " << scale[j / g.group_size]
                      << " offset " << offset[j / g.group_size] << " gives " << w << ", reference " << ref[j];
    }
  }
  EXPECT_EQ(bad, 0);
}

std::shared_ptr<GgufFile> all_types() {
  static auto f = GgufFile::open(dir() + "/all_types.gguf");
  return f;
}

std::vector<const GgufTensor*> ptrs(const GgufFile& f) {
  std::vector<const GgufTensor*> v;
  for (const auto& t : f.tensors()) v.push_back(&t);
  return v;
}

}  // namespace

TEST(GgufTypes, TableEqualsGgufPys) {
  const json& types = golden()["ggml_types"];
  ASSERT_GT(types.size(), 30u);
  for (const json& t : types) {
    SCOPED_TRACE(t.dump());
    const GgmlTypeInfo* info = ggml_type_info(t["id"].get<uint32_t>());
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(std::string(info->name), t["name"].get<std::string>());
    EXPECT_EQ(info->block_size, t["block_size"].get<int64_t>());
    EXPECT_EQ(info->block_bytes, t["block_bytes"].get<uint64_t>());
  }
  for (uint32_t retired : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 42u, 1000u}) {
    EXPECT_EQ(ggml_type_info(retired), nullptr) << retired;
  }
  EXPECT_EQ(ggml_supported_types(), "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K");
}

TEST(GgufFixture, MetadataEqualsWhatGgufPyWrote) {
  const auto f = all_types();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_start() % 32, 0u);
  const Metadata& m = f->metadata();
  const json& want = golden()["files"]["all_types.gguf"]["metadata"];
  EXPECT_EQ(m.entries().size(), want.size() + 1);  // + general.architecture, which the writer adds
  EXPECT_EQ(m.get_str("general.architecture"), "llama");
  for (const auto& [key, w] : want.items()) {
    const Value* v = m.find(key);
    ASSERT_NE(v, nullptr) << key;
    EXPECT_EQ(value_type_name(v->type), w["type"].get<std::string>()) << key;
    if (w.contains("elem_type")) {
      EXPECT_EQ(value_type_name(v->elem_type), w["elem_type"].get<std::string>()) << key;
    }
    expect_value(*v, w["value"], key);
  }
}

TEST(GgufFixture, TypedGettersConvertAndCheckRanges) {
  const Metadata& m = all_types()->metadata();
  const std::string path = dir() + "/all_types.gguf";
  EXPECT_EQ(m.get_u32("test.u32"), 4000000000u);
  EXPECT_EQ(m.get_u64("test.u64"), UINT64_MAX);
  EXPECT_EQ(m.get_i64("test.i64"), INT64_MIN);
  EXPECT_EQ(m.get_i32("test.u8"), 200);  // any integer type fits where the value does
  EXPECT_EQ(m.get_i64("test.i16"), -30000);
  EXPECT_EQ(m.get_f32("test.f32"), 3.14159f);
  EXPECT_EQ(m.get_f32("test.f64"), static_cast<float>(2.718281828459045));
  EXPECT_TRUE(m.get_bool("test.bool_true"));
  EXPECT_FALSE(m.get_bool("test.bool_false"));
  EXPECT_EQ(m.get_str("test.str"), "h\u00e9llo \u2713 w\u00f6rld");
  EXPECT_EQ(m.get_str("test.str_empty"), "");
  EXPECT_EQ(m.get_str_array("test.arr_str"), (std::vector<std::string>{"a", "", "\u00df\u2713", "merge x"}));
  EXPECT_EQ(m.get_i32_array("test.arr_i32"), (std::vector<int32_t>{-1, 2, INT32_MAX, INT32_MIN}));
  EXPECT_EQ(m.get_i32_array("test.arr_u8"), (std::vector<int32_t>{0, 1, 255}));
  EXPECT_EQ(m.get_f32_array("test.arr_f32"), (std::vector<float>{0.5f, -1.25f, 1e-8f, 3.4e38f}));
  EXPECT_EQ(m.opt_u32("no.such.key"), std::nullopt);
  EXPECT_EQ(m.opt_str_array("no.such.key"), std::nullopt);
  EXPECT_EQ(m.opt_i32("test.i32"), -2000000000);
  EXPECT_EQ(format_value(*m.find("test.nested_i32")), "[[1, 2, 3], [-4]]");
  EXPECT_EQ(format_value(*m.find("test.nested_deep")), "[[[1], [2, 3]], [[4]]]");
  EXPECT_EQ(format_value(*m.find("test.arr_str"), 2), "[\"a\", \"\", ... (4 total)]");

  expect_error([&] { m.get_u32("no.such.key"); }, {path, "'no.such.key'", "not found"});
  expect_error([&] { m.get_i32("test.u32"); }, {path, "'test.u32'", "4000000000", "does not fit in int32"});
  expect_error([&] { m.get_i64("test.u64"); }, {"'test.u64'", "18446744073709551615", "int64"});
  expect_error([&] { m.get_u64("test.i8"); }, {"'test.i8'", "-100", "uint64"});
  expect_error([&] { m.get_str("test.u32"); }, {path, "'test.u32'", "is UINT32", "expected STRING"});
  expect_error([&] { m.get_u32("test.f32"); }, {"'test.f32'", "is FLOAT32", "expected an integer"});
  expect_error([&] { m.opt_u32("test.str"); }, {"'test.str'", "is STRING"});
  expect_error([&] { m.get_f32("test.arr_f64"); }, {"'test.arr_f64'", "ARRAY of FLOAT64", "expected a float"});
  expect_error([&] { m.get_f32_array("test.arr_f64"); }, {"'test.arr_f64'[1]", "-1e+300", "float32"});
  expect_error([&] { m.get_i32_array("test.arr_u32"); }, {"'test.arr_u32'[2]", "4000000000", "int32"});
  expect_error([&] { m.get_str_array("test.nested_str"); }, {"'test.nested_str'", "ARRAY of ARRAY",
                                                             "expected ARRAY of STRING"});
  expect_error([&] { m.get_bool("test.u8"); }, {"'test.u8'", "UINT8", "expected BOOL"});
}

TEST(GgufFixture, TensorsMatchGgufPysReader) {
  const auto f = all_types();
  expect_tensors(ptrs(*f), golden()["files"]["all_types.gguf"]["tensors"]);
  for (const GgufTensor& t : f->tensors()) {
    EXPECT_EQ(f->find(t.name), &t);
    EXPECT_EQ(t.data, static_cast<const uint8_t*>(f->tensors().front().data) - f->tensors().front().offset + t.offset);
    EXPECT_EQ(t.offset % f->alignment(), 0u);
    EXPECT_EQ(t.file, f.get());
  }
  EXPECT_EQ(f->find("missing"), nullptr);
  expect_error([&] { f->tensor("missing.weight"); }, {"all_types.gguf", "'missing.weight'"});
  const GgufTensor& q6 = f->tensor("q6_k.weight");
  EXPECT_EQ(q6.torch_shape(), (moe::Shape{2, 2, 256}));
  EXPECT_EQ(q6.n_rows(), 4);
  EXPECT_EQ(q6.row_bytes(), 210u);
  EXPECT_EQ(q6.describe(), "'q6_k.weight' Q6_K ne=[256, 2, 2]");
}

TEST(GgufFixture, DequantisationEqualsGgufPyBitForBit) {
  const auto f = all_types();
  std::map<std::string, int> covered;
  for (const json& w : golden()["files"]["all_types.gguf"]["tensors"]) {
    if (!w["supported"].get<bool>()) continue;
    expect_dequant(f->tensor(w["name"].get<std::string>()), w);
    covered[w["type"].get<std::string>()]++;
  }
  EXPECT_EQ(covered.size(), 11u) << "every supported type has a tensor in the fixture";
}

TEST(GgufFixture, DecompositionReproducesDequantisationExactly) {
  const auto f = all_types();
  DecomposeStats stats;
  int types = 0;
  for (const GgufTensor& t : f->tensors()) {
    if (!ggml_type_supported(t.type) || !group_layout(t.type)) continue;
    ++types;
    expect_exact_decomposition(t.type, t.data, t.ne[0], t.n_rows(), &stats);
    // Through the tensor's own accessor too (names the tensor on errors).
    const GroupLayout g = *group_layout(t.type);
    std::vector<uint8_t> q(t.ne[0]);
    std::vector<float> s(t.ne[0] / g.group_size), o(s.size());
    t.decompose_row(t.n_rows() - 1, RowGroups{q.data(), s.data(), o.data()});
  }
  EXPECT_EQ(types, 8);
  // The fixtures put a zero weight into Q4_0 / Q5_0 / Q8_0 blocks quantised with a negative d.
  EXPECT_GT(stats.signed_zeros, 0);
}

// Random blocks of every integer type: every bit pattern of codes and scales, random
// finite f16 d (including subnormals, zero, negative and the largest), so that every
// code meets every kind of scale far more often than in the fixture.
TEST(GgufDecompose, RandomBlocksOfEveryTypeAreExact) {
  std::mt19937_64 rng(7);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const GgmlTypeInfo& info = ggml_type_info(t);
    const int64_t blocks = 512;
    std::vector<uint8_t> raw(blocks * info.block_bytes);
    for (auto& b : raw) b = static_cast<uint8_t>(rng());
    // The f16 fields: the first 2 (Q4_0, Q5_0, Q8_0) or 4 bytes, Q6_K's last 2.
    const bool two = t == GgmlType::Q4_0 || t == GgmlType::Q5_0 || t == GgmlType::Q8_0;
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* blk = raw.data() + b * info.block_bytes;
      uint8_t* halves = t == GgmlType::Q6_K ? blk + info.block_bytes - 2 : blk;
      for (int h = 0; h < (two || t == GgmlType::Q6_K ? 1 : 2); ++h) {
        uint16_t v = static_cast<uint16_t>(rng());
        if (((v >> 10) & 0x1f) == 0x1f) v &= 0xbfff;  // inf / NaN -> finite
        const uint16_t edges[] = {0x0001, 0x8001, 0x0000, 0x8000, 0x7bff, 0xfbff};  // subnormals, zeros, max
        if (b < 6) v = edges[b];
        halves[2 * h] = static_cast<uint8_t>(v);
        halves[2 * h + 1] = static_cast<uint8_t>(v >> 8);
      }
    }
    DecomposeStats stats;
    const int64_t row = 4 * info.block_size;
    expect_exact_decomposition(t, raw.data(), row, blocks * info.block_size / row, &stats);
    EXPECT_EQ(stats.weights, blocks * info.block_size);
    if (symmetric(t)) {
      EXPECT_GT(stats.signed_zeros, 0) << ggml_type_name(t);
    } else {
      EXPECT_EQ(stats.signed_zeros, 0) << ggml_type_name(t);
    }
  }
}

TEST(GgufFixture, UnsupportedTypesAreListedButNotRead) {
  const auto f = all_types();
  std::vector<float> row(256);
  const std::string supported = "supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";
  expect_error([&] { f->tensor("q2_k.weight").dequantize_row(0, row.data()); },
               {"all_types.gguf", "'q2_k.weight'", "Q2_K", supported});
  expect_error([&] { f->tensor("i32.ids").dequantize_row(0, row.data()); }, {"'i32.ids'", "type I32", supported});
  expect_error([&] { f->tensor("f32.weight").dequantize_row(3, row.data()); }, {"'f32.weight'", "row 3 out of range"});
  std::vector<uint8_t> q(256);
  std::vector<float> s(16), o(16);
  expect_error([&] { f->tensor("f32.weight").decompose_row(0, RowGroups{q.data(), s.data(), o.data()}); },
               {"'f32.weight'", "no integer codes"});
  EXPECT_FALSE(group_layout(GgmlType::BF16).has_value());
  EXPECT_EQ(group_layout(GgmlType::Q6_K)->group_size, 16);
  EXPECT_EQ(group_layout(GgmlType::Q6_K)->bits, 6);
  EXPECT_EQ(group_layout(GgmlType::Q8_0)->bits, 8);
  expect_error([&] { dequantize_row(GgmlType::Q4_K, q.data(), row.data(), 100); }, {"100", "block size 256"});
}

TEST(GgufFixture, CustomAlignment) {
  const auto f = GgufFile::open(dir() + "/aligned64.gguf");
  const json& w = golden()["files"]["aligned64.gguf"];
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->metadata().get_u32("general.alignment"), 64u);
  EXPECT_EQ(f->data_start() % 64, 0u);
  expect_tensors(ptrs(*f), w["tensors"]);
  for (const json& t : w["tensors"]) expect_dequant(f->tensor(t["name"].get<std::string>()), t);
}

TEST(GgufSplit, OpensEveryPartAsOneModel) {
  const json& g = golden()["split"];
  const GgufModel m = GgufModel::open(dir() + "/" + g["first"].get<std::string>());
  ASSERT_EQ(m.parts().size(), 2u);
  EXPECT_EQ(m.n_tensors(), 3u);
  EXPECT_EQ(m.metadata().get_str("general.name"), "split fixture");
  EXPECT_EQ(m.metadata().get_u32("test.u32"), 7u);
  expect_tensors(m.tensors(), g["tensors"]);
  for (const json& t : g["tensors"]) {
    const std::string name = t["name"].get<std::string>();
    const GgufTensor& x = m.tensor(name);
    EXPECT_EQ(x.file, m.parts()[g["part_of"][name].get<size_t>()].get()) << name;
    expect_dequant(x, t);
  }
  expect_error([&] { m.tensor("nope"); }, {"model-00001-of-00002.gguf", "'nope'"});

  const GgufModel single = GgufModel::open(dir() + "/all_types.gguf");
  EXPECT_EQ(single.parts().size(), 1u);
  EXPECT_EQ(single.n_tensors(), all_types()->tensors().size());
}

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/moe_gguf_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST(GgufSplit, MissingOrMismatchedPartsAreErrorsNamingThem) {
  const std::string part1 = dir() + "/split/model-00001-of-00002.gguf";
  const std::string part2 = dir() + "/split/model-00002-of-00002.gguf";
  TempDir d;
  const std::string first = d.path + "/m-00001-of-00002.gguf", second = d.path + "/m-00002-of-00002.gguf";
  fs::copy_file(part1, first);
  expect_error([&] { GgufModel::open(first); }, {"part 2 of 2", second, "missing"});

  fs::copy_file(part2, second);
  EXPECT_EQ(GgufModel::open(first).n_tensors(), 3u);
  expect_error([&] { GgufModel::open(second); }, {"part 2 of 2", "open the first part", first});

  // A copy of part 1 in the place of part 2: its split.no says 0.
  fs::remove(second);
  fs::copy_file(part1, second);
  expect_error([&] { GgufModel::open(first); }, {second, "split.no 0", "expected 1 of 2"});

  // A split model under a name that does not say where the other parts are.
  const std::string odd = d.path + "/model.gguf";
  fs::copy_file(part1, odd);
  expect_error([&] { GgufModel::open(odd); }, {odd, "split.count is 2", "-00001-of-00002.gguf"});
  EXPECT_EQ(split_path("/x/y-00003-of-00007.gguf", 5, 7), "/x/y-00005-of-00007.gguf");
}
