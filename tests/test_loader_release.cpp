// A load holds each weight once: once a tensor is packed, its file pages leave the
// process (release_sharded; the page cache keeps them), the W8A8 packer quantises row
// by row from the file's dtype (no float copy of a weight), and the peak resident
// memory of a whole-model load stays near the bytes of the weights it computes with.
//
// Pages are checked in this process's page table (/proc/self/pagemap: present or not),
// not with mincore(), which reports the page cache, where released pages stay. Peaks
// are the kernel's high-water mark of the resident set (VmHWM), reset right before the
// load (/proc/self/clear_refs "5"), so a test measures its own load only.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "kernels/quant.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/safetensors.h"
#include "loader/shard.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/registry.h"
#include "test_util.h"

namespace moe {
namespace {

const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));

// Whole pages of [p, p + n) that are mapped in this process (pagemap bit 63). pread:
// pagemap takes only reads of whole 8-byte entries, which a buffered stream does not do.
int64_t mapped_pages(const void* p, uint64_t n) {
  const uint64_t b = reinterpret_cast<uintptr_t>(p) / kPage, e = (reinterpret_cast<uintptr_t>(p) + n) / kPage;
  std::vector<uint64_t> entries(e > b ? e - b : 0);
  const int fd = ::open("/proc/self/pagemap", O_RDONLY);
  EXPECT_GE(fd, 0) << "cannot open /proc/self/pagemap";
  const ssize_t want = static_cast<ssize_t>(entries.size() * 8);
  EXPECT_EQ(::pread(fd, entries.data(), want, static_cast<off_t>(b * 8)), want) << "reading /proc/self/pagemap";
  ::close(fd);
  int64_t mapped = 0;
  for (uint64_t v : entries) mapped += (v >> 63) & 1;
  return mapped;
}

// A field of /proc/self/status ("VmHWM", "VmRSS") in bytes.
uint64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  ADD_FAILURE() << field << " not in /proc/self/status";
  return 0;
}

// Resets VmHWM to the current resident set; returns that baseline.
uint64_t reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5";
  const uint64_t rss = status_bytes("VmRSS"), hwm = status_bytes("VmHWM");
  EXPECT_LE(hwm, rss + (1u << 20)) << "VmHWM was not reset by /proc/self/clear_refs";
  return rss;
}

uint64_t g_rng = 0x9E3779B97F4A7C15ull;
// Random finite bf16 values in +-[2^-8, 2^-6), straight into a bf16 tensor.
Tensor random_bf16(const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::BF16);
  auto* p = static_cast<uint16_t*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    const uint16_t v = static_cast<uint16_t>(g_rng);
    p[i] = static_cast<uint16_t>((v & 0x8000) | ((119 + ((v >> 7) & 1)) << 7) | (v & 0x7f));
  }
  return t;
}

// A random-weight qwen3_moe checkpoint big enough that a load's memory is its weights
// (the bytes of the file: experts E * 3 * I * H * 2 per layer dominate).
struct BigModel {
  int64_t L = 2, E = 16, H = 512, I = 1024, V = 8192, heads = 8, kv_heads = 2, hd = 64;
  uint64_t tensor_bytes = 0, embed_bytes = 0;

  void write(const std::string& dir) {
    std::vector<std::pair<std::string, Tensor>> ts;
    auto add = [&](const std::string& k, const Shape& s) { ts.emplace_back(k, random_bf16(s)); };
    add("model.embed_tokens.weight", {V, H});
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {H});
      add(p + "post_attention_layernorm.weight", {H});
      add(p + "self_attn.q_proj.weight", {heads * hd, H});
      add(p + "self_attn.k_proj.weight", {kv_heads * hd, H});
      add(p + "self_attn.v_proj.weight", {kv_heads * hd, H});
      add(p + "self_attn.o_proj.weight", {H, heads * hd});
      add(p + "self_attn.q_norm.weight", {hd});
      add(p + "self_attn.k_norm.weight", {hd});
      add(p + "mlp.gate.weight", {E, H});
      for (int64_t e = 0; e < E; ++e) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        add(q + "gate_proj.weight", {I, H});
        add(q + "up_proj.weight", {I, H});
        add(q + "down_proj.weight", {H, I});
      }
    }
    add("model.norm.weight", {H});
    add("lm_head.weight", {V, H});
    for (const auto& [k, t] : ts) tensor_bytes += t.nbytes();
    embed_bytes = ts[0].second.nbytes();
    write_safetensors(dir + "/model.safetensors", ts);
    std::ofstream(dir + "/config.json")
        << nlohmann::json{{"model_type", "qwen3_moe"},     {"hidden_size", H},        {"num_hidden_layers", L},
                          {"num_experts", E},              {"num_experts_per_tok", 2}, {"moe_intermediate_size", I},
                          {"intermediate_size", 4 * I},    {"num_attention_heads", heads},
                          {"num_key_value_heads", kv_heads}, {"head_dim", hd},         {"vocab_size", V},
                          {"norm_topk_prob", true},        {"max_position_embeddings", 64}}
               .dump();
  }
};

TEST(LoadRelease, SafetensorsReleaseDropsWholePagesAndKeepsTheBytes) {
  test::TempDir dir;
  // Three tensors of 5 pages and a bit each: every boundary falls inside a page.
  const int64_t n = static_cast<int64_t>(5 * kPage / 2 + 123);
  const Tensor a = random_bf16({n}), b = random_bf16({n}), c = random_bf16({n});
  write_safetensors(dir / "t.safetensors", {{"a", a}, {"b", b}, {"c", c}});
  auto f = SafetensorsFile::open(dir / "t.safetensors");
  const Tensor va = f->view("a"), vb = f->view("b"), vc = f->view("c");
  const char* base = static_cast<const char*>(va.raw()) - f->find("a")->offset;
  volatile uint32_t sum = 0;  // fault every page in
  for (uint64_t i = 0; i < f->file_size(); i += 64) sum = sum + static_cast<uint8_t>(base[i]);
  const int64_t pages = static_cast<int64_t>((f->file_size() + kPage - 1) / kPage);
  ASSERT_EQ(mapped_pages(base, pages * kPage), pages);
  const uint64_t touched = f->bytes_touched();

  const uint64_t a_end = f->find("a")->offset + f->find("a")->nbytes;
  f->release_elems("a", 0, n);  // the header was released at open: pages [0, a_end) go
  EXPECT_EQ(mapped_pages(base, a_end / kPage * kPage), 0);
  EXPECT_EQ(mapped_pages(base + a_end / kPage * kPage, kPage), 1) << "the page a shares with b stays";
  EXPECT_EQ(f->bytes_released(), a.nbytes());
  f->release_elems("a", 0, n);  // again: counted once
  EXPECT_EQ(f->bytes_released(), a.nbytes());
  f->release_elems("b", 0, n / 2);  // the first half of b: the shared page goes now
  EXPECT_EQ(mapped_pages(base + a_end / kPage * kPage, kPage), 0);
  f->release_elems("b", n / 2, n);  // clipped to the tensor
  f->release_elems("c", 0, n);      // up to the end of the file: the last page goes too
  EXPECT_EQ(mapped_pages(base, pages * kPage), 0);
  EXPECT_EQ(f->bytes_released(), 3 * a.nbytes());
  EXPECT_EQ(f->bytes_touched(), touched);  // releasing is not reading
  // The views still read the file's bytes (refaulted from the page cache).
  EXPECT_EQ(std::memcmp(va.raw(), a.raw(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(vb.raw(), b.raw(), b.nbytes()), 0);
  EXPECT_EQ(std::memcmp(vc.raw(), c.raw(), c.nbytes()), 0);
}

// An in-memory file (the fuzzers' heap copy) is never released: madvise(DONTNEED) on
// heap pages zeroes them, this file's bytes and whatever else shares its pages. The
// buffer is page-aligned with other data on its last page, the case the fuzzer hit
// (header release at open zeroed libFuzzer's own copy of the input).
TEST(LoadRelease, InMemoryFileIsNeverReleased) {
  test::TempDir dir;
  const int64_t n = static_cast<int64_t>(3 * kPage / 2 + 7);
  const Tensor a = random_bf16({n});
  write_safetensors(dir / "t.safetensors", {{"a", a}});
  std::ifstream in(dir / "t.safetensors", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const uint64_t pages = (bytes.size() + kPage - 1) / kPage + 1;
  std::shared_ptr<void> buf(std::aligned_alloc(kPage, pages * kPage), std::free);
  char* p = static_cast<char*>(buf.get());
  std::memset(p, 0x5a, pages * kPage);  // the neighbours: every byte after the file
  std::memcpy(p, bytes.data(), bytes.size());

  auto f = SafetensorsFile::from_bytes(buf, bytes.size(), "heap.safetensors");
  f->release_elems("a", 0, n);
  EXPECT_EQ(f->bytes_released(), a.nbytes());  // still counted: the caller is done with it
  EXPECT_EQ(std::memcmp(p, bytes.data(), bytes.size()), 0) << "the file's own bytes changed";
  for (uint64_t i = bytes.size(); i < pages * kPage; ++i)
    ASSERT_EQ(p[i], 0x5a) << "byte " << i << " after the end of the in-memory file changed";
  EXPECT_EQ(std::memcmp(f->view("a").raw(), a.raw(), a.nbytes()), 0);
}

TEST(LoadRelease, MoeLayerHoldsNoFilePageOfWhatItPacked) {
  test::TempDir dir;
  BigModel bm;
  bm.L = 1;
  bm.write(dir.path());
  const Checkpoint ck = Checkpoint::open(dir.path());
  const ModelConfig c = model_config_from_hf(ck.config());
  MlpLoadOptions opt;
  opt.compute = DType::BF16;
  const MoeLayerWeights w = load_moe_layer(ck, c.moe, 0, opt);
  // Every byte the layer read (router and experts, whole tensors) was released...
  EXPECT_EQ(ck.bytes_released(), mlp_layer_read_bytes(ck, c.moe, 0, opt));
  EXPECT_EQ(ck.bytes_released(), ck.bytes_touched());
  // ...and the mapping holds none of their pages but the two it shares with neighbours.
  const std::string first = "model.layers.0.mlp.gate.weight",
                    last = "model.layers.0.mlp.experts." + std::to_string(bm.E - 1) + ".down_proj.weight";
  const TensorInfo &fi = ck.info(first), &li = ck.info(last);
  const char* base = static_cast<const char*>(ck.view_elems(first, 0, {1}).raw()) - fi.offset;
  EXPECT_LE(mapped_pages(base + fi.offset, li.offset + li.nbytes - fi.offset), 2);
  // The packed weights are the file's (bf16 -> bf16 moves bits).
  const Tensor e0 = unpack_expert(w.w2, bm.E - 1);
  const Tensor src = ck.view(last).to(DType::F32);
  EXPECT_EQ(std::memcmp(e0.raw(), src.raw(), src.nbytes()), 0);
}

TEST(LoadRelease, Int8PackingQuantisesEachRowOfTheSourceAsItIs) {
  // pack_expert (I8) from a bf16 view with a smooth vector: each packed row is
  // quantize_weight_row of the f32 row times the smooth vector, done here independently.
  const int64_t N = 96, K = 200;
  const Tensor w = random_bf16({N, K});
  Tensor smooth = test::random_f32({K}, 0.3f, 11);
  for (int64_t k = 0; k < K; ++k) smooth.data<float>()[k] = 0.5f + std::fabs(smooth.data<float>()[k]);
  for (bool gated : {false, true}) {
    PackedExperts p = make_packed_experts(1, N, K, DType::I8, gated);
    set_expert_smooth(p, 0, smooth);
    if (gated)
      pack_expert_gated(p, 0, w.slice_rows(0, N / 2), w.slice_rows(N / 2, N));
    else
      pack_expert(p, 0, w);
    Tensor q, s;
    unpack_expert_q8(p, 0, q, s);
    const Tensor wf = w.to(DType::F32);
    std::vector<float> row(K);
    std::vector<int8_t> want(K);
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t k = 0; k < K; ++k) row[k] = wf.data<float>()[r * K + k] * smooth.data<float>()[k];
      const float scale = quantize_weight_row(row.data(), K, want.data());
      ASSERT_EQ(s.data<float>()[r], scale) << "row " << r << " gated " << gated;
      ASSERT_EQ(std::memcmp(q.data<int8_t>() + r * K, want.data(), K), 0) << "row " << r << " gated " << gated;
    }
  }
}

// Peak resident memory of Model::load above what the process held before, against the
// bytes the model computes with.
uint64_t load_peak(const std::string& dir, const ModelOptions& o) {
  const uint64_t base = reset_peak();
  {
    const auto m = Model::load(dir, o);
    EXPECT_EQ(m->config().n_layers, 2);
  }
  const uint64_t hwm = status_bytes("VmHWM");
  return hwm > base ? hwm - base : 0;
}

TEST(LoadRelease, ModelLoadHoldsEachWeightOnce) {
  test::TempDir dir;
  BigModel bm;
  bm.write(dir.path());
  ModelOptions o;
  o.dtype = DType::BF16;
  o.max_seq = 16;
  // bf16 from bf16: the packed weights are the file's bytes less the embedding table
  // (a view of the mapping, of which a forward touches only its tokens' rows). Before
  // the release, the mapped pages of everything packed stayed too: twice this.
  const uint64_t weights = bm.tensor_bytes - bm.embed_bytes;
  const uint64_t slack = 8u << 20;  // runtime, KV cache of 16 positions, scratch, allocator
  const uint64_t bf16 = load_peak(dir.path(), o);
  EXPECT_LE(bf16, weights * 11 / 10 + slack) << "peak " << bf16 << " bytes for " << weights << " bytes of weights";
  // W8A8 experts and linears: about half the bytes. The peak must stay below the int8
  // weights plus one layer's float weights: quantising never holds a layer's float copy
  // (or its mapped source) beside the int8 one.
  o.quantize_w8a8 = true;
  o.quantize_linears = true;
  const uint64_t w8 = load_peak(dir.path(), o);
  const uint64_t layer_float = static_cast<uint64_t>(bm.E * 3 * bm.I * bm.H * 2);
  EXPECT_LE(w8, weights / 2 * 11 / 10 + slack) << "peak " << w8 << " bytes";
  EXPECT_LT(w8, weights / 2 + layer_float);
}

}  // namespace
}  // namespace moe
