// --weights-cache (loader/weights_cache/): the second start of a model maps the packed
// weights the first one wrote, and gives bitwise the logits of a start without the
// cache, in every weight format; a file that is stale, torn, damaged or hostile is
// rebuilt, and never read past its checks.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <nlohmann/json.hpp>

#include "kernels/grouped_gemm_int4.h"
#include "loader/weights_cache/weight_records.h"
#include "loader/weights_cache/weights_cache.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_model_util.h"
#include "test_util.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

uint64_t inode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

Tensor filled(const Shape& s, DType dt, int seed) {
  Tensor t = Tensor::empty(s, dt);
  auto* p = static_cast<unsigned char*>(t.raw());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>((i * 131 + seed * 17 + 7) % 251);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// A cache over a small stand-in model file; artifacts are plain records.
struct Fixture {
  test::TempDir tmp;
  std::string model = tmp / "model.gguf";
  std::string dir = tmp / "cache";
  Fixture() { std::ofstream(model) << "stand-in model bytes"; }
  std::unique_ptr<WeightsCache> open(const std::string& layout = "layout A") const {
    WeightsCacheParams p;
    p.dir = dir;
    p.model_path = model;
    p.layout = layout;
    p.verbose = false;
    return WeightsCache::open(p);
  }
};

CacheRecord sample_record(int seed) {
  CacheRecord r;
  r.put("codes", filled({3, 1000}, DType::U8, seed));
  r.put("scales", filled({3, 40}, DType::F32, seed + 1));
  r.put("d", filled({7}, DType::F16, seed + 2));
  r.put("ids", filled({5}, DType::I32, seed + 3));
  r.put("big", filled({3 << 20}, DType::I8, seed + 4));  // several checksum chunks
  r.put("n", int64_t{seed});
  r.put("negative", int64_t{-12345678901});
  return r;
}

// cached_load of a plain record: counts how often the loader ran.
CacheRecord load_record(WeightsCache* c, const std::string& key, int seed, int* loads) {
  return cached_load<CacheRecord>(
      c, key,
      [&] {
        ++*loads;
        return sample_record(seed);
      },
      [](const CacheRecord& r) { return r; }, [](const CacheRecord& r) { return r; });
}

void expect_same_record(const CacheRecord& a, const CacheRecord& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) EXPECT_TRUE(same_bytes(t, b.tensor(name))) << name;
  EXPECT_EQ(a.ints, b.ints);
}

TEST(WeightsCache, RecordsComeBackFromTheFileBitwise) {
  Fixture fx;
  int loads = 0;
  {
    auto c = fx.open();
    load_record(c.get(), "first", 1, &loads);
    load_record(c.get(), "second", 2, &loads);
    EXPECT_EQ(c->misses(), 2u);
    EXPECT_GT(c->commit(), 0u);
  }
  EXPECT_EQ(loads, 2);
  auto c = fx.open();
  const std::string path = c->path();
  const uint64_t ino = inode_of(path);
  const CacheRecord a = load_record(c.get(), "first", 1, &loads), b = load_record(c.get(), "second", 2, &loads);
  EXPECT_EQ(loads, 2) << "a valid file's records are mapped, not loaded again";
  EXPECT_EQ(c->hits(), 2u);
  EXPECT_EQ(c->misses(), 0u);
  expect_same_record(a, sample_record(1));
  expect_same_record(b, sample_record(2));
  // Aligned as fresh allocations are, and not all at one page offset (weights_cache.cpp).
  std::set<uintptr_t> page_offsets;
  for (const CacheRecord* r : {&a, &b})
    for (const auto& [name, t] : r->tensors) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % kTensorAlign, 0u) << name;
      page_offsets.insert(reinterpret_cast<uintptr_t>(t.raw()) % 4096);
    }
  EXPECT_GT(page_offsets.size(), 5u);
  // Written in place of the mapping: copy on write, the file keeps its bytes.
  a.tensor("codes").data<uint8_t>()[0] ^= 0xff;
  EXPECT_EQ(c->commit(), 0u) << "nothing missed: nothing written";
  EXPECT_EQ(inode_of(path), ino);
  auto again = fx.open();
  expect_same_record(load_record(again.get(), "first", 1, &loads), sample_record(1));
  // A record no longer used leaves the file when it is next written.
  load_record(again.get(), "third", 3, &loads);
  again->commit();
  auto last = fx.open();
  EXPECT_TRUE(last->find("first"));
  EXPECT_TRUE(last->find("third"));
  EXPECT_FALSE(last->find("second"));
}

TEST(WeightsCache, LayoutsAndRanksKeepTheirOwnFiles) {
  Fixture fx;
  auto a = fx.open("layout A"), b = fx.open("layout B");
  EXPECT_NE(a->path(), b->path());
  WeightsCacheParams p;
  p.dir = fx.dir;
  p.model_path = fx.model;
  p.layout = "layout A";
  p.rank = 1;
  p.verbose = false;
  EXPECT_NE(WeightsCache::open(p)->path(), a->path());
  EXPECT_EQ(fs::path(a->path()).parent_path(), fs::path(fx.dir));
}

// Each damage: the file is not trusted, the record is loaded again and the file rewritten;
// the start after that maps it.
TEST(WeightsCache, StaleDamagedOrHostileFilesAreRebuilt) {
  struct Damage {
    std::string name;
    std::function<void(const std::string& cache, const std::string& model)> apply;
  };
  auto poke = [](const std::string& path, uint64_t at, const std::string& bytes) {
    const int fd = ::open(path.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(at)), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  };
  struct Head {
    char magic[8];
    uint64_t version, index_offset, index_bytes, index_checksum, file_bytes;
  };
  auto head = [](const std::string& path) {
    Head h;
    std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(&h), sizeof h);
    return h;
  };
  // A new index with a valid checksum (a forger's file): its entries are still checked.
  auto forge_index = [&](const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
    Head h = head(path);
    std::string idx(h.index_bytes, '\0');
    std::ifstream in(path, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(h.index_offset));
    in.read(idx.data(), static_cast<std::streamsize>(idx.size()));
    nlohmann::json j = nlohmann::json::parse(idx);
    edit(j);
    idx = j.dump();
    h.index_bytes = idx.size();
    h.index_checksum = cache_checksum(idx.data(), idx.size());
    h.file_bytes = h.index_offset + idx.size();
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(h.file_bytes)), 0);
    poke(path, h.index_offset, idx);
    poke(path, 0, std::string(reinterpret_cast<const char*>(&h), sizeof h));
  };
  auto tensor_entry = [](nlohmann::json& j) -> nlohmann::json& { return j["records"]["first"]["tensors"]["big"]; };
  const std::vector<Damage> damages = {
      {"model file changed", [](const std::string&, const std::string& m) { std::ofstream(m) << "another model"; }},
      {"truncated", [](const std::string& c, const std::string&) { ASSERT_EQ(::truncate(c.c_str(), 5000), 0); }},
      {"empty", [](const std::string& c, const std::string&) { ASSERT_EQ(::truncate(c.c_str(), 0), 0); }},
      {"bad magic", [&](const std::string& c, const std::string&) { poke(c, 0, "NOTMOE!!"); }},
      {"another version", [&](const std::string& c, const std::string&) { poke(c, 8, std::string("\x07", 1)); }},
      {"a tensor's byte flipped",
       [&](const std::string& c, const std::string&) { poke(c, 4096 + 1500, std::string("\xff\x00\x13", 3)); }},
      {"the index's byte flipped",
       [&](const std::string& c, const std::string&) { poke(c, head(c).index_offset + 10, "#"); }},
      {"index past the end",
       [&](const std::string& c, const std::string&) {
         Head h = head(c);
         h.index_offset = uint64_t{1} << 40;
         poke(c, 0, std::string(reinterpret_cast<const char*>(&h), sizeof h));
       }},
      {"forged: tensor past the index",
       [&](const std::string& c, const std::string&) {
         forge_index(c, [&](nlohmann::json& j) { tensor_entry(j)["offset"] = uint64_t{1} << 40; });
       }},
      {"forged: shape bigger than its bytes",
       [&](const std::string& c, const std::string&) {
         forge_index(c, [&](nlohmann::json& j) { tensor_entry(j)["shape"] = {int64_t{1} << 40, int64_t{1} << 30}; });
       }},
      {"forged: unknown dtype",
       [&](const std::string& c, const std::string&) {
         forge_index(c, [&](nlohmann::json& j) { tensor_entry(j)["dtype"] = 200; });
       }},
      {"forged: misaligned tensor",
       [&](const std::string& c, const std::string&) {
         forge_index(c, [&](nlohmann::json& j) { tensor_entry(j)["offset"] = tensor_entry(j)["offset"].get<uint64_t>() + 4; });
       }},
      {"forged: not an object",
       [&](const std::string& c, const std::string&) { forge_index(c, [](nlohmann::json& j) { j["records"] = 3; }); }},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.name);
    Fixture fx;
    int loads = 0;
    std::string path;
    {
      auto c = fx.open();
      load_record(c.get(), "first", 1, &loads);
      c->commit();
      path = c->path();
    }
    d.apply(path, fx.model);
    {
      auto c = fx.open();
      const CacheRecord r = load_record(c.get(), "first", 1, &loads);
      EXPECT_EQ(loads, 2) << "loaded again";
      EXPECT_EQ(c->misses(), 1u);
      expect_same_record(r, sample_record(1));
      EXPECT_GT(c->commit(), 0u) << "rewritten";
    }
    auto c = fx.open();
    expect_same_record(load_record(c.get(), "first", 1, &loads), sample_record(1));
    EXPECT_EQ(loads, 2) << "the rebuilt file is mapped";
  }
}

// Packed weights of every format: a record decodes to the same tensors, and a record
// whose sizes or tensors are not the format's layout is refused before a kernel reads it.
TEST(WeightsCache, PackedRecordsDecodeOnlyTheirFormatsLayout) {
  std::vector<std::pair<std::string, PackedExperts>> formats;
  formats.emplace_back("bf16", make_packed_experts(3, 64, 96, DType::BF16, true));
  formats.emplace_back("f32", make_packed_experts(1, 40, 32, DType::F32, false));
  PackedExperts w8 = make_packed_experts(2, 64, 64, DType::I8, false);
  w8.smooth = filled({2, 64}, DType::F32, 5);
  formats.emplace_back("w8a8 with smooth", w8);
  formats.emplace_back("fp8", make_packed_experts_fp8(2, 256, 256, true, 128));
  formats.emplace_back("int4 g32 zero points", make_packed_experts_int4(2, 64, 128, true, 32));
  formats.emplace_back("Q4_K super-blocks", make_packed_experts_coded(2, 64, 512, false, {32, 4, true, 8}));
  formats.emplace_back("Q6_K 8-bit codes", make_packed_experts_coded(2, 64, 256, false, {16, 8, false, 16}));
  formats.emplace_back("Q8_0 f16 scales", make_packed_experts_coded(1, 64, 64, false, {32, 8, false, 1}));
  PackedExperts act_order = make_packed_experts_int4(2, 64, 64, true, 32);
  act_order.in_perm = Tensor::empty({2, 64}, DType::I32);
  for (int64_t i = 0; i < 128; ++i) act_order.in_perm.data<int32_t>()[i] = static_cast<int32_t>((i * 37) % 64);
  formats.emplace_back("int4 act-order", act_order);
  for (auto& [name, p] : formats) {
    SCOPED_TRACE(name);
    for (Tensor* t : {&p.data, &p.w_scale, &p.w_zero, &p.w_sb_d, &p.w_sc, &p.w_mn})
      if (t->defined()) *t = filled(t->shape(), t->dtype(), static_cast<int>(t->nbytes() % 97));
    CacheRecord r;
    encode_packed(r, "x.", p);
    const PackedExperts q = decode_packed(r, "x.");
    EXPECT_EQ(q.n, p.n);
    EXPECT_EQ(q.k, p.k);
    EXPECT_EQ(q.expert_stride, p.expert_stride);
    EXPECT_EQ(q.int4_group, p.int4_group);
    EXPECT_EQ(q.code_bits, p.code_bits);
    EXPECT_EQ(q.sb_groups, p.sb_groups);
    EXPECT_EQ(q.gated, p.gated);
    EXPECT_EQ(q.dtype, p.dtype);
    EXPECT_TRUE(same_bytes(q.data, p.data));
    EXPECT_EQ(q.w_zero.defined(), p.w_zero.defined());
    EXPECT_EQ(q.smooth.defined(), p.smooth.defined());
    EXPECT_EQ(q.in_perm.defined(), p.in_perm.defined());
    if (p.in_perm.defined()) {
      EXPECT_TRUE(same_bytes(q.in_perm, p.in_perm));
    }
    // Each mutation alone is refused. (Every shape here fills whole 64-column panels, so
    // twice the rows is a different layout; a change inside one panel's padding keeps
    // the layout, and Linear / MoE decoding checks the sizes themselves.)
    const std::vector<std::pair<std::string, std::function<void(CacheRecord&)>>> bad = {
        {"n doubled", [](CacheRecord& c) { c.ints["x.n"] *= 2; }},
        {"k halved", [](CacheRecord& c) { c.ints["x.k"] /= 2; }},
        {"more experts", [](CacheRecord& c) { c.ints["x.n_experts"] += 1; }},
        {"stride", [](CacheRecord& c) { c.ints["x.expert_stride"] += 64; }},
        {"dtype", [](CacheRecord& c) { c.ints["x.dtype"] = 9; }},
        {"short data", [](CacheRecord& c) { c.tensors["x.data"] = Tensor::zeros({7}, c.tensors["x.data"].dtype()); }},
        {"an extra side tensor", [](CacheRecord& c) { c.tensors["x.w_mn"] = Tensor::zeros({1, 1}, DType::U8); }},
        {"group codes", [](CacheRecord& c) { c.ints["x.int4_group"] = c.ints["x.int4_group"] ? 0 : 32; }},
    };
    for (const auto& [what, mutate] : bad) {
      CacheRecord m = r;
      mutate(m);
      if (what == "an extra side tensor" && p.w_mn.defined()) continue;
      EXPECT_THROW(decode_packed(m, "x."), Error) << what;
    }
    // An input order only where group codes are, and only a permutation of the k inputs
    // (the kernels index activation rows with it).
    auto perm_error = [&](Tensor t) {
      CacheRecord m = r;
      m.tensors["x.in_perm"] = t;
      try {
        decode_packed(m, "x.");
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    if (p.int4_group == 0) {
      EXPECT_NE(perm_error(Tensor::zeros({p.n_experts, p.k}, DType::I32)).find("only group-coded"), std::string::npos);
    } else if (p.in_perm.defined()) {
      Tensor dup = p.in_perm.clone();
      dup.data<int32_t>()[5] = dup.data<int32_t>()[6];
      EXPECT_NE(perm_error(dup).find("expert 0 is not a permutation of 64 inputs (entry 6"), std::string::npos);
      Tensor out = p.in_perm.clone();
      out.data<int32_t>()[64 + 3] = 64;
      EXPECT_NE(perm_error(out).find("expert 1 is not a permutation of 64 inputs (entry 3: 64)"), std::string::npos);
      EXPECT_NE(perm_error(Tensor::zeros({p.n_experts, p.k + 1}, DType::I32)).find("x.in_perm"), std::string::npos);
    }
  }
}

// The model: one start without the cache, one that writes it, one that maps it. The
// logits of the three are the same bits, in every weight format.
struct ModelCase {
  std::string name, path;
  std::function<void(ModelOptions&)> options;
};

Tensor logits_of(const std::string& path, const ModelOptions& o, const std::vector<std::vector<int32_t>>& prompts,
                 WeightsCacheStats* stats = nullptr) {
  auto m = Model::load(path, o);
  if (stats) *stats = m->weights_cache_stats();
  return prefill_logits(*m, prompts);
}

TEST(WeightsCacheModel, SecondStartMapsTheWeightsAndGivesTheSameLogits) {
  const std::string fx = test::fixtures_dir();
  const std::vector<ModelCase> cases = {
      {"GGUF K-quants in their codes", fx + "/gguf/models/qwen3moe-kquant.gguf", [](ModelOptions&) {}},
      {"GGUF Q4_0, bf16", fx + "/gguf/models/qwen3moe-quant.gguf", [](ModelOptions& o) { o.dtype = DType::BF16; }},
      {"qwen2_moe (shared experts) w8a8 + int8 linears", fx + "/qwen2_moe",
       [](ModelOptions& o) {
         o.quantize_w8a8 = true;
         o.quantize_linears = true;
       }},
      {"deepseek_v3 (MLA, a dense layer) w4a8", fx + "/deepseek_v3",
       [](ModelOptions& o) {
         o.quantize_w4a8 = true;
         o.quantize_linears_w4a8 = true;
       }},
      {"FP8 codes kept, bf16", fx + "/qwen3_moe_fp8", [](ModelOptions& o) { o.dtype = DType::BF16; }},
      {"GPTQ int4", fx + "/hf_int4/gptq_sym_g32", [](ModelOptions&) {}},
      {"AWQ int4, bf16", fx + "/hf_int4/awq_g32", [](ModelOptions& o) { o.dtype = DType::BF16; }},
  };
  const std::vector<std::vector<int32_t>> prompts = {{3}, {1, 4, 1, 5, 9}, {2, 6, 5, 3, 5, 8, 9, 7, 9}};
  for (const ModelCase& c : cases) {
    SCOPED_TRACE(c.name);
    test::TempDir tmp;
    ModelOptions o;
    o.n_slots = 3;
    o.show_progress = false;
    c.options(o);
    const Tensor want = logits_of(c.path, o, prompts);
    o.weights_cache_dir = tmp / "cache";
    WeightsCacheStats first, second;
    const Tensor a = logits_of(c.path, o, prompts, &first);
    const Tensor b = logits_of(c.path, o, prompts, &second);
    std::printf("[ cache ] %s: %zu records, %.1f KB written, %.1f KB mapped\n", c.name.c_str(), first.misses,
                first.bytes_written / 1e3, second.bytes_mapped / 1e3);
    EXPECT_EQ(first.hits, 0u);
    EXPECT_GT(first.misses, 0u);
    EXPECT_GT(first.bytes_written, 0u);
    EXPECT_EQ(second.misses, 0u) << "every record the first start wrote is valid";
    EXPECT_EQ(second.hits, first.misses);
    EXPECT_EQ(second.bytes_written, 0u);
    EXPECT_GT(second.bytes_mapped, 0u);
    ASSERT_EQ(a.shape(), want.shape());
    ASSERT_EQ(b.shape(), want.shape());
    EXPECT_EQ(0, std::memcmp(a.raw(), want.raw(), want.nbytes())) << "the start that wrote the cache";
    EXPECT_EQ(0, std::memcmp(b.raw(), want.raw(), want.nbytes())) << "the start that mapped it";
    // Another option set keeps its own file: the first one's stays valid.
    ModelOptions other = o;
    other.dtype = o.dtype == DType::F32 ? DType::BF16 : DType::F32;
    WeightsCacheStats s;
    logits_of(c.path, other, prompts, &s);
    EXPECT_EQ(s.hits, 0u);
    logits_of(c.path, o, prompts, &s);
    EXPECT_EQ(s.misses, 0u);
  }
}

// A cache that cannot be written costs the next start its speed, not this start its
// model: the write fails (here: a directory where the temp file goes) with a warning.
TEST(WeightsCacheModel, AFailedWriteKeepsTheModel) {
  test::TempDir tmp;
  const std::string model = test::fixtures_dir() + "/gguf/models/qwen3moe-kquant.gguf";
  const std::vector<std::vector<int32_t>> prompts = {{1, 4, 1, 5, 9}};
  ModelOptions o;
  o.show_progress = false;
  const Tensor want = logits_of(model, o, prompts);
  o.weights_cache_dir = tmp / "cache";
  logits_of(model, o, prompts);
  std::string file;
  for (const auto& e : fs::directory_iterator(o.weights_cache_dir)) file = e.path().string();
  ASSERT_FALSE(file.empty());
  fs::remove(file);
  fs::create_directory(file + ".tmp" + std::to_string(::getpid()));
  WeightsCacheStats s;
  const Tensor got = logits_of(model, o, prompts, &s);
  EXPECT_GT(s.misses, 0u);
  EXPECT_EQ(s.bytes_written, 0u);
  EXPECT_FALSE(fs::exists(file));
  EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes()));
  WeightsCacheParams p;
  p.dir = o.weights_cache_dir;
  p.model_path = model;
  p.verbose = false;
  auto c = WeightsCache::open(p);
  c->find("x");
  fs::create_directory(c->path() + ".tmp" + std::to_string(::getpid()));
  try {
    c->commit();
    ADD_FAILURE() << "the write should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(c->path()), std::string::npos) << e.what();
  }
}

TEST(WeightsCacheModel, CliStartsFromTheCache) {
  test::TempDir tmp;
  const std::string model = test::fixtures_dir() + "/gguf/models/qwen3moe-kquant.gguf";
  auto run = [&](const std::string& flags, std::string* log) {
    const int rc = test::run_command(std::string(MOE_EP_BINARY) + " forward --model " + model +
                                         " --prompt-ids '1,4,1,5,9' " + flags,
                                     log);
    EXPECT_EQ(rc, 0) << *log;
  };
  std::string log;
  run("--quiet --logits " + tmp / "want.safetensors", &log);
  run("--weights-cache " + tmp / "cache" + " --logits " + tmp / "a.safetensors", &log);
  EXPECT_NE(log.find("weights cache: wrote"), std::string::npos) << log;
  run("--weights-cache " + tmp / "cache" + " --logits " + tmp / "b.safetensors", &log);
  EXPECT_NE(log.find("weights cache: mapping"), std::string::npos) << log;
  const Tensor want = SafetensorsFile::open(tmp / "want.safetensors")->view("logits").clone();
  for (const char* f : {"a.safetensors", "b.safetensors"}) {
    const Tensor got = SafetensorsFile::open(tmp / f)->view("logits").clone();
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes())) << f;
  }
  // A directory that cannot be one: an error that names the flag.
  std::ofstream(tmp / "plain-file") << "x";
  const int rc = test::run_command(std::string(MOE_EP_BINARY) + " forward --quiet --model " + model +
                                       " --prompt-ids 1 --logits " + tmp / "c.safetensors" + " --weights-cache " + tmp / "plain-file",
                                   &log);
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("--weights-cache"), std::string::npos) << log;
}

}  // namespace
}  // namespace moe
