// GGUF files as checkpoints (loader/gguf/gguf_checkpoint.h): the model a GGUF holds gives
// the same logits, bit for bit, as the Hugging Face directory it was converted from
// (tests/fixtures/gguf/models, written by tools/gen_gguf_model_fixtures.py with gguf-py:
// llama.cpp's names, types and splitting), and a quantised one the same logits as a
// directory of gguf-py's dequantised values; the config is the source's; bad files fail
// with errors that name the problem.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "kernels/grouped_gemm_int4.h"
#include "loader/checkpoint.h"
#include "loader/gguf/gguf_checkpoint.h"
#include "loader/gguf/gguf_file.h"
#include "loader/moe_weights.h"
#include "moe/config.h"
#include "model/layers.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "test_model_util.h"

namespace moe {
namespace {

const std::string kModels = std::string(MOE_FIXTURES_DIR) + "/gguf/models/";
// Q4_0ExpertsModelNearTheF32One: int8 rounding of the coded layers' inputs (per token,
// absmax / 127 steps) is the only difference. Measured 1 - cosine: 1.5e-8 with the experts
// alone in int4 (their output is a small part of the residual), 1.25e-4 once attn_output
// is int4 too (its output is added to the residual directly), 5.0e-4 since every coded
// linear keeps its codes (q, k, v, lm_head and the dense MLP too: nine int8-input GEMMs
// per token instead of two). 1e-3 is ten times tighter than the W8A8 models' bound (0.99,
// test_quant_model.cpp).
constexpr double kInt4Cosine = 1 - 1e-3;
// KQuantModelNearTheF32One: the K-quant fixture's weights are uniform random codes (not a
// trained model's bell curve), so its layer outputs have larger outliers per token and
// every one of its GEMMs takes int8 inputs; measured 1 - cosine 1.26e-3. 5e-3 leaves a 4x
// margin and is still twice as tight as the W8A8 models' bound.

test::ModelFixture fixture(const std::string& name) {
  for (auto& f : test::model_fixtures())
    if (f.name == name) return f;
  throw std::runtime_error("no fixture " + name);
}

std::unique_ptr<Model> load(const std::string& path, DType dt, bool q4_0_as_int4) {
  ModelOptions o;
  o.dtype = dt;
  o.n_slots = 3;
  o.gguf_q4_0_as_int4 = q4_0_as_int4;
  return Model::load(path, o);
}

// Logits of the golden prompts, bitwise, between a GGUF and a directory, in f32 and bf16
// (GGUF Q4_0 experts dequantised like every other tensor).
void expect_same_logits(const std::string& gguf, const std::string& dir,
                        const std::vector<std::vector<int32_t>>& prompts) {
  for (DType dt : {DType::F32, DType::BF16}) {
    auto a = load(gguf, dt, false);
    auto b = load(dir, dt, false);
    const Tensor la = prefill_logits(*a, prompts), lb = prefill_logits(*b, prompts);
    ASSERT_EQ(la.shape(), lb.shape());
    int64_t differ = 0;
    for (int64_t i = 0; i < la.numel(); ++i) differ += la.data<float>()[i] != lb.data<float>()[i];
    EXPECT_EQ(differ, 0) << "of " << la.numel() << " logits, dtype " << dtype_name(dt) << ", " << gguf;
  }
}

// `coded` loaded with its integer-coded weights in their codes against `dequantised`
// loaded dequantised, in f32: within kInt4Cosine (the int8 inputs of the coded GEMMs are
// the only difference), and not equal (the coded path ran).
void expect_codes_near_dequantised(const std::string& coded, const std::string& dequantised,
                                   const std::vector<std::vector<int32_t>>& prompts, const char* what) {
  auto q = load(coded, DType::F32, true), f = load(dequantised, DType::F32, false);
  const double worst = test::worst_logit_cosine(prefill_logits(*q, prompts), prefill_logits(*f, prompts), prompts);
  std::printf("[ gguf ] %s: worst logit cosine %.9f\n", what, worst);
  EXPECT_GE(worst, kInt4Cosine);
  EXPECT_LT(worst, 1.0);
}

// 16 greedy tokens per golden prompt equal transformers' (the fixture's goldens).
void expect_greedy_tokens(Model& m, const test::ModelFixture& f) {
  GenerateOptions go;
  go.max_new_tokens = 16;
  go.ignore_eos = true;
  const GenerateResult r = generate(m, f.prompts, go);
  for (size_t i = 0; i < f.greedy.size(); ++i) EXPECT_EQ(r.tokens[i], f.greedy[i]) << "prompt " << i;
}

TEST(GgufCheckpoint, Bf16FileGivesTheSourceDirectorysLogitsAndTransformers) {
  const auto f = fixture("qwen3_moe");
  const std::string path = kModels + "qwen3_moe-BF16.gguf";
  expect_same_logits(path, f.dir, f.prompts);
  // And so, against transformers, the bound the directory itself meets (test_model.cpp).
  auto m = test::load_model(path);
  EXPECT_LE(test::max_logit_diff(prefill_logits(*m, f.prompts), f.logits, f.prompts), 1e-4);
}

// Mixtral as llama.cpp stores it (architecture llama with experts, q and k rows permuted
// for interleaved RoPE): the same model, so transformers' goldens hold with the bound the
// directory meets; only q.k's summation order differs from the directory's.
TEST(GgufCheckpoint, MixtralWithPermutedQkMatchesTransformers) {
  const auto f = fixture("mixtral");
  auto g = test::load_model(kModels + "mixtral-F32.gguf"), d = test::load_model(f.dir);
  const Tensor lg = prefill_logits(*g, f.prompts), ld = prefill_logits(*d, f.prompts);
  EXPECT_LE(test::max_logit_diff(lg, f.logits, f.prompts), 1e-4);
  EXPECT_LE(test::max_logit_diff(lg, ld, f.prompts), 1e-5);
  expect_greedy_tokens(*g, f);
}

// ERNIE-4.5-MoE as convert_hf_to_gguf.py writes it (`ernie4_5-moe`): a dense first layer,
// the shared experts, the selection-only router bias (exp_probs_b), tied embeddings and
// expert_shared_feed_forward_length as the converter computes it (24 here, not the 16
// rows the tensors have: the loader takes the tensors'). Nothing is permuted, so the
// logits equal the directory's bit for bit, and transformers' goldens hold.
TEST(GgufCheckpoint, ErnieWithDenseLayerSharedExpertsAndSelectionBias) {
  const auto f = fixture("ernie4_5_moe");
  const std::string path = kModels + "ernie4_5_moe-F32.gguf";
  expect_same_logits(path, f.dir, f.prompts);
  auto m = test::load_model(path);
  EXPECT_LE(test::max_logit_diff(prefill_logits(*m, f.prompts), f.logits, f.prompts), 1e-4);
  expect_greedy_tokens(*m, f);
}

// DeepSeek-V3 and V2 as `deepseek2` (convert_hf_to_gguf.py's DeepseekV2Model): MLA with
// kv_b_proj split into attn_k_b (transposed) and attn_v_b, which the loader maps as
// k_b_proj / v_b_proj, the matrices the absorbed attention multiplies by; V3's sigmoid
// noaux_tc router with its exp_probs_b bias and q_lora; V2's q_proj and softmax
// group-limited router. Every other tensor of the directory comes out of the GGUF with the
// same shape and values, the halves hold kv_b_proj's values, and the config keys are the
// directory's. V3's logits equal the directory's bit for bit; the V2 fixture's MLPs use
// gelu_pytorch_tanh, which GGUF cannot say (llama.cpp runs deepseek2 with SiLU), so its
// logits differ by design.
TEST(GgufCheckpoint, DeepseekMlaFromSplitKvB) {
  expect_same_logits(kModels + "deepseek_v3-F32.gguf", fixture("deepseek_v3").dir, fixture("deepseek_v3").prompts);
  for (const char* name : {"deepseek_v3", "deepseek_v2"}) {
    SCOPED_TRACE(name);
    const auto f = fixture(name);
    const Checkpoint g = Checkpoint::open(kModels + name + "-F32.gguf"), d = Checkpoint::open(f.dir);
    const int64_t H = d.config().at("num_attention_heads"), R = d.config().at("kv_lora_rank");
    const int64_t nope = d.config().at("qk_nope_head_dim"), v = d.config().at("v_head_dim");
    for (const std::string& key : d.keys()) {
      if (key.ends_with("kv_b_proj.weight")) {  // [H*(nope+v), R] against its halves
        EXPECT_FALSE(g.has(key)) << key;
        const std::string p = key.substr(0, key.size() - std::string("kv_b_proj.weight").size());
        const Tensor kv = d.view(key), kb = g.view(p + "k_b_proj.weight"), vb = g.view(p + "v_b_proj.weight");
        ASSERT_EQ(kb.shape(), (Shape{H * R, nope})) << key;
        ASSERT_EQ(vb.shape(), (Shape{H * v, R})) << key;
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c = 0; c < R; ++c) {
            for (int64_t j = 0; j < nope; ++j)
              ASSERT_EQ(kb.data<float>()[(h * R + c) * nope + j], kv.data<float>()[(h * (nope + v) + j) * R + c])
                  << key << " head " << h << " k row " << j << " col " << c;
            for (int64_t j = 0; j < v; ++j)
              ASSERT_EQ(vb.data<float>()[(h * v + j) * R + c], kv.data<float>()[(h * (nope + v) + nope + j) * R + c])
                  << key << " head " << h << " v row " << j << " col " << c;
          }
        continue;
      }
      ASSERT_TRUE(g.has(key)) << key;
      const Tensor a = g.view(key), b = d.view(key);
      ASSERT_EQ(a.shape(), b.shape()) << key;
      ASSERT_EQ(a.dtype(), DType::F32) << key;
      EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), static_cast<size_t>(a.numel()) * 4), 0) << key;
    }
    for (const char* k : {"model_type", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                          "v_head_dim", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
                          "first_k_dense_replace", "routed_scaling_factor", "norm_topk_prob", "scoring_func",
                          "topk_method", "n_group", "topk_group", "num_key_value_heads"})
      EXPECT_EQ(g.config().at(k), d.config().at(k)) << k;
  }
  // BF16 halves stay BF16: run in bf16 (where the directory's weights are rounded the
  // same way) the logits are the directory's.
  const auto f = fixture("deepseek_v3");
  const std::string bf16 = kModels + "deepseek_v3-BF16.gguf";
  EXPECT_EQ(Checkpoint::open(bf16).info("model.layers.1.self_attn.k_b_proj.weight").dtype, DType::BF16);
  EXPECT_EQ(Checkpoint::open(bf16).info("model.layers.1.self_attn.v_b_proj.weight").dtype, DType::BF16);
  auto a = load(bf16, DType::BF16, false), b = load(f.dir, DType::BF16, false);
  const Tensor la = prefill_logits(*a, f.prompts), lb = prefill_logits(*b, f.prompts);
  ASSERT_EQ(la.shape(), lb.shape());
  EXPECT_EQ(std::memcmp(la.data<float>(), lb.data<float>(), static_cast<size_t>(la.numel()) * 4), 0);
}

// The absorbed kv_b halves (MlaAttention uk / uv) take the projections' format: the
// compute dtype, W8A8 under --quantize-linears w8a8 and w4a8 (before, int8 linears had an
// f32 copy beside them: 4 bytes a weight, read every decode step), and a GGUF's codes
// wherever its coded linears keep theirs (not under w8a8, which requantises them all).
TEST(GgufCheckpoint, MlaKvBHalvesTakeTheProjectionsFormat) {
  std::string hf;
  for (const auto& f : test::model_fixtures())
    if (f.name == "deepseek_v3") hf = f.dir;
  ASSERT_FALSE(hf.empty());
  const std::string gguf = kModels + "deepseek-quant.gguf";
  enum Lin { none, w8a8, w4a8 };
  struct Case {
    std::string path;
    DType dtype;
    Lin lin;
    DType want;
    bool codes;
  };
  for (const Case& c : {Case{hf, DType::F32, none, DType::F32, false}, Case{hf, DType::BF16, none, DType::BF16, false},
                        Case{hf, DType::F32, w8a8, DType::I8, false}, Case{hf, DType::BF16, w4a8, DType::I8, false},
                        Case{gguf, DType::F32, none, DType::I8, true}, Case{gguf, DType::F32, w8a8, DType::I8, false},
                        Case{gguf, DType::F32, w4a8, DType::I8, true}}) {
    SCOPED_TRACE(c.path + " " + dtype_name(c.dtype) + " linears " + std::to_string(c.lin));
    ModelOptions o;
    o.dtype = c.dtype;
    o.n_slots = 1;
    o.max_seq = 16;
    o.quantize_linears = c.lin == w8a8;
    o.quantize_linears_w4a8 = c.lin == w4a8;
    if (c.lin == w4a8) o.int4_group = 32;
    const auto m = Model::load(c.path, o);
    for (int64_t l = 0; l < m->config().n_layers; ++l) {
      const MlaAttention* a = m->layer(l).mla.get();
      ASSERT_NE(a, nullptr);
      for (const Linear* h : {&a->uk(), &a->uv()}) {
        EXPECT_EQ(h->w.dtype, c.want) << "layer " << l;
        EXPECT_EQ(h->w.int4_group > 0, c.codes) << "layer " << l;
      }
    }
  }
}

// A DeepSeek GGUF whose attn_k_b / attn_v_b are quantised (layer 0 Q8_0 / Q4_0, layer 1
// Q5_0 / Q4_1; every other tensor F32) runs them in their codes: each head's matrices, on
// one rank and on each of two TP ranks, unpack to gguf-py's dequantised values (the twin
// directory's kv_b_proj: W_UK transposed, W_UV as it is); dequantised, the logits are the
// twin's bit for bit; in codes only the int8 inputs of those GEMMs differ (the bound of
// Q4_0ExpertsModelNearTheF32One, whose model also rounds every coded GEMM's input).
TEST(GgufCheckpoint, DeepseekQuantisedKvBHalvesStayInTheirCodes) {
  const std::string path = kModels + "deepseek-quant.gguf", ref = kModels + "deepseek-quant-ref";
  const std::vector<std::vector<int32_t>> prompts = {{3}, {1, 4, 1, 5, 9}, {2, 6, 5, 3, 5, 8, 9, 7, 9}};
  expect_same_logits(path, ref, prompts);
  expect_codes_near_dequantised(path, ref, prompts, "DeepSeek with coded kv_b halves vs its dequantised twin");
  const Checkpoint g = Checkpoint::open(path), d = Checkpoint::open(ref);
  const int64_t H = d.config().at("num_attention_heads"), R = d.config().at("kv_lora_rank");
  const int64_t nope = d.config().at("qk_nope_head_dim"), v = d.config().at("v_head_dim");
  const int want_bits[2][2] = {{8, 4}, {6, 4}};  // Q8_0 in 8-bit codes, Q5_0 in 6, Q4_0 / Q4_1 in 4
  for (int64_t l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const Tensor kv = d.view(p + "kv_b_proj.weight");  // [H*(nope+v), R]
    for (int tp : {1, 2})
      for (int r = 0; r < tp; ++r) {
        SCOPED_TRACE("layer " + std::to_string(l) + " rank " + std::to_string(r) + "/" + std::to_string(tp));
        const int64_t nh = H / tp, first = r * nh;
        const Linear uk = load_head_linears(g, {p + "k_b_proj", H, R, nope, first, nh, l},
                                            LinearOptions::keeping_int4(DType::F32));
        const Linear uv = load_head_linears(g, {p + "v_b_proj", H, v, R, first, nh, l},
                                            LinearOptions::keeping_int4(DType::F32));
        ASSERT_EQ(uk.w.n_experts, nh);
        EXPECT_EQ(uk.w.dtype, DType::I8);
        EXPECT_EQ(uk.w.code_bits, want_bits[l][0]);
        EXPECT_EQ(uv.w.code_bits, want_bits[l][1]);
        for (int64_t h = 0; h < nh; ++h) {
          const Tensor a = unpack_expert(uk.w, h), b = unpack_expert(uv.w, h);
          ASSERT_EQ(a.shape(), (Shape{R, nope}));
          ASSERT_EQ(b.shape(), (Shape{v, R}));
          const float* src = kv.data<float>() + (first + h) * (nope + v) * R;
          for (int64_t c = 0; c < R; ++c) {
            for (int64_t j = 0; j < nope; ++j)
              ASSERT_EQ(a.data<float>()[c * nope + j], src[j * R + c]) << "W_UK^T head " << h << " [" << c << ", " << j << "]";
            for (int64_t j = 0; j < v; ++j)
              ASSERT_EQ(b.data<float>()[j * R + c], src[(nope + j) * R + c]) << "W_UV head " << h << " [" << j << ", " << c << "]";
          }
        }
      }
  }
}

TEST(GgufCheckpoint, SplitF32FileWithBiasesAndSharedExpert) {
  const auto f = fixture("qwen2_moe");
  const std::string path = kModels + "qwen2_moe-F32-00001-of-00002.gguf";
  EXPECT_EQ(Checkpoint::open(path).shards_opened(), 2u);
  expect_same_logits(path, f.dir, f.prompts);
}

TEST(GgufCheckpoint, QuantisedTypesGiveGgufPysDequantisedValues) {
  const std::string path = kModels + "qwen3moe-quant.gguf", ref = kModels + "qwen3moe-quant-ref";
  const std::vector<std::vector<int32_t>> prompts = {{3}, {1, 4, 1, 5, 9}, {2, 6, 5, 3, 5, 8, 9, 7, 9}};
  expect_same_logits(path, ref, prompts);
  // Every tensor, read whole and in pieces (an expert's rows; a strided column slice
  // that starts and ends inside quantisation blocks), equals the reference's values.
  const Checkpoint g = Checkpoint::open(path), r = Checkpoint::open(ref);
  ASSERT_EQ(g.keys(), r.keys());
  for (const std::string& k : r.keys()) {
    const Tensor a = g.view(k), b = r.view(k);
    ASSERT_EQ(a.shape(), b.shape()) << k;
    ASSERT_EQ(a.dtype(), DType::F32) << k;
    ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << k;
    if (a.ndim() != 2) continue;
    const int64_t rows = a.dim(0), cols = a.dim(1), piece = cols / 2 - 3, start = 5;
    std::vector<float> got(static_cast<size_t>(piece * rows));
    g.copy_strided(k, start, piece, cols, rows, got.data());
    for (int64_t i = 0; i < rows; ++i)
      ASSERT_EQ(std::memcmp(&got[i * piece], b.data<float>() + i * cols + start, piece * 4), 0) << k << " row " << i;
  }
  // The quantised bytes are what is counted as read, not 4 bytes per value.
  EXPECT_LT(g.bytes_touched(), r.bytes_touched() / 3);
  // The model keeps the Q8_0 token_embd as its blocks (the logits above went through
  // them): 34 bytes per 32 weights, not an f32 copy.
  const TensorInfo& e = g.info("model.embed_tokens.weight");
  ASSERT_TRUE(e.quantized());
  auto m = load(path, DType::BF16, false);
  EXPECT_EQ(m->embedding_bytes(), e.nbytes);
  EXPECT_EQ(e.nbytes, static_cast<uint64_t>(e.shape[0] * e.shape[1] / 32 * 34));
}

// A quantised token_embd tied to the output (ERNIE-4.5: no output tensor): lookups read
// its Q8_0 blocks, lm_head packs their dequantised rows; the logits are those of the twin
// file whose token_embd holds the same values in F32, bit for bit, and the model keeps
// the blocks, not an f32 copy.
TEST(GgufCheckpoint, TiedQuantisedEmbeddingEqualsItsDequantisedTwin) {
  const auto f = fixture("ernie4_5_moe");
  const std::string q = kModels + "ernie4_5_moe-Q8_0-embd.gguf";
  expect_same_logits(q, kModels + "ernie4_5_moe-Q8_0-embd-ref.gguf", f.prompts);
  const Checkpoint ck = Checkpoint::open(q);
  const TensorInfo& e = ck.info("model.embed_tokens.weight");
  ASSERT_TRUE(e.quantized());
  EXPECT_EQ(load(q, DType::F32, false)->embedding_bytes(), e.nbytes);
  EXPECT_EQ(e.nbytes, static_cast<uint64_t>(e.shape[0] * e.shape[1] / 32 * 34));
}

// Q4_0 experts load into W4A8 int4 with no loss: every local expert's (u - z) * s is
// gguf-py's dequantised value, bit for bit, on one rank, under EP and under MoE-TP.
TEST(GgufCheckpoint, Q4_0ExpertsAreExactInt4) {
  const Checkpoint g = Checkpoint::open(kModels + "qwen3moe-quant.gguf");
  const Checkpoint r = Checkpoint::open(kModels + "qwen3moe-quant-ref");
  const MoeConfig cfg = MoeConfig::from_hf(g.config());
  struct Layout { int64_t begin, end; int tp_rank, tp_size; };
  for (const Layout lay : {Layout{0, -1, 0, 1}, Layout{2, 4, 0, 1}, Layout{1, 3, 1, 2}}) {
    MlpLoadOptions o;
    o.compute = DType::BF16;
    o.expert_begin = lay.begin;
    o.expert_end = lay.end;
    o.tp_rank = lay.tp_rank;
    o.tp_size = lay.tp_size;
    const MoeLayerWeights w = load_moe_layer(g, cfg, 0, o);
    ASSERT_EQ(w.w13.int4_group, 32);
    const int64_t I = cfg.moe_intermediate_size, Il = I / lay.tp_size, i0 = lay.tp_rank * Il, H = cfg.hidden_size;
    const int64_t n_local = (lay.end < 0 ? cfg.n_experts : lay.end) - lay.begin;
    for (int64_t e = 0; e < n_local; ++e) {
      const std::string p = fmt::format("model.layers.0.mlp.experts.{}.", lay.begin + e);
      const Tensor gate = r.view(p + "gate_proj.weight"), up = r.view(p + "up_proj.weight"),
                   down = r.view(p + "down_proj.weight");
      Tensor u, z, sc;
      unpack_expert_q4(w.w13, e, u, z, sc);
      for (int64_t n = 0; n < 2 * Il; ++n)
        for (int64_t k = 0; k < H; ++k) {
          const float got = (float(u.data<uint8_t>()[n * H + k]) - float(z.data<uint8_t>()[n * (H / 32) + k / 32])) *
                            sc.data<float>()[n * (H / 32) + k / 32];
          const float want = (n < Il ? gate : up).data<float>()[(i0 + n % Il) * H + k];
          ASSERT_EQ(got, want) << p << " w13 row " << n << " col " << k;
        }
      unpack_expert_q4(w.w2, e, u, z, sc);
      for (int64_t n = 0; n < H; ++n)
        for (int64_t k = 0; k < Il; ++k) {
          const float got = (float(u.data<uint8_t>()[n * Il + k]) - float(z.data<uint8_t>()[n * (Il / 32) + k / 32])) *
                            sc.data<float>()[n * (Il / 32) + k / 32];
          ASSERT_EQ(got, down.data<float>()[n * I + i0 + k]) << p << " w2 row " << n << " col " << k;
        }
    }
  }
}

// A Q4_0 linear (attn_output here) loads as an int4 linear with the same exactness, whole
// and as this rank's column (row-parallel) slice of 2.
TEST(GgufCheckpoint, Q4_0LinearIsExactInt4) {
  const Checkpoint g = Checkpoint::open(kModels + "qwen3moe-quant.gguf");
  const Checkpoint r = Checkpoint::open(kModels + "qwen3moe-quant-ref");
  const std::string key = "model.layers.0.self_attn.o_proj.weight";
  const Tensor want = r.view(key);  // [H, q_dim]
  const int64_t N = want.dim(0), K = want.dim(1);
  for (int size : {1, 2})
    for (int rank = 0; rank < size; ++rank) {
      LinearRead rd;
      rd.weight = TensorRead{key, {N, K}, size == 1 ? ShardRule::replicated() : ShardRule::row(), rank, size, 0};
      const Linear l = load_linear(g, rd, LinearOptions::keeping_int4(DType::BF16));
      ASSERT_EQ(l.w.int4_group, 32);
      Tensor u, z, sc;
      unpack_expert_q4(l.w, 0, u, z, sc);
      const int64_t Kl = K / size, k0 = rank * Kl, ng = Kl / 32;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < Kl; ++k)
          ASSERT_EQ((float(u.data<uint8_t>()[n * Kl + k]) - float(z.data<uint8_t>()[n * ng + k / 32])) *
                        sc.data<float>()[n * ng + k / 32],
                    want.data<float>()[n * K + k0 + k])
              << "rank " << rank << "/" << size << " row " << n << " col " << k;
    }
}

// With the experts and attn_output in int4 only the activations entering them are
// rounded (int8 per token), so the logits stay close to the all-f32 model's.
TEST(GgufCheckpoint, Q4_0ExpertsModelNearTheF32One) {
  const std::string path = kModels + "qwen3moe-quant.gguf";
  const std::vector<std::vector<int32_t>> prompts = {{3}, {1, 4, 1, 5, 9}, {2, 6, 5, 3, 5, 8, 9, 7, 9}};
  expect_codes_near_dequantised(path, path, prompts, "Q4_0 file with every coded weight in its codes vs dequantised f32");
}

// Every GGUF integer-coded type loads into its group-coded format without losing a bit:
// the K-quant file's experts (layer 0 as llama.cpp's Q4_K_M: gate, up Q4_K, down Q6_K;
// layer 1 gate Q5_K with up Q8_0 in one matrix, down Q5_1) unpack to the file's
// dequantised values (which QuantisedTypesGiveGgufPysDequantisedValues ties to gguf-py),
// on one rank, under EP and under MoE-TP (whose down slice of 128 of 256 inputs starts
// inside a K-quant block).
TEST(GgufCheckpoint, KQuantExpertsAreExactCodes) {
  const Checkpoint g = Checkpoint::open(kModels + "qwen3moe-kquant.gguf");
  const MoeConfig cfg = MoeConfig::from_hf(g.config());
  // Q4_K and Q6_K keep their super-block factors (when a slice holds whole 256-weight
  // blocks: not MoE-TP's down slice of 128); Q5_1 its f16 d and m per group; Q5_K with
  // Q8_0 in one matrix only f32 scales and offsets. Q6_K and Q5_1 in 6-bit codes (Q8_0's
  // need 8), Q6_K with its one zero point, 32.
  struct Want { CodedFormat w13, w2; };
  const Want want[] = {{{32, 4, true, 8}, {16, 6, false, 16, 32}}, {{32, 8, true}, {32, 6, true, 1}}};
  struct Layout { int64_t begin, end; int tp_rank, tp_size; };
  for (int64_t layer : {0, 1})
    for (const Layout lay : {Layout{0, -1, 0, 1}, Layout{2, 4, 0, 1}, Layout{1, 3, 1, 2}}) {
      MlpLoadOptions o;
      o.compute = DType::BF16;
      o.expert_begin = lay.begin;
      o.expert_end = lay.end;
      o.tp_rank = lay.tp_rank;
      o.tp_size = lay.tp_size;
      const MoeLayerWeights w = load_moe_layer(g, cfg, layer, o);
      CodedFormat w2_want = want[layer].w2;
      if (lay.tp_size > 1 && w2_want.sb_groups > 1) w2_want.sb_groups = 0;
      for (const auto& [got, f] : {std::pair{&w.w13, want[layer].w13}, std::pair{&w.w2, w2_want}}) {
        const CodedFormat c = coded_format(*got);
        EXPECT_EQ(c.sb_groups, f.sb_groups) << "layer " << layer;
        EXPECT_EQ(c.group, f.group) << "layer " << layer;
        EXPECT_EQ(c.bits, f.bits) << "layer " << layer;
        EXPECT_EQ(c.offsets, f.offsets) << "layer " << layer;
        EXPECT_EQ(c.zero, f.zero) << "layer " << layer;
      }
      const int64_t I = cfg.moe_intermediate_size, Il = I / lay.tp_size, i0 = lay.tp_rank * Il, H = cfg.hidden_size;
      const int64_t n_local = (lay.end < 0 ? cfg.n_experts : lay.end) - lay.begin;
      for (int64_t e = 0; e < n_local; ++e) {
        const std::string p = fmt::format("model.layers.{}.mlp.experts.{}.", layer, lay.begin + e);
        const Tensor gate = g.view(p + "gate_proj.weight"), up = g.view(p + "up_proj.weight"),
                     down = g.view(p + "down_proj.weight");
        const Tensor w13 = unpack_expert(w.w13, e), w2 = unpack_expert(w.w2, e);
        for (int64_t n = 0; n < 2 * Il; ++n)
          for (int64_t k = 0; k < H; ++k)
            ASSERT_EQ(w13.data<float>()[n * H + k], (n < Il ? gate : up).data<float>()[(i0 + n % Il) * H + k])
                << p << " w13 row " << n << " col " << k;
        for (int64_t n = 0; n < H; ++n)
          for (int64_t k = 0; k < Il; ++k)
            ASSERT_EQ(w2.data<float>()[n * Il + k], down.data<float>()[n * I + i0 + k]) << p << " w2 row " << n << " col " << k;
      }
    }
}

// Every coded linear of the quantised fixture (attn_q Q4_K, attn_k Q5_K, attn_v and
// lm_head Q6_K, attn_output Q4_0) holds gguf-py's dequantised values exactly, whole and
// as this rank's input slice of 2 (which for the K-quants starts mid-block).
TEST(GgufCheckpoint, CodedLinearsAreExact) {
  const Checkpoint g = Checkpoint::open(kModels + "qwen3moe-quant.gguf");
  const Checkpoint r = Checkpoint::open(kModels + "qwen3moe-quant-ref");
  for (const std::string key : {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                                "model.layers.0.self_attn.v_proj.weight", "lm_head.weight",
                                "model.layers.1.self_attn.o_proj.weight"}) {
    const Tensor want = r.view(key);
    const int64_t N = want.dim(0), K = want.dim(1);
    for (int size : {1, 2})
      for (int rank = 0; rank < size; ++rank) {
        LinearRead rd;
        rd.weight = TensorRead{key, {N, K}, size == 1 ? ShardRule::replicated() : ShardRule::row(), rank, size, 0};
        const Linear l = load_linear(g, rd, LinearOptions::keeping_int4(DType::BF16));
        ASSERT_GT(l.w.int4_group, 0) << key;
        const Tensor got = unpack_expert(l.w, 0);
        const int64_t Kl = K / size, k0 = rank * Kl;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < Kl; ++k)
            ASSERT_EQ(got.data<float>()[n * Kl + k], want.data<float>()[n * K + k0 + k])
                << key << " rank " << rank << "/" << size << " row " << n << " col " << k;
      }
  }
}

// With every weight in its codes only the activations entering them are rounded (int8
// per token), so the K-quant model's logits stay close to the same file dequantised to
// f32, and its experts take the coded bytes: 4.625 bits per weight for Q4_K (half a
// byte, per 32 an i8 scale and a u8 min factor, per 256 an f16 d and dmin; the file:
// 4.5), not 32.
TEST(GgufCheckpoint, KQuantModelNearTheF32One) {
  const std::string path = kModels + "qwen3moe-kquant.gguf";
  const std::vector<std::vector<int32_t>> prompts = {{3}, {1, 4, 1, 5, 9}, {2, 6, 5, 3, 5, 8, 9, 7, 9}};
  auto q = load(path, DType::F32, true), f = load(path, DType::F32, false);
  const Tensor lq = prefill_logits(*q, prompts), lf = prefill_logits(*f, prompts);
  const double worst = test::worst_logit_cosine(lq, lf, prompts);
  std::printf("[ gguf ] K-quant model in its codes vs dequantised f32: worst logit cosine %.9f\n", worst);
  EXPECT_GE(worst, 1 - 5e-3);
  EXPECT_LT(worst, 1.0);  // the coded path ran
  const Checkpoint g = Checkpoint::open(path);
  const MoeConfig cfg = MoeConfig::from_hf(g.config());
  const MoeLayerWeights w = load_moe_layer(g, cfg, 0, MlpLoadOptions{});
  const int64_t E = cfg.n_experts, I = cfg.moe_intermediate_size, H = cfg.hidden_size;
  EXPECT_EQ(w.w13.data.nbytes() + w.w13.w_sc.nbytes() + w.w13.w_mn.nbytes() + w.w13.w_sb_d.nbytes() +
                w.w13.w_sb_m.nbytes(),
            static_cast<size_t>(E * 2 * I * H / 2 + E * 2 * I * (H / 32) * 2 + E * 2 * I * (H / 256) * 4));
  EXPECT_EQ(int4_bytes_per_expert(w.w13) * E, static_cast<size_t>(E * 2 * I * H / 2 + E * 2 * I * (H / 32) * 2 +
                                                                  E * 2 * I * (H / 256) * 4));
}

TEST(GgufCheckpoint, ConfigIsTheSources) {
  for (const auto& [gguf, dir] : {std::pair{"qwen3_moe-BF16.gguf", "qwen3_moe"},
                                  std::pair{"qwen2_moe-F32-00001-of-00002.gguf", "qwen2_moe"}}) {
    const nlohmann::json c = Checkpoint::open(kModels + gguf).config();
    const nlohmann::json s = Checkpoint::open(std::string(MOE_FIXTURES_DIR) + "/" + dir).config();
    for (const char* k : {"model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                          "num_key_value_heads", "max_position_embeddings", "moe_intermediate_size",
                          "num_experts_per_tok", "norm_topk_prob", "vocab_size", "tie_word_embeddings"})
      EXPECT_EQ(c.at(k), s.at(k)) << gguf << " " << k;
    EXPECT_EQ(c.at("num_experts"), s.contains("num_experts") ? s.at("num_experts") : s.at("num_local_experts"));
    EXPECT_EQ(c.at("mlp_only_layers"), s.at("mlp_only_layers")) << gguf;
  }
  const nlohmann::json c = Checkpoint::open(kModels + "ernie4_5_moe-F32.gguf").config();
  const nlohmann::json s = Checkpoint::open(std::string(MOE_FIXTURES_DIR) + "/ernie4_5_moe").config();
  for (const char* k : {"model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                        "max_position_embeddings", "intermediate_size", "moe_intermediate_size", "moe_num_experts",
                        "moe_k", "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval",
                        "moe_num_shared_experts", "vocab_size", "tie_word_embeddings", "use_bias"})
    EXPECT_EQ(c.at(k), s.at(k)) << "ernie4_5_moe " << k;
  EXPECT_EQ(c.at("architectures"), s.at("architectures"));
}

TEST(GgufCheckpoint, ExpertsAreOneByteRangeEachAndEpReadsOnlyItsOwn) {
  const Checkpoint g = Checkpoint::open(kModels + "qwen3_moe-BF16.gguf");
  const TensorInfo& e0 = g.info("model.layers.0.mlp.experts.0.gate_proj.weight");
  const TensorInfo& e1 = g.info("model.layers.0.mlp.experts.1.gate_proj.weight");
  EXPECT_EQ(e0.shape, (Shape{24, 40}));
  EXPECT_EQ(e1.offset, e0.offset + e0.nbytes);  // stacked: expert 1 follows expert 0
  (void)g.view("model.layers.0.mlp.experts.1.gate_proj.weight");
  EXPECT_EQ(g.bytes_touched(), e1.nbytes);
}

// A GGUF written here: the qwen3 fixture's metadata with one key changed or a tensor
// renamed, so each error names exactly what is wrong.
std::string rewrite(const std::string& name, const std::string& from, const std::string& to,
                    const std::string& source = "qwen3_moe-BF16.gguf") {
  std::ifstream in(kModels + source, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = bytes.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  EXPECT_EQ(from.size(), to.size());
  bytes.replace(at, from.size(), to);
  const std::string out = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(out, std::ios::binary) << bytes;
  return out;
}

// The same with the u32 value of metadata key `key` (after the key and its 4-byte type)
// set to `value`.
std::string rewrite_u32(const std::string& name, const std::string& key, uint32_t value, const std::string& source) {
  std::ifstream in(kModels + source, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = bytes.find(key);
  EXPECT_NE(at, std::string::npos) << key;
  const uint32_t type = 4;  // GGUF_TYPE_UINT32
  EXPECT_EQ(std::memcmp(bytes.data() + at + key.size(), &type, 4), 0) << key << " is not a u32";
  std::memcpy(bytes.data() + at + key.size() + 4, &value, 4);
  const std::string out = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(out, std::ios::binary) << bytes;
  return out;
}

void expect_error(const std::string& path, const std::vector<std::string>& parts) {
  try {
    Checkpoint::open(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(GgufCheckpoint, BadFilesNameTheProblem) {
  // An unknown architecture.
  expect_error(rewrite("moe_gguf_arch2.gguf", "qwen3moe", "qwen9moe"), {"qwen9moe", "qwen3moe, qwen2moe, llama"});
  // A tensor the mapping does not know.
  expect_error(rewrite("moe_gguf_tensor.gguf", "blk.0.attn_q_norm", "blk.0.attn_x_norm"),
               {"blk.0.attn_x_norm", "not one this engine knows"});
  // A layer past block_count.
  expect_error(rewrite("moe_gguf_layer.gguf", "blk.2.attn_norm", "blk.7.attn_norm"), {"blk.7.attn_norm", "layer"});
  // A missing hparam.
  expect_error(rewrite("moe_gguf_key.gguf", "qwen3moe.expert_count", "qwen3moe.expert_cxunt"),
               {"qwen3moe.expert_count"});
  // ERNIE without leading_dense_block_count: layer 0 should then have experts.
  expect_error(rewrite("moe_gguf_ernie_lead.gguf", "ernie4_5-moe.leading_dense_block_count",
                       "ernie4_5-moe.leading_dense_block_cxunt", "ernie4_5_moe-F32.gguf"),
               {"layer 0 lacks ffn_gate_exps", "leading_dense_block_count 0"});
  // ERNIE's shared experts must have expert_shared_count x expert_feed_forward_length rows.
  expect_error(rewrite_u32("moe_gguf_ernie_shexp.gguf", "ernie4_5-moe.expert_shared_count", 2, "ernie4_5_moe-F32.gguf"),
               {"blk.2.ffn_up_shexp.weight", "expert_shared_count x expert_feed_forward_length = 2 x 16"});
  // DeepSeek's attn_k_b must be [heads, kv_lora_rank, qk_nope_head_dim].
  expect_error(rewrite_u32("moe_gguf_ds_rank.gguf", "deepseek2.attention.kv_lora_rank", 8, "deepseek_v3-F32.gguf"),
               {"attn_k_b.weight", "kv_lora_rank 8"});
  // An unknown gating function.
  expect_error(rewrite_u32("moe_gguf_ds_gating.gguf", "deepseek2.expert_gating_func", 7, "deepseek_v3-F32.gguf"),
               {"expert_gating_func is 7"});
}

TEST(GgufCheckpoint, OpenTellsAGgufFileByItsMagic) {
  EXPECT_TRUE(gguf::is_gguf_file(kModels + "qwen3_moe-BF16.gguf"));
  EXPECT_FALSE(gguf::is_gguf_file(std::string(MOE_FIXTURES_DIR) + "/qwen3_moe/config.json"));
  EXPECT_FALSE(gguf::is_gguf_file(std::string(MOE_FIXTURES_DIR) + "/qwen3_moe"));
  expect_error(std::string(MOE_FIXTURES_DIR) + "/qwen3_moe/config.json", {"not a directory (or a GGUF file)"});
}

}  // namespace
}  // namespace moe
