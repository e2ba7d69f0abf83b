// safetensors reader/writer and Checkpoint directory tests, including hostile files.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"
#include "loader/checkpoint.h"
#include "loader/safetensors.h"

namespace fs = std::filesystem;
using moe::DType;
using moe::Tensor;

namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/moe_st_test_XXXXXX";
    char* p = ::mkdtemp(tmpl);
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A raw safetensors file: header text as given, then `data_bytes` zero bytes.
std::string raw_file(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

// Expects open() to throw moe::Error whose message contains `word`.
void expect_open_error(const std::string& path, const std::string& word) {
  try {
    moe::SafetensorsFile::open(path);
    ADD_FAILURE() << "opening " << path << " did not throw; expected an error containing '"
                  << word << "'";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find(word), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << word;
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos)
        << "message does not name the file: " << e.what();
  }
}

void expect_header_error(const TempDir& d, const std::string& header, size_t data_bytes,
                         const std::string& word) {
  const std::string p = d.file("hostile.safetensors");
  write_bytes(p, raw_file(header, data_bytes));
  SCOPED_TRACE(header.substr(0, 200));
  expect_open_error(p, word);
}

template <class F>
void expect_error(F&& f, std::initializer_list<std::string> words) {
  try {
    f();
    ADD_FAILURE() << "did not throw";
  } catch (const moe::Error& e) {
    for (const auto& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "message: " << e.what() << "\nexpected to contain: " << w;
  }
}

Tensor patterned(const moe::Shape& shape, DType dt, int seed) {
  Tensor t = Tensor::empty(shape, dt);
  auto* b = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<unsigned char>(i * 31 + seed * 7 + 1);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Round trips

TEST(Safetensors, RoundTripEveryDType) {
  TempDir d;
  const DType all[] = {DType::F64, DType::F32,  DType::F16, DType::BF16,   DType::I64,   DType::I32,
                       DType::I16, DType::I8,   DType::U8,  DType::Bool,   DType::F8E4M3, DType::F8E5M2};
  std::vector<std::pair<std::string, Tensor>> ts;
  int seed = 0;
  for (DType dt : all) {
    ts.emplace_back(std::string("t.") + moe::safetensors_dtype_name(dt), patterned({3, 5}, dt, seed++));
  }
  ts.emplace_back("scalar", patterned({}, DType::F32, 99));
  ts.emplace_back("odd", patterned({7}, DType::U8, 3));  // leaves following tensors unaligned
  ts.emplace_back("after_odd", patterned({2, 2}, DType::F32, 4));
  const std::string p = d.file("rt.safetensors");
  moe::write_safetensors(p, ts, {{"format", "pt"}, {"note", "hello"}});
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  auto f = moe::SafetensorsFile::open(p);
  EXPECT_EQ(f->path(), p);
  EXPECT_EQ(f->header_bytes() % 8, 0u);
  EXPECT_EQ(f->file_size(), fs::file_size(p));
  ASSERT_EQ(f->tensors().size(), ts.size());
  uint64_t total = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& [name, t] = ts[i];
    SCOPED_TRACE(name);
    // tensors() is in file order, which is the order written.
    EXPECT_EQ(f->tensors()[i].name, name);
    const moe::TensorInfo* info = f->find(name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, t.dtype());
    EXPECT_EQ(info->shape, t.shape());
    EXPECT_EQ(info->nbytes, t.nbytes());
    EXPECT_EQ(info->offset, 8 + f->header_bytes() + total);
    total += t.nbytes();
    Tensor v = f->view(name);
    EXPECT_EQ(v.dtype(), t.dtype());
    EXPECT_EQ(v.shape(), t.shape());
    EXPECT_TRUE(same_bytes(v, t));
  }
  EXPECT_EQ(f->file_size(), 8 + f->header_bytes() + total);
  EXPECT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "hello");
  EXPECT_EQ(f->find("nope"), nullptr);
}

TEST(Safetensors, FloatValuesSurviveAndConvert) {
  TempDir d;
  Tensor a = Tensor::empty({4}, DType::F32);
  const float vals[] = {1.5f, -2.25f, 0.0f, 1e-3f};
  std::memcpy(a.raw(), vals, sizeof vals);
  Tensor b = a.to(DType::BF16);
  const std::string p = d.file("f.safetensors");
  moe::write_safetensors(p, {{"a", a}, {"b", b}});
  auto f = moe::SafetensorsFile::open(p);
  Tensor va = f->view("a");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(va.data<float>()[i], vals[i]);
  Tensor vb = f->view("b").to(DType::F32);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(vb.data<float>()[i], moe::round_bf16(vals[i]));
}

TEST(Safetensors, ZeroSizeTensors) {
  TempDir d;
  const std::string p = d.file("z.safetensors");
  moe::write_safetensors(p, {{"empty", Tensor::empty({0, 5}, DType::BF16)},
                             {"x", patterned({2}, DType::F32, 1)},
                             {"empty2", Tensor::empty({5, 0}, DType::I64)}});
  auto f = moe::SafetensorsFile::open(p);
  Tensor e = f->view("empty");
  EXPECT_EQ(e.shape(), (moe::Shape{0, 5}));
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(f->view("empty2").shape(), (moe::Shape{5, 0}));
  EXPECT_EQ(f->find("empty")->nbytes, 0u);
  EXPECT_EQ(f->view("x").nbytes(), 8u);
  EXPECT_TRUE(f->metadata().empty());
}

TEST(Safetensors, EmptyFileHasNoTensors) {
  TempDir d;
  const std::string p = d.file("none.safetensors");
  moe::write_safetensors(p, {}, {{"k", "v"}});
  auto f = moe::SafetensorsFile::open(p);
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->metadata().at("k"), "v");
}

TEST(Safetensors, ViewKeepsMappingAliveAndCountsBytesOnce) {
  TempDir d;
  const std::string p = d.file("k.safetensors");
  Tensor a = patterned({16, 4}, DType::F32, 1);
  Tensor b = patterned({8}, DType::BF16, 2);
  moe::write_safetensors(p, {{"a", a}, {"b", b}, {"c", patterned({100}, DType::U8, 3)}});
  Tensor va;
  {
    auto f = moe::SafetensorsFile::open(p);
    EXPECT_EQ(f->bytes_touched(), 0u);
    va = f->view("a");
    EXPECT_EQ(f->bytes_touched(), a.nbytes());
    f->view("a");  // counted once
    EXPECT_EQ(f->bytes_touched(), a.nbytes());
    f->view("b");
    EXPECT_EQ(f->bytes_touched(), a.nbytes() + b.nbytes());
    expect_error([&] { f->view("missing"); }, {"missing", p});
  }
  // The file object is gone; the view still reads the mapping.
  EXPECT_TRUE(same_bytes(va, a));
}

TEST(Safetensors, WriterIsAtomicAndRejectsBadInput) {
  TempDir d;
  const std::string p = d.file("w.safetensors");
  Tensor a = patterned({4}, DType::F32, 1);
  moe::write_safetensors(p, {{"a", a}});
  const auto size_before = fs::file_size(p);
  expect_error([&] { moe::write_safetensors(p, {{"a", a}, {"a", a}}); }, {"'a'", "twice"});
  expect_error([&] { moe::write_safetensors(p, {{"__metadata__", a}}); }, {"__metadata__"});
  expect_error([&] { moe::write_safetensors(p, {{"u", Tensor()}}); }, {"undefined"});
  expect_error([&] { moe::write_safetensors(d.file("no/such/dir/x.safetensors"), {{"a", a}}); },
               {"cannot create"});
  // The earlier file is intact and no temporary is left over.
  EXPECT_EQ(fs::file_size(p), size_before);
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_TRUE(same_bytes(moe::SafetensorsFile::open(p)->view("a"), a));
}

TEST(Safetensors, ReadsHandWrittenHeader) {
  // Written byte by byte as another implementation would: keys in any order, spaces.
  TempDir d;
  const std::string hdr =
      R"({"__metadata__":{"format":"pt"},"w":{"shape":[2],"dtype":"F32","data_offsets":[0,8]}})";
  std::string file = le64(hdr.size()) + hdr;
  const float v[2] = {3.0f, -1.0f};
  file.append(reinterpret_cast<const char*>(v), 8);
  const std::string p = d.file("h.safetensors");
  write_bytes(p, file);
  auto f = moe::SafetensorsFile::open(p);
  EXPECT_EQ(f->header_bytes(), hdr.size());
  // The header is not padded, so the data is not 4-byte aligned: copy before typed reads.
  Tensor w = f->view("w").clone();
  EXPECT_EQ(w.data<float>()[0], 3.0f);
  EXPECT_EQ(w.data<float>()[1], -1.0f);
}

// ---------------------------------------------------------------------------------------
// Hostile files

TEST(SafetensorsHostile, TooShort) {
  TempDir d;
  write_bytes(d.file("e"), "");
  expect_open_error(d.file("e"), "at least 8");
  write_bytes(d.file("s"), std::string("\x10\0\0\0\0", 5));
  expect_open_error(d.file("s"), "at least 8");
}

TEST(SafetensorsHostile, HeaderLengthPastEof) {
  TempDir d;
  write_bytes(d.file("p"), le64(100) + "{}");
  expect_open_error(d.file("p"), "past the end of the file");
}

TEST(SafetensorsHostile, HugeHeaderLength) {
  TempDir d;
  write_bytes(d.file("h"), le64(uint64_t(1) << 63) + "{}      ");
  expect_open_error(d.file("h"), "cap");
  write_bytes(d.file("m"), le64(~uint64_t(0)) + "{}      ");
  expect_open_error(d.file("m"), "cap");
  write_bytes(d.file("c"), le64(moe::kSafetensorsMaxHeader + 1) + "{}      ");
  expect_open_error(d.file("c"), "cap");
}

TEST(SafetensorsHostile, InvalidJson) {
  TempDir d;
  expect_header_error(d, R"({"a": {"dtype": "F32", )", 0, "not valid JSON");
  expect_header_error(d, "{\"\xff\xfe\": 1}", 0, "not valid JSON");  // bad UTF-8
  expect_header_error(d, std::string("{}\0\0\0\0\0\0", 8), 0, "not valid JSON");
}

TEST(SafetensorsHostile, HeaderNotAnObject) {
  TempDir d;
  expect_header_error(d, "[1, 2, 3]", 0, "expected a JSON object");
  expect_header_error(d, "\"text\"", 0, "expected a JSON object");
  expect_header_error(d, "42      ", 0, "expected a JSON object");
}

TEST(SafetensorsHostile, EntryNotAnObjectOrMissingFields) {
  TempDir d;
  expect_header_error(d, R"({"bad_entry": [1, 2]})", 0, "bad_entry");
  expect_header_error(d, R"({"nodt": {"shape": [1], "data_offsets": [0, 4]}})", 4, "'dtype'");
  expect_header_error(d, R"({"nosh": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, "'shape'");
  expect_header_error(d, R"({"noof": {"dtype": "F32", "shape": [1]}})", 4, "'data_offsets'");
  expect_header_error(d, R"({"numdt": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", 4,
                      "numdt");
}

TEST(SafetensorsHostile, UnknownDType) {
  TempDir d;
  expect_header_error(d, R"({"weird": {"dtype": "F7", "shape": [1], "data_offsets": [0, 4]}})", 4,
                      "unknown dtype 'F7'");
  expect_header_error(d, R"({"weird": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}})", 4,
                      "weird");
}

TEST(SafetensorsHostile, ShapeBytesMismatch) {
  TempDir d;
  expect_header_error(d, R"({"mism": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})",
                      24, "mism");
  expect_header_error(d, R"({"mism": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}})",
                      16, "needs 8 bytes");
}

TEST(SafetensorsHostile, OverlappingRanges) {
  TempDir d;
  expect_header_error(d,
                      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                      R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                      12, "overlap");
  expect_header_error(d,
                      R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},)"
                      R"( "b": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})",
                      8, "overlap");
}

TEST(SafetensorsHostile, RangePastEof) {
  TempDir d;
  expect_header_error(d, R"({"far": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 12,
                      "past the end of the data area");
  expect_header_error(
      d, R"({"far": {"dtype": "U8", "shape": [4], "data_offsets": [18446744073709551612, 18446744073709551615]}})",
      0, "far");
}

TEST(SafetensorsHostile, NegativeNumbers) {
  TempDir d;
  expect_header_error(d, R"({"neg": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
                      "non-negative");
  expect_header_error(d, R"({"neg": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4,
                      "data_offsets");
  expect_header_error(d, R"({"neg": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8,
                      "begin > end");
}

TEST(SafetensorsHostile, NonIntegers) {
  TempDir d;
  expect_header_error(d, R"({"flt": {"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}})",
                      4, "data_offsets");
  expect_header_error(d, R"({"flt": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
                      "non-negative integers");
  expect_header_error(d, R"({"flt": {"dtype": "F32", "shape": [true], "data_offsets": [0, 4]}})", 4,
                      "flt");
  expect_header_error(d, R"({"flt": {"dtype": "F32", "shape": [1e30], "data_offsets": [0, 4]}})", 4,
                      "flt");
  expect_header_error(d, R"({"flt": {"dtype": "F32", "shape": 4, "data_offsets": [0, 4]}})", 4,
                      "expected an array");
  expect_header_error(d, R"({"flt": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})",
                      8, "array of 2");
  expect_header_error(d, R"({"flt": {"dtype": "F32", "shape": [1], "data_offsets": {"a": 1}}})", 4,
                      "array of 2");
}

TEST(SafetensorsHostile, ShapeProductOverflow) {
  TempDir d;
  // 2^32 * 2^32 wraps to 0 in 64 bits, which would "match" data_offsets [0, 0].
  expect_header_error(
      d, R"({"big": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0,
      "overflow");
  // numel fits but numel * 8 bytes does not.
  expect_header_error(
      d, R"({"big": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 0]}})", 0,
      "overflow");
  expect_header_error(
      d, R"({"big": {"dtype": "U8", "shape": [18446744073709551615], "data_offsets": [0, 0]}})", 0,
      "big");
}

TEST(SafetensorsHostile, DuplicateTensorName) {
  TempDir d;
  expect_header_error(d,
                      R"({"dup": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                      R"( "dup": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})",
                      8, "twice");
}

TEST(SafetensorsHostile, BadMetadata) {
  TempDir d;
  expect_header_error(d, R"({"__metadata__": {"k": 1}})", 0, "__metadata__");
  expect_header_error(d, R"({"__metadata__": ["k"]})", 0, "__metadata__");
}

TEST(SafetensorsHostile, DeepNesting) {
  TempDir d;
  const int depth = 200000;
  // Refused during the parse, at the first level past the limit: before the header
  // is complete (the last case never is) and before anything walks it recursively.
  expect_header_error(d, std::string(depth, '[') + std::string(depth, ']'), 0, "nested more than 64 levels");
  std::string obj;
  for (int i = 0; i < depth; ++i) obj += "{\"a\":";
  obj += "1" + std::string(depth, '}');
  expect_header_error(d, obj, 0, "nested more than 64 levels");
  expect_header_error(d, std::string(depth, '['), 0, "nested more than 64 levels");
  // Inside the limit it parses, and is then refused for what it is (the message
  // renders the value briefly, core/json_brief.h).
  const std::string deep_shape = std::string(62, '[') + std::string(62, ']');
  expect_header_error(d, R"({"a": {"dtype": "F32", "shape": )" + deep_shape + R"(, "data_offsets": [0, 0]}})", 0,
                      "expected non-negative integers");
}

TEST(SafetensorsHostile, TruncationsAndByteFlipsNeverCrash) {
  TempDir d;
  const std::string good = d.file("good.safetensors");
  moe::write_safetensors(good, {{"a", patterned({3, 4}, DType::F32, 1)},
                                {"b", patterned({5}, DType::BF16, 2)},
                                {"c", patterned({0, 2}, DType::I64, 3)}},
                         {{"m", "v"}});
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string p = d.file("mut.safetensors");
  unsigned checksum = 0;  // reads every viewed byte so a bad range would fault here
  auto try_open = [&](const std::string& content) {
    write_bytes(p, content);
    try {
      auto f = moe::SafetensorsFile::open(p);
      for (const auto& t : f->tensors()) {
        Tensor v = f->view(t.name);
        unsigned sum = 0;
        for (size_t i = 0; i < v.nbytes(); ++i) sum += static_cast<const unsigned char*>(v.raw())[i];
        checksum += sum;
      }
    } catch (const moe::Error&) {
    }
  };
  // Every truncation short of the full file fails (the data area is too short or the
  // header is cut); none crashes.
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_bytes(p, bytes.substr(0, n));
    EXPECT_THROW(moe::SafetensorsFile::open(p), moe::Error) << "truncated to " << n;
  }
  std::mt19937 rng(1234);
  const size_t header_end = 8 + moe::SafetensorsFile::open(good)->header_bytes();
  for (int iter = 0; iter < 2000; ++iter) {
    std::string m = bytes;
    const int flips = 1 + iter % 3;
    for (int k = 0; k < flips; ++k) {
      const size_t pos = rng() % header_end;
      m[pos] = static_cast<char>(rng() & 0xff);
    }
    try_open(m);
  }
  RecordProperty("checksum", static_cast<int>(checksum));
}

// ---------------------------------------------------------------------------------------
// Checkpoint directories

namespace {

void write_config(const TempDir& d) { write_bytes(d.file("config.json"), R"({"hidden_size": 8})"); }

// Two shards and an index: shard 1 holds a, b; shard 2 holds c.
void write_sharded(const TempDir& d, const std::string& extra_index_entries = "") {
  write_config(d);
  moe::write_safetensors(d.file("model-00001-of-00002.safetensors"),
                         {{"a", patterned({4, 8}, DType::F32, 1)}, {"b", patterned({3}, DType::BF16, 2)}});
  moe::write_safetensors(d.file("model-00002-of-00002.safetensors"),
                         {{"c", patterned({16}, DType::I32, 3)}});
  write_bytes(d.file("model.safetensors.index.json"),
              R"({"metadata": {"total_size": 102}, "weight_map": {)"
              R"("a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors", )"
              R"("c": "model-00002-of-00002.safetensors")" +
                  extra_index_entries + "}}");
}

}  // namespace

TEST(Checkpoint, ShardedWithIndexIsLazy) {
  TempDir d;
  write_sharded(d);
  moe::Checkpoint ck = moe::Checkpoint::open(d.path());
  EXPECT_EQ(ck.dir(), d.path());
  EXPECT_EQ(ck.config().at("hidden_size").get<int>(), 8);
  EXPECT_EQ(ck.keys(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(ck.has("a"));
  EXPECT_FALSE(ck.has("z"));
  EXPECT_EQ(ck.shards_opened(), 0u);
  EXPECT_EQ(ck.file_of("c"), d.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(ck.shards_opened(), 0u);  // file_of does not open

  Tensor c = ck.view("c");
  EXPECT_EQ(ck.shards_opened(), 1u);
  EXPECT_TRUE(same_bytes(c, patterned({16}, DType::I32, 3)));
  EXPECT_EQ(ck.bytes_touched(), 64u);

  const moe::TensorInfo& ia = ck.info("a");  // opens shard 1 but touches no data
  EXPECT_EQ(ia.shape, (moe::Shape{4, 8}));
  EXPECT_EQ(ia.dtype, DType::F32);
  EXPECT_EQ(ck.shards_opened(), 2u);
  EXPECT_EQ(ck.bytes_touched(), 64u);

  moe::Checkpoint copy = ck;  // copies share shards and accounting
  EXPECT_TRUE(same_bytes(copy.view("b"), patterned({3}, DType::BF16, 2)));
  EXPECT_EQ(ck.bytes_touched(), 64u + 6u);
  ck.view("b");
  EXPECT_EQ(ck.bytes_touched(), 64u + 6u);

  expect_error([&] { ck.info("zz"); }, {"tensor 'zz' not found in checkpoint", d.path()});
  expect_error([&] { ck.view("zz"); }, {"zz"});
  expect_error([&] { ck.file_of("zz"); }, {"zz"});
}

TEST(Checkpoint, IndexKeyMissingFromShard) {
  TempDir d;
  write_sharded(d, R"(, "ghost": "model-00002-of-00002.safetensors")");
  moe::Checkpoint ck = moe::Checkpoint::open(d.path());
  EXPECT_TRUE(ck.has("ghost"));
  expect_error([&] { ck.view("ghost"); }, {"ghost", "model-00002-of-00002.safetensors", "missing"});
  expect_error([&] { ck.info("ghost"); }, {"ghost", "model-00002-of-00002.safetensors"});
}

TEST(Checkpoint, MissingShardFile) {
  TempDir d;
  write_sharded(d, R"(, "m": "model-00003-of-00002.safetensors")");
  expect_error([&] { moe::Checkpoint::open(d.path()); },
               {"model-00003-of-00002.safetensors", "does not exist"});
}

TEST(Checkpoint, DuplicateKeyInIndexText) {
  TempDir d;
  write_sharded(d, R"(, "a": "model-00002-of-00002.safetensors")");
  expect_error([&] { moe::Checkpoint::open(d.path()); }, {"'a'", "twice", "index.json"});
}

TEST(Checkpoint, WeightMapCannotLeaveTheDirectory) {
  for (const std::string bad : {"../model-00001-of-00002.safetensors", "..", "sub/x.safetensors",
                                "/etc/passwd", "..\\\\x.safetensors", ""}) {
    SCOPED_TRACE(bad);
    TempDir d;
    write_sharded(d, R"(, "evil": ")" + bad + "\"");
    expect_error([&] { moe::Checkpoint::open(d.path()); }, {"evil", "plain file name"});
  }
}

TEST(Checkpoint, BadIndex) {
  TempDir d;
  write_sharded(d);
  write_bytes(d.file("model.safetensors.index.json"), R"({"weight_map": {"a": 3}})");
  expect_error([&] { moe::Checkpoint::open(d.path()); }, {"'a'", "index.json"});
  write_bytes(d.file("model.safetensors.index.json"), R"({"metadata": {}})");
  expect_error([&] { moe::Checkpoint::open(d.path()); }, {"weight_map"});
  write_bytes(d.file("model.safetensors.index.json"), R"({"weight_map": )");
  expect_error([&] { moe::Checkpoint::open(d.path()); }, {"index.json", "not valid JSON"});
}

TEST(Checkpoint, CorruptShardErrorsOnAccessNamingIt) {
  TempDir d;
  write_sharded(d);
  write_bytes(d.file("model-00002-of-00002.safetensors"), "garbage");
  moe::Checkpoint ck = moe::Checkpoint::open(d.path());  // lazy: not opened yet
  EXPECT_TRUE(same_bytes(ck.view("b"), patterned({3}, DType::BF16, 2)));
  expect_error([&] { ck.view("c"); }, {"model-00002-of-00002.safetensors"});
}

TEST(Checkpoint, SingleFile) {
  TempDir d;
  write_config(d);
  moe::write_safetensors(d.file("model.safetensors"), {{"w", patterned({2, 2}, DType::F16, 5)}});
  // A stray file is ignored when model.safetensors exists.
  moe::write_safetensors(d.file("other.safetensors"), {{"w", patterned({1}, DType::F16, 5)}});
  moe::Checkpoint ck = moe::Checkpoint::open(d.path());
  EXPECT_EQ(ck.keys(), std::vector<std::string>{"w"});
  EXPECT_EQ(ck.file_of("w"), d.file("model.safetensors"));
  EXPECT_EQ(ck.bytes_touched(), 0u);
  EXPECT_TRUE(same_bytes(ck.view("w"), patterned({2, 2}, DType::F16, 5)));
  EXPECT_EQ(ck.bytes_touched(), 8u);
}

TEST(Checkpoint, GlobOfFiles) {
  TempDir d;
  write_config(d);
  moe::write_safetensors(d.file("b.safetensors"), {{"y", patterned({2}, DType::F32, 1)}});
  moe::write_safetensors(d.file("a.safetensors"), {{"x", patterned({3}, DType::F32, 2)}});
  write_bytes(d.file("notes.txt"), "not weights");
  moe::Checkpoint ck = moe::Checkpoint::open(d.path());
  EXPECT_EQ(ck.keys(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(ck.file_of("x"), d.file("a.safetensors"));
  EXPECT_EQ(ck.file_of("y"), d.file("b.safetensors"));
  EXPECT_TRUE(same_bytes(ck.view("y"), patterned({2}, DType::F32, 1)));
  EXPECT_EQ(ck.bytes_touched(), 8u);
}

TEST(Checkpoint, DuplicateKeyAcrossFiles) {
  TempDir d;
  write_config(d);
  moe::write_safetensors(d.file("a.safetensors"), {{"w", patterned({2}, DType::F32, 1)}});
  moe::write_safetensors(d.file("b.safetensors"), {{"w", patterned({2}, DType::F32, 2)}});
  expect_error([&] { moe::Checkpoint::open(d.path()); },
               {"'w'", d.file("a.safetensors"), d.file("b.safetensors")});
}

TEST(Checkpoint, ConfigAndDirectoryErrors) {
  TempDir d;
  expect_error([&] { moe::Checkpoint::open(d.file("nonexistent")); }, {"not a directory"});
  expect_error([&] { moe::Checkpoint::open(d.path()); }, {"config.json"});
  write_bytes(d.file("config.json"), R"({"hidden_size": )");
  expect_error([&] { moe::Checkpoint::open(d.path()); }, {"config.json", "not valid JSON"});
  write_config(d);
  expect_error([&] { moe::Checkpoint::open(d.path()); }, {"no weights"});
  // config.json is read as strictly as the index: a key given twice (one value would be
  // dropped without a word) and values nested past the limit are errors naming the file.
  write_bytes(d.file("config.json"), R"({"num_experts": 8, "hidden_size": 8, "num_experts": 64})");
  expect_error([&] { moe::Checkpoint::open(d.path()); }, {"config.json", "'num_experts' appears twice"});
  write_bytes(d.file("config.json"), R"({"rope_parameters": {"x": )" + std::string(100000, '[') +
                                         std::string(100000, ']') + "}}");
  expect_error([&] { moe::Checkpoint::open(d.path()); }, {"config.json", "nested more than 64 levels"});
}

TEST(Checkpoint, ConcurrentViewsCountEachTensorOnce) {
  TempDir d;
  write_sharded(d);
  moe::Checkpoint ck = moe::Checkpoint::open(d.path());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep)
        for (const auto& k : ck.keys()) ck.view(k);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ck.shards_opened(), 2u);
  EXPECT_EQ(ck.bytes_touched(), 4u * 8 * 4 + 3 * 2 + 16 * 4);
}
