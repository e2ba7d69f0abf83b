// Hostile GGUF files, built here byte by byte: each must fail with a moe::Error that
// names the file, the key or tensor, and what was expected (never a crash, never a huge
// allocation). Plus every truncation of a real file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "loader/gguf/gguf_file.h"

using namespace moe::gguf;

namespace {

const std::string kPath = "hostile.gguf";

std::string le(uint64_t v, int n) {
  std::string s(static_cast<size_t>(n), '\0');
  for (int i = 0; i < n; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::string gstr(const std::string& s) { return le(s.size(), 8) + s; }
std::string type(ValueType t) { return le(static_cast<uint32_t>(t), 4); }

// Key-value pairs.
std::string kv(const std::string& key, ValueType t, const std::string& payload) {
  return gstr(key) + type(t) + payload;
}
std::string kv_u32(const std::string& key, uint32_t v) { return kv(key, ValueType::U32, le(v, 4)); }
std::string kv_str(const std::string& key, const std::string& v) { return kv(key, ValueType::String, gstr(v)); }
// An array value's payload: element type, count, elements.
std::string arr(ValueType elem, uint64_t count, const std::string& elems) { return type(elem) + le(count, 8) + elems; }

// A tensor info.
std::string tinfo(const std::string& name, const std::vector<uint64_t>& ne, uint32_t ggml_type, uint64_t offset) {
  std::string s = gstr(name) + le(ne.size(), 4);
  for (uint64_t d : ne) s += le(d, 8);
  return s + le(ggml_type, 4) + le(offset, 8);
}

struct Spec {
  uint32_t version = 3;
  std::vector<std::string> kvs;
  std::vector<std::string> infos;
  uint32_t alignment = 32;  // only pads the data section; add general.alignment to kvs to declare it
  std::string data;
};

std::string build(const Spec& s) {
  std::string f = "GGUF" + le(s.version, 4) + le(s.infos.size(), 8) + le(s.kvs.size(), 8);
  for (const auto& k : s.kvs) f += k;
  for (const auto& t : s.infos) f += t;
  if (!s.data.empty()) f.append((s.alignment - f.size() % s.alignment) % s.alignment, '\0');
  return f + s.data;
}

// Parses `bytes` from an exact-size heap copy (ASan sees any overread).
std::shared_ptr<GgufFile> parse(const std::string& bytes) {
  std::shared_ptr<void> buf(std::malloc(bytes.empty() ? 1 : bytes.size()), std::free);
  if (!bytes.empty()) std::memcpy(buf.get(), bytes.data(), bytes.size());
  return GgufFile::from_bytes(buf, bytes.size(), kPath);
}

void expect_fail(const std::string& bytes, std::initializer_list<std::string> words) {
  try {
    parse(bytes);
    ADD_FAILURE() << "parsed; expected an error containing '" << *words.begin() << "'";
  } catch (const moe::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'" + kPath + "'"), std::string::npos) << "does not name the file: " << msg;
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "message: " << msg << "\nmissing: " << w;
  }
}

// A valid one-tensor file around `info` and `data`, for the tensor cases.
Spec one_tensor(const std::string& info, size_t data_bytes) {
  Spec s;
  s.kvs = {kv_str("general.architecture", "llama")};
  s.infos = {info};
  s.data = std::string(data_bytes, '\x11');
  return s;
}

}  // namespace

TEST(GgufHostile, TheBuilderMakesValidFiles) {
  Spec s = one_tensor(tinfo("w", {32, 2}, 8 /*Q8_0*/, 0), 68);
  s.infos.push_back(tinfo("v", {4}, 0 /*F32*/, 96));
  s.data.resize(96 + 16, '\0');
  const auto f = parse(build(s));
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensor("w").nbytes, 68u);
  EXPECT_EQ(f->tensor("v").offset, f->data_start() + 96);
  EXPECT_EQ(parse(build(Spec{}))->tensors().size(), 0u);
}

TEST(GgufHostile, EveryTruncationOfARealFileFailsCleanly) {
  std::ifstream in(std::string(MOE_FIXTURES_DIR) + "/gguf/all_types.gguf", std::ios::binary);
  const std::string whole((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(whole.size(), 1000u);
  // The padding after the last tensor's data is not needed (llama.cpp does not read
  // it either): prefixes that keep every tensor's bytes are valid files.
  uint64_t data_end = 0;
  const auto f = parse(whole);
  for (const GgufTensor& t : f->tensors()) data_end = std::max(data_end, t.offset + t.nbytes);
  ASSERT_LT(data_end, whole.size());
  for (size_t n = 0; n < whole.size(); ++n) {
    SCOPED_TRACE(n);
    try {
      parse(whole.substr(0, n));
      EXPECT_GE(n, data_end) << "a prefix of " << n << " bytes parsed";
    } catch (const moe::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(kPath), std::string::npos) << msg;
      EXPECT_TRUE(msg.find("truncated") != std::string::npos || msg.find("past the end") != std::string::npos)
          << msg;
    }
  }
  expect_fail("", {"truncated", "the file is 0 bytes"});
}

TEST(GgufHostile, HeaderErrors) {
  std::string bad = build(Spec{});
  bad[3] = 'L';
  expect_fail(bad, {"bad magic", "47 47 55 4c", "expected 'GGUF'"});
  Spec v1;
  v1.version = 1;
  expect_fail(build(v1), {"unsupported version 1", "expected 2 or 3"});
  Spec v4;
  v4.version = 4;
  expect_fail(build(v4), {"unsupported version 4"});
  Spec big;
  big.version = 0x03000000;  // version 3 written big-endian
  expect_fail(build(big), {"big-endian"});
  Spec v2;
  v2.version = 2;
  EXPECT_EQ(parse(build(v2))->version(), 2u);

  // Counts that cannot fit in the file fail before anything is sized from them.
  std::string many_kv = build(Spec{});
  many_kv.replace(16, 8, le(1ull << 60, 8));
  expect_fail(many_kv, {"1152921504606846976 metadata key-value pairs", "bytes are left"});
  std::string many_t = build(Spec{});
  many_t.replace(8, 8, le(1ull << 40, 8));
  expect_fail(many_t, {"1099511627776 tensors"});
}

TEST(GgufHostile, MetadataErrors) {
  auto with = [](std::vector<std::string> kvs) {
    Spec s;
    s.kvs = std::move(kvs);
    return build(s);
  };
  const uint64_t huge = 1ull << 40;
  // Arrays claiming 2^40 elements: compared with what is left, never allocated. Each
  // must fail at once (a reserve of 2^40 strings would take minutes and terabytes).
  const auto t0 = std::chrono::steady_clock::now();
  for (ValueType elem : {ValueType::U8, ValueType::U64, ValueType::String, ValueType::Array})
    expect_fail(with({kv("tokenizer.ggml.tokens", ValueType::Array, arr(elem, huge, "abcd"))}),
                {"key 'tokenizer.ggml.tokens'", "array of 1099511627776 " + value_type_name(elem), "bytes are left"});
  expect_fail(with({kv("nested", ValueType::Array, arr(ValueType::Array, 1, arr(ValueType::String, huge, "")))}),
              {"key 'nested'", "1099511627776 STRING"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));

  expect_fail(with({kv("name", ValueType::String, le(1ull << 62, 8) + "abc")}),
              {"key 'name'", "claims 4611686018427387904 bytes", "past the end"});
  expect_fail(with({le(1ull << 50, 8) + "k" + std::string(40, 'x')}), {"key #0", "claims 1125899906842624 bytes"});
  expect_fail(with({kv_u32("a", 1), kv_u32("b", 2), kv_u32("a", 3)}), {"key 'a' appears twice"});
  expect_fail(with({kv("t", static_cast<ValueType>(13), le(0, 4))}), {"value type of key 't'", "is 13", "0..12"});
  expect_fail(with({kv("t", ValueType::Array, arr(static_cast<ValueType>(99), 0, ""))}),
              {"array element type of key 't'", "is 99"});
  expect_fail(with({kv("t", ValueType::U64, le(1, 4))}), {"truncated", "value of key 't'", "needs 8 bytes"});

  // Nesting: 8 levels are fine, 9 are not.
  auto nest = [](int depth) {
    std::string v = arr(ValueType::U8, 1, "x");
    for (int i = 1; i < depth; ++i) v = arr(ValueType::Array, 1, v);
    return kv("deep", ValueType::Array, v);
  };
  EXPECT_EQ(format_value(*parse(with({nest(kMaxArrayDepth)}))->metadata().find("deep")), "[[[[[[[[120]]]]]]]]");
  expect_fail(with({nest(kMaxArrayDepth + 1)}), {"key 'deep'", "nested more than 8 deep"});

  // general.alignment: an integer power of two.
  expect_fail(with({kv_u32("general.alignment", 48)}), {"'general.alignment' is 48", "power of two"});
  expect_fail(with({kv_u32("general.alignment", 0)}), {"'general.alignment' is 0", "power of two"});
  expect_fail(with({kv_str("general.alignment", "32")}), {"'general.alignment' is STRING", "expected an integer"});
}

TEST(GgufHostile, TensorInfoErrors) {
  auto t = [](const std::string& info, size_t data = 64) { return build(one_tensor(info, data)); };
  expect_fail(t(tinfo("w", {}, 0, 0)), {"tensor 'w'", "n_dims 0", "expected 1 to 4"});
  expect_fail(t(tinfo("w", {1, 1, 1, 1, 1}, 0, 0)), {"tensor 'w'", "n_dims 5"});
  expect_fail(t(tinfo("w", {4, 0}, 0, 0)), {"tensor 'w'", "ne[1] = 0", "expected a dimension >= 1"});
  expect_fail(t(tinfo("w", {1ull << 63}, 0, 0)), {"tensor 'w'", "ne[0] = 9223372036854775808"});
  expect_fail(t(tinfo("w", {1ull << 32, 1ull << 32}, 0, 0)), {"tensor 'w'", "element count overflows int64"});
  expect_fail(t(tinfo("w", {1ull << 62}, 28 /*F64*/, 0)), {"tensor 'w'", "F64", "byte size overflows"});
  expect_fail(t(tinfo("w", {32}, 99, 0)), {"tensor 'w'", "unknown ggml type id 99", "Q4_K (12)"});
  expect_fail(t(tinfo("w", {32}, 4, 0)), {"tensor 'w'", "unknown ggml type id 4"});  // retired Q4_2
  expect_fail(t(tinfo("w", {100, 2}, 12 /*Q4_K*/, 0)), {"tensor 'w' (Q4_K)", "ne[0] = 100",
                                                         "not a multiple of the Q4_K block size 256"});
  expect_fail(t(tinfo("w", {48}, 8 /*Q8_0*/, 0)), {"tensor 'w' (Q8_0)", "ne[0] = 48", "block size 32"});
  // A name running past the end.
  Spec s;
  s.infos = {le(1000, 8) + "w" + std::string(40, 'x')};
  expect_fail(build(s), {"tensor #0", "claims 1000 bytes"});
}

TEST(GgufHostile, TensorDataErrors) {
  auto t = [](const std::string& info, size_t data) { return build(one_tensor(info, data)); };
  // 16 F32 = 64 bytes, but only 60 in the file.
  expect_fail(t(tinfo("blk.0.w", {16}, 0, 0), 60), {"tensor 'blk.0.w'", "F32", "64 bytes", "runs past the end"});
  expect_fail(t(tinfo("w", {4}, 0, 1ull << 62), 64), {"tensor 'w'", "data offset 4611686018427387904",
                                                       "runs past the end"});
  expect_fail(t(tinfo("w", {4}, 0, UINT64_MAX - 31), 64), {"tensor 'w'", "runs past the end"});
  expect_fail(t(tinfo("w", {4}, 0, 16), 64), {"tensor 'w'", "data offset 16", "multiple of the alignment 32"});
  {
    Spec s = one_tensor(tinfo("w", {4}, 0, 64), 128);
    s.kvs.push_back(kv_u32("general.alignment", 128));
    expect_fail(build(s), {"tensor 'w'", "data offset 64", "multiple of the alignment 128"});
  }
  {
    Spec s = one_tensor(tinfo("a", {16}, 0, 0), 128);
    s.infos.push_back(tinfo("b", {8}, 0, 32));  // inside a's 64 bytes
    expect_fail(build(s), {"tensors 'a'", "and 'b'", "overlap"});
    s.infos.back() = tinfo("a", {8}, 0, 64);
    expect_fail(build(s), {"tensor 'a' appears twice"});
    s.infos.back() = tinfo("b", {8}, 0, 64);  // right after a: fine
    EXPECT_EQ(parse(build(s))->tensors().size(), 2u);
  }
  {
    // The tensor infos end, then the file ends before the padded data section starts.
    Spec s;
    s.infos = {tinfo("w", {1}, 0, 0)};
    expect_fail(build(s), {"data section starts at offset", "past the end of the file"});
  }
}

TEST(GgufHostile, OpenNamesTheFile) {
  char tmpl[] = "/tmp/moe_gguf_hostile_XXXXXX";
  const int fd = ::mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  ::close(fd);
  try {
    GgufFile::open(tmpl);
    ADD_FAILURE() << "an empty file parsed";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find(tmpl), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::remove(tmpl);
  try {
    GgufFile::open("/nonexistent/dir/model.gguf");
    ADD_FAILURE() << "a missing file opened";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.gguf"), std::string::npos) << e.what();
  }
}
