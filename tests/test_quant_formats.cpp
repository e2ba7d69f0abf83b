// Pre-quantised checkpoints (loader/quant_weights.h), written in the test from fixture
// weights by the test's own quantiser (test_quant_formats_util.h):
//   - xLLM SmoothQuant (qweight, per_channel_scale, smooth): the loaded layer equals the
//     engine's layer built through the API from the same int8 weights, bit for bit, and
//     is within cosine 0.999 of the fp32 layer; `moe-ep layer` / `forward` run it.
//   - FastDeploy static W8A8 (int8 up_gate_proj / down_proj, abs-max weight_scale,
//     activation_scale): the layer equals a plain scalar reference that quantises the
//     activations with the static scales, and is within cosine 0.99 of the fp32 layer.
//   - The static row quantiser: AVX-512 == scalar == its definition.
//   - Bad input: every error names the offending key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu.h"
#include "kernels/quant.h"
#include "loader/checkpoint.h"
#include "loader/moe_weights.h"
#include "loader/quant_weights.h"
#include "loader/safetensors.h"
#include "moe/fused_moe.h"
#include "test_quant_formats_util.h"
#include "test_quant_util.h"
#include "test_util.h"

namespace moe {
namespace {

constexpr const char* kSqFixture = "qwen3_moe";  // MoE layers 0 and 2; H 40, I 24, E 60, top-4
constexpr int64_t kSqLayer = 0;
constexpr const char* kStFixture = "ernie4_5_moe";  // MoE layers 1 and 2; H 32, I 16, E 12, top-3, shared expert
constexpr int64_t kStLayer = 1;

Tensor golden_input(const std::string& fixture, int64_t layer, int64_t T) {
  auto f = SafetensorsFile::open(test::fixtures_dir() + "/" + fixture + "/golden/L" + std::to_string(layer) + "_T" +
                                 std::to_string(T) + "_in.safetensors");
  return f->view("hidden_states").clone();
}

Tensor f32_view(const Checkpoint& ck, const std::string& key) {
  const Tensor v = ck.view(key).to(DType::F32);
  return v.reshape({v.numel()});
}

Tensor concat(const Tensor& a, const Tensor& b) {
  Shape s = a.shape();
  s[0] += b.dim(0);
  Tensor out = Tensor::empty(s, a.dtype());
  std::memcpy(out.raw(), a.raw(), a.nbytes());
  std::memcpy(static_cast<char*>(out.raw()) + a.nbytes(), b.raw(), b.nbytes());
  return out;
}

// The engine layer built through the API from a SmoothQuant checkpoint's int8 weights:
// pack_expert_q8 + set_expert_smooth with the engine's smooth = 1 / xLLM's multiplier.
MoeLayerWeights smoothquant_api_layer(const Checkpoint& ck, const MoeConfig& cfg, int64_t layer) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  const std::string blk = "model.layers." + std::to_string(layer) + ".mlp.";
  MoeLayerWeights w;
  w.expert_begin = 0;
  w.expert_end = E;
  w.gate = make_packed_experts(1, E, H, DType::F32, false);
  pack_expert(w.gate, 0, ck.view(blk + "gate.weight"));
  w.w13 = make_packed_experts(E, 2 * I, H, DType::I8, true);
  w.w2 = make_packed_experts(E, H, I, DType::I8, false);
  w.smooth_all = Tensor::empty({E, H}, DType::F32);
  auto inverse = [](const Tensor& m) {
    Tensor r = Tensor::empty({m.numel()}, DType::F32);
    for (int64_t i = 0; i < m.numel(); ++i) r.data<float>()[i] = 1.0f / m.data<float>()[i];
    return r;
  };
  for (int64_t e = 0; e < E; ++e) {
    const std::string b = blk + "experts." + std::to_string(e) + ".";
    pack_expert_q8(w.w13, e, concat(ck.view(b + "gate_proj.qweight"), ck.view(b + "up_proj.qweight")),
                   concat(f32_view(ck, b + "gate_proj.per_channel_scale"), f32_view(ck, b + "up_proj.per_channel_scale")));
    pack_expert_q8(w.w2, e, ck.view(b + "down_proj.qweight"), f32_view(ck, b + "down_proj.per_channel_scale"));
    const Tensor s1 = inverse(f32_view(ck, b + "up_proj.smooth"));
    std::memcpy(w.smooth_all.data<float>() + e * H, s1.raw(), H * 4);
    set_expert_smooth(w.w13, e, s1);
    set_expert_smooth(w.w2, e, inverse(f32_view(ck, b + "down_proj.smooth")));
  }
  return w;
}

TEST(QuantFormats, SmoothQuantCheckpointEqualsApiLayerAndIsCloseToF32) {
  test::TempDir dir;
  test::write_checkpoint(dir.path(), kSqFixture, test::smoothquant_tensors(kSqFixture, kSqLayer));
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  EXPECT_EQ(detect_quant_format(ck, cfg, kSqLayer), QuantFormat::SmoothQuant);
  EXPECT_EQ(detect_quant_format(ck, cfg, 2), QuantFormat::None);  // layer 2 stays float
  // The quantised keys belong to the name map: nothing unexpected, nothing missing.
  EXPECT_TRUE(unexpected_mlp_tensors(ck, cfg, kSqLayer).empty());
  for (const auto& p : check_mlp_block(ck, cfg, kSqLayer)) ADD_FAILURE() << p.message;
  MlpLoadOptions strict;
  strict.strict = true;
  MoeLayer loaded(cfg, load_moe_layer(ck, cfg, kSqLayer, strict));
  ASSERT_TRUE(loaded.quantized());
  EXPECT_FALSE(loaded.smooth_uniform());  // per-expert smooth vectors
  MoeLayer api(cfg, smoothquant_api_layer(ck, cfg, kSqLayer));
  MlpLoadOptions f32o;
  f32o.compute = DType::F32;
  MoeLayer f32(cfg, load_moe_layer(Checkpoint::open(test::fixtures_dir() + "/" + kSqFixture), cfg, kSqLayer, f32o));
  double worst = 1;
  for (int64_t T : {1, 7, 33}) {
    const Tensor x = golden_input(kSqFixture, kSqLayer, T);
    const Tensor y = loaded.forward(x);
    const Tensor ya = api.forward(x);
    EXPECT_EQ(0, std::memcmp(y.raw(), ya.raw(), y.nbytes())) << "T=" << T;
    const double cs = test::cosine(y, f32.forward(x));
    worst = std::min(worst, cs);
    EXPECT_GE(cs, 0.999) << "T=" << T;
  }
  std::printf("[ sq ckpt  ] %s layer %lld, xLLM SmoothQuant checkpoint: worst cosine vs f32 over T=1,7,33: %.6f\n",
              kSqFixture, static_cast<long long>(kSqLayer), worst);
}

// Mixtral's expert names (w1 / w3 / w2) take the same suffixes.
TEST(QuantFormats, SmoothQuantMixtralNames) {
  test::TempDir dir;
  test::write_checkpoint(dir.path(), "mixtral", test::smoothquant_tensors("mixtral", 0));
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  ASSERT_TRUE(ck.has("model.layers.0.block_sparse_moe.experts.3.w1.qweight"));
  EXPECT_EQ(detect_quant_format(ck, cfg, 0), QuantFormat::SmoothQuant);
  EXPECT_TRUE(unexpected_mlp_tensors(ck, cfg, 0).empty());
  MoeLayer loaded(cfg, load_moe_layer(ck, cfg, 0, {}));
  MlpLoadOptions f32o;
  f32o.compute = DType::F32;
  MoeLayer f32(cfg, load_moe_layer(Checkpoint::open(test::fixtures_dir() + "/mixtral"), cfg, 0, f32o));
  const Tensor x = golden_input("mixtral", 0, 33);
  EXPECT_GE(test::cosine(loaded.forward(x), f32.forward(x)), 0.999);
}

// MoE-TP: each rank holds its slice of I: gate/up rows with their scales, down columns
// and its slice of down's smooth vector.
TEST(QuantFormats, SmoothQuantTpSlices) {
  test::TempDir dir;
  test::write_checkpoint(dir.path(), kSqFixture, test::smoothquant_tensors(kSqFixture, kSqLayer));
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, Il = I / 2;
  const MoeLayerWeights full = load_moe_layer(ck, cfg, kSqLayer, {});
  for (int r = 0; r < 2; ++r) {
    MlpLoadOptions o;
    o.tp_rank = r;
    o.tp_size = 2;
    o.expert_begin = 10;
    o.expert_end = 13;
    const MoeLayerWeights part = load_moe_layer(ck, cfg, kSqLayer, o);
    for (int64_t le = 0; le < 3; ++le) {
      Tensor qf, sf, qp, sp;
      unpack_expert_q8(full.w13, 10 + le, qf, sf);
      unpack_expert_q8(part.w13, le, qp, sp);
      for (int half = 0; half < 2; ++half)  // gate rows, then up rows
        for (int64_t i = 0; i < Il; ++i) {
          const int64_t rf = half * I + r * Il + i, rp = half * Il + i;
          EXPECT_EQ(0, std::memcmp(qf.data<int8_t>() + rf * H, qp.data<int8_t>() + rp * H, H));
          EXPECT_EQ(sf.data<float>()[rf], sp.data<float>()[rp]);
        }
      unpack_expert_q8(full.w2, 10 + le, qf, sf);
      unpack_expert_q8(part.w2, le, qp, sp);
      for (int64_t h = 0; h < H; ++h) {
        EXPECT_EQ(sf.data<float>()[h], sp.data<float>()[h]);
        EXPECT_EQ(0, std::memcmp(qf.data<int8_t>() + h * I + r * Il, qp.data<int8_t>() + h * Il, Il));
      }
      EXPECT_EQ(0, std::memcmp(full.w2.smooth.data<float>() + (10 + le) * I + r * Il,
                               part.w2.smooth.data<float>() + le * Il, Il * 4));
    }
    EXPECT_EQ(0, std::memcmp(full.smooth_all.raw(), part.smooth_all.raw(), full.smooth_all.nbytes()));
  }
}

TEST(QuantFormats, SmoothQuantThroughTheCli) {
  test::TempDir dir;
  test::write_checkpoint(dir.path(), kSqFixture, test::smoothquant_tensors(kSqFixture, kSqLayer));
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  MoeLayer api(cfg, smoothquant_api_layer(ck, cfg, kSqLayer));
  const std::string in = test::fixtures_dir() + "/" + kSqFixture + "/golden/L0_T33_in.safetensors";
  std::string log;
  ASSERT_EQ(0, test::run_command(std::string(MOE_EP_BINARY) + " layer --quiet --strict --model " + dir.path() +
                                     " --layer 0 --input " + in + " --output " + dir / "out.safetensors",
                                 &log))
      << log;
  const Tensor y = SafetensorsFile::open(dir / "out.safetensors")->view("hidden_states").clone();
  const Tensor ya = api.forward(golden_input(kSqFixture, kSqLayer, 33));
  EXPECT_EQ(0, std::memcmp(y.raw(), ya.raw(), y.nbytes()));
  // Two ranks, each loading its 30 experts (and all 60 GEMM1 smooth vectors): the
  // same bytes as one rank.
  for (const char* comm : {"alltoall", "alltoall-ll --max-tokens-per-rank 40"}) {
    ASSERT_EQ(0, test::run_command("OMP_WAIT_POLICY=PASSIVE OMPI_MCA_mpi_yield_when_idle=1 timeout 120 mpirun "
                                   "--oversubscribe --allow-run-as-root -np 2 " +
                                       std::string(MOE_EP_BINARY) + " layer --quiet --model " + dir.path() +
                                       " --layer 0 --input " + in + " --output " + dir / "ep.safetensors" +
                                       " --ep 2 --moe-comm " + comm,
                                   &log))
        << log;
    const Tensor ye = SafetensorsFile::open(dir / "ep.safetensors")->view("hidden_states").clone();
    EXPECT_EQ(0, std::memcmp(ye.raw(), ya.raw(), ya.nbytes())) << comm;
  }
  // The whole model runs on it too (layer 0 quantised, the rest float): logits close to
  // the float model's.
  const std::string prompts = " --quiet --prompt-ids '3,17,42,5,9;7,1'";
  ASSERT_EQ(0, test::run_command(std::string(MOE_EP_BINARY) + " forward --model " + dir.path() + prompts +
                                     " --logits " + dir / "q.safetensors",
                                 &log))
      << log;
  ASSERT_EQ(0, test::run_command(std::string(MOE_EP_BINARY) + " forward --model " + test::fixtures_dir() + "/" +
                                     kSqFixture + prompts + " --logits " + dir / "f.safetensors",
                                 &log))
      << log;
  const Tensor lq = SafetensorsFile::open(dir / "q.safetensors")->view("logits").to(DType::F32);
  const Tensor lf = SafetensorsFile::open(dir / "f.safetensors")->view("logits").to(DType::F32);
  ASSERT_EQ(lq.shape(), lf.shape());
  EXPECT_GE(test::cosine(lq, lf), 0.999);
}

// ---- static activation scales ----------------------------------------------------

// The static quantiser: AVX-512 == scalar == the definition q = clamp(nearbyint(v / s)).
TEST(QuantFormats, StaticRowQuantiserMatchesDefinition) {
  const float s = 1.0f / 64;  // a power of two, so 2.5 * s / s is exactly the tie 2.5
  for (int64_t k : {1, 5, 16, 17, 40, 131}) {
    Tensor x = test::seeded({k}, 1.f, 40 + k);
    x.data<float>()[0] = 5.f;                  // saturates: 5 / s > 127
    if (k > 2) x.data<float>()[2] = 2.5f * s;  // a tie: rounds to even (2)
    if (k > 3) x.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();  // -> -127, as the dynamic rule
    const Tensor sm = test::seeded({k}, 0.5f, 90 + k, 0.5f, true);
    for (bool smooth : {false, true}) {
      const float* smp = smooth ? sm.data<float>() : nullptr;
      std::vector<char> ref(q8_row_bytes(k)), vec(q8_row_bytes(k), 1), def(q8_row_bytes(k), 0);
      quantize_row_q8_static_reference(x.data<float>(), smp, k, s, ref.data());
      quantize_row_q8_static(x.data<float>(), smp, k, s, vec.data());
      for (int64_t i = 0; i < k; ++i) {
        const float v = smp ? x.data<float>()[i] / smp[i] : x.data<float>()[i];
        const float r = std::nearbyint(v / s);
        def[i] = static_cast<char>(std::isnan(r) ? -127 : std::clamp(r, -127.f, 127.f));
      }
      std::memcpy(def.data() + q8_scale_offset(k), &s, 4);
      EXPECT_EQ(0, std::memcmp(ref.data(), def.data(), def.size())) << "k=" << k << " smooth " << smooth;
      EXPECT_EQ(0, std::memcmp(vec.data(), def.data(), def.size())) << "k=" << k << " smooth " << smooth;
      if (!smooth) {
        EXPECT_EQ(def[0], 127);  // saturated
        if (k > 2) {
          EXPECT_EQ(def[2], 2);  // the tie 2.5 rounds to even
        }
      }
    }
  }
}

// y = sum_j w_j * W2_e(Qs2(act(W13_e Qs1(x)))) + shared(x): the static-scale W8A8 layer
// written out in scalar loops from the checkpoint's int8 weights and abs-max scales.
Tensor static_reference(MoeLayer& layer, const Checkpoint& ck, int64_t L, const Tensor& x) {
  const MoeConfig& cfg = layer.config();
  const int64_t T = x.dim(0), H = cfg.hidden_size, I = cfg.moe_intermediate_size, k = cfg.top_k;
  const std::string blk = "model.layers." + std::to_string(L) + ".mlp.experts.";
  auto q8 = [](float v, float s) { return static_cast<int32_t>(std::clamp(std::nearbyint(v / s), -127.f, 127.f)); };
  Routing r;
  layer.route(x, r);
  const Tensor xf = x.to(DType::F32);
  const float s1 = f32_view(ck, blk + "up_gate_proj.activation_scale").data<float>()[0] / 127.0f;
  Tensor y = Tensor::zeros({T, H}, DType::F32);
  std::vector<int32_t> xq(H), hq(I);
  std::vector<float> v(2 * I), o(H);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) xq[h] = q8(xf.data<float>()[t * H + h], s1);
    for (int64_t j = 0; j < k; ++j) {
      const std::string b = blk + std::to_string(r.ids[t * k + j]) + ".";
      const Tensor ug = ck.view(b + "up_gate_proj.weight");  // int8 [H, 2I]
      const Tensor ugs = f32_view(ck, b + "up_gate_proj.weight_scale");
      const Tensor dn = ck.view(b + "down_proj.weight");  // int8 [I, H]
      const Tensor dns = f32_view(ck, b + "down_proj.weight_scale");
      const float s2 = f32_view(ck, b + "down_proj.activation_scale").data<float>()[0] / 127.0f;
      for (int64_t n = 0; n < 2 * I; ++n) {
        int32_t acc = 0;
        for (int64_t h = 0; h < H; ++h) acc += xq[h] * ug.data<int8_t>()[h * 2 * I + n];
        v[n] = static_cast<float>(acc) * s1 * (ugs.data<float>()[n] / 127.0f);
      }
      for (int64_t i = 0; i < I; ++i) hq[i] = q8(act_gate(cfg.act, v[i]) * v[I + i], s2);
      for (int64_t c = 0; c < H; ++c) {
        int32_t acc = 0;
        for (int64_t i = 0; i < I; ++i) acc += hq[i] * dn.data<int8_t>()[i * H + c];
        o[c] = static_cast<float>(acc) * s2 * (dns.data<float>()[c] / 127.0f);
      }
      const float wt = r.weights[t * k + j];
      for (int64_t c = 0; c < H; ++c) y.data<float>()[t * H + c] += wt * o[c];
    }
  }
  Tensor sh = Tensor::zeros({T, H}, DType::F32);
  layer.shared_experts(x, sh.data<float>(), /*accumulate=*/false);
  for (int64_t i = 0; i < T * H; ++i) y.data<float>()[i] += sh.data<float>()[i];
  return y;
}

Tensor calibration_rows(int64_t H) { return test::seeded({64, H}, 1.f, 2024); }

TEST(QuantFormats, StaticScaleCheckpointEqualsScalarReferenceAndIsCloseToF32) {
  test::TempDir dir;
  test::write_checkpoint(dir.path(), kStFixture, test::static_w8a8_tensors(kStFixture, kStLayer, calibration_rows(32)));
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  EXPECT_EQ(detect_quant_format(ck, cfg, kStLayer), QuantFormat::StaticW8A8);
  EXPECT_TRUE(unexpected_mlp_tensors(ck, cfg, kStLayer).empty());
  for (const auto& p : check_mlp_block(ck, cfg, kStLayer)) ADD_FAILURE() << p.message;
  MlpLoadOptions strict;
  strict.strict = true;
  MoeLayer loaded(cfg, load_moe_layer(ck, cfg, kStLayer, strict));
  ASSERT_TRUE(loaded.quantized());
  ASSERT_TRUE(loaded.weights().w13.act_scale.defined() && loaded.weights().w2.act_scale.defined());
  EXPECT_TRUE(loaded.smooth_uniform());  // one static scale for all experts, no smooth
  MlpLoadOptions f32o;
  f32o.compute = DType::F32;
  MoeLayer f32(cfg, load_moe_layer(Checkpoint::open(test::fixtures_dir() + "/" + kStFixture), cfg, kStLayer, f32o));
  double worst = 1;
  for (int64_t T : {1, 7, 33}) {
    const Tensor x = golden_input(kStFixture, kStLayer, T);
    const Tensor y = loaded.forward(x);
    const Tensor ref = static_reference(loaded, ck, kStLayer, x);
    EXPECT_EQ(0, std::memcmp(y.raw(), ref.raw(), y.nbytes())) << "T=" << T;
    const double cs = test::cosine(y, f32.forward(x));
    worst = std::min(worst, cs);
    EXPECT_GE(cs, 0.99) << "T=" << T;
    // bf16 input rows take the same path (converted to f32 before quantising).
    const Tensor yb = loaded.forward(x.to(DType::BF16));
    EXPECT_EQ(0, std::memcmp(yb.raw(), y.raw(), y.nbytes())) << "bf16 input, T=" << T;  // inputs are bf16-exact
  }
  std::printf("[ st ckpt  ] %s layer %lld, static W8A8 checkpoint: worst cosine vs f32 over T=1,7,33: %.6f\n",
              kStFixture, static_cast<long long>(kStLayer), worst);
  // Every ISA gives the reference's bits (the shared experts are f32 here).
  for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx}) {
    set_isa_cap(isa);
    const Tensor x = golden_input(kStFixture, kStLayer, 7);
    const Tensor y = loaded.forward(x), ref = static_reference(loaded, ck, kStLayer, x);
    EXPECT_EQ(0, std::memcmp(y.raw(), ref.raw(), y.nbytes())) << isa_name(isa);
  }
  set_isa_cap(kTopIsa);
}

TEST(QuantFormats, StaticTpSlices) {
  test::TempDir dir;
  test::write_checkpoint(dir.path(), kStFixture, test::static_w8a8_tensors(kStFixture, kStLayer, calibration_rows(32)));
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, Il = I / 2;
  const MoeLayerWeights full = load_moe_layer(ck, cfg, kStLayer, {});
  for (int r = 0; r < 2; ++r) {
    MlpLoadOptions o;
    o.tp_rank = r;
    o.tp_size = 2;
    const MoeLayerWeights part = load_moe_layer(ck, cfg, kStLayer, o);
    for (int64_t e : {0, 5, 11}) {
      Tensor qf, sf, qp, sp;
      unpack_expert_q8(full.w13, e, qf, sf);
      unpack_expert_q8(part.w13, e, qp, sp);
      for (int half = 0; half < 2; ++half)
        for (int64_t i = 0; i < Il; ++i) {
          const int64_t rf = half * I + r * Il + i, rp = half * Il + i;
          EXPECT_EQ(0, std::memcmp(qf.data<int8_t>() + rf * H, qp.data<int8_t>() + rp * H, H));
          EXPECT_EQ(sf.data<float>()[rf], sp.data<float>()[rp]);
        }
      unpack_expert_q8(full.w2, e, qf, sf);
      unpack_expert_q8(part.w2, e, qp, sp);
      for (int64_t h = 0; h < H; ++h)
        EXPECT_EQ(0, std::memcmp(qf.data<int8_t>() + h * I + r * Il, qp.data<int8_t>() + h * Il, Il));
      EXPECT_EQ(full.w2.act_scale.data<float>()[e], part.w2.act_scale.data<float>()[e]);
    }
  }
}

// ---- bad input ---------------------------------------------------------------------

using Edit = std::function<void(test::Tensors&)>;

// Writes `base` edited by `edit`, loads the layer, and expects an error containing each
// of `needles` (always the key, the layer and, where a file is involved, the file).
void expect_load_error(const std::string& fixture, int64_t layer, const test::Tensors& base, const Edit& edit,
                       const std::vector<std::string>& needles) {
  test::TempDir dir;
  test::Tensors ts = base;
  edit(ts);
  test::write_checkpoint(dir.path(), fixture, ts);
  Checkpoint ck = Checkpoint::open(dir.path());
  const MoeConfig cfg = MoeConfig::from_hf(ck.config());
  try {
    load_moe_layer(ck, cfg, layer, {});
    ADD_FAILURE() << "no error for " << needles[0];
  } catch (const Error& e) {
    for (const std::string& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

// An int8 weight stored as f32 instead (Tensor::to converts float types only).
Tensor int8_as_f32(const Tensor& q) {
  Tensor t = Tensor::empty(q.shape(), DType::F32);
  for (int64_t i = 0; i < q.numel(); ++i) t.data<float>()[i] = q.data<int8_t>()[i];
  return t;
}

Tensor f32_of(const std::vector<float>& v, const Shape& s) {
  Tensor t = Tensor::empty(s, DType::F32);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

TEST(QuantFormats, SmoothQuantBadInputNamesTheKey) {
  const test::Tensors base = test::smoothquant_tensors(kSqFixture, kSqLayer);
  const std::string b = "model.layers.0.mlp.experts.";
  const std::string file = "model.safetensors";
  auto poke = [](const std::string& key, int64_t i, float v) {
    return [=](test::Tensors& ts) {
      Tensor* t = test::find_tensor(ts, key);
      ASSERT_TRUE(t) << key;
      *t = t->clone();
      t->data<float>()[i] = v;
    };
  };
  // per_channel_scale of the wrong shape: both shapes named.
  expect_load_error(kSqFixture, 0, base,
                    [&](test::Tensors& ts) {
                      *test::find_tensor(ts, b + "3.up_proj.per_channel_scale") = Tensor::zeros({25}, DType::F32);
                    },
                    {b + "3.up_proj.per_channel_scale", "layer 0", file, "[25]", "[24]"});
  // A smooth vector missing for one expert (5 has up_proj's only).
  expect_load_error(kSqFixture, 0, base, [&](test::Tensors& ts) { test::erase_tensor(ts, b + "5.up_proj.smooth"); },
                    {b + "5.up_proj.smooth", "missing smooth for expert 5", "layer 0"});
  expect_load_error(kSqFixture, 0, base, [&](test::Tensors& ts) { test::erase_tensor(ts, b + "7.down_proj.smooth"); },
                    {b + "7.down_proj.smooth", "missing smooth for expert 7"});
  // qweight not int8.
  expect_load_error(kSqFixture, 0, base,
                    [&](test::Tensors& ts) {
                      Tensor* t = test::find_tensor(ts, b + "2.gate_proj.qweight");
                      *t = int8_as_f32(*t);
                    },
                    {b + "2.gate_proj.qweight", "dtype f32", "i8", file});
  // Non-positive or non-finite scales and smooth vectors.
  expect_load_error(kSqFixture, 0, base, poke(b + "4.down_proj.per_channel_scale", 3, 0.f),
                    {b + "4.down_proj.per_channel_scale", "must be finite and > 0", file});
  expect_load_error(kSqFixture, 0, base, poke(b + "9.up_proj.per_channel_scale", 0, INFINITY),
                    {b + "9.up_proj.per_channel_scale", "inf"});
  expect_load_error(kSqFixture, 0, base, poke(b + "6.up_proj.smooth", 1, -1.f), {b + "6.up_proj.smooth", "-1"});
  expect_load_error(kSqFixture, 0, base, poke(b + "8.down_proj.smooth", 0, NAN), {b + "8.down_proj.smooth", "nan"});
  // gate_proj and up_proj smooth vectors that disagree.
  expect_load_error(kSqFixture, 0, base, poke(b + "0.gate_proj.smooth", 2, 3.f),
                    {b + "0.gate_proj.smooth", b + "0.up_proj.smooth", "same input"});
  // A missing qweight of one expert while the others are there.
  expect_load_error(kSqFixture, 0, base, [&](test::Tensors& ts) { test::erase_tensor(ts, b + "11.down_proj.qweight"); },
                    {b + "11.down_proj.qweight", "missing", "[40, 24]"});
  // check_mlp_block (inspect) reports the same problems from the headers.
  {
    test::TempDir dir;
    test::Tensors ts = base;
    *test::find_tensor(ts, b + "3.up_proj.per_channel_scale") = Tensor::zeros({25}, DType::F32);
    test::write_checkpoint(dir.path(), kSqFixture, ts);
    Checkpoint ck = Checkpoint::open(dir.path());
    const auto problems = check_mlp_block(ck, MoeConfig::from_hf(ck.config()), 0);
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_EQ(problems[0].kind, TensorProblem::WrongShape);
    EXPECT_EQ(problems[0].key, b + "3.up_proj.per_channel_scale");
  }
}

TEST(QuantFormats, StaticBadInputNamesTheKey) {
  const test::Tensors base = test::static_w8a8_tensors(kStFixture, kStLayer, calibration_rows(32));
  const std::string b = "model.layers.1.mlp.experts.";
  auto set = [](const std::string& key, Tensor v) {
    return [=](test::Tensors& ts) {
      Tensor* t = test::find_tensor(ts, key);
      ASSERT_TRUE(t) << key;
      *t = v;
    };
  };
  expect_load_error(kStFixture, 1, base, set(b + "2.down_proj.weight_scale", f32_of(std::vector<float>(33, 1.f), {33})),
                    {b + "2.down_proj.weight_scale", "layer 1", "[33]", "[32]", "model.safetensors"});
  expect_load_error(kStFixture, 1, base, [&](test::Tensors& ts) { test::erase_tensor(ts, b + "up_gate_proj.activation_scale"); },
                    {b + "up_gate_proj.activation_scale", "missing"});
  expect_load_error(kStFixture, 1, base, [&](test::Tensors& ts) { test::erase_tensor(ts, b + "4.down_proj.activation_scale"); },
                    {b + "4.down_proj.activation_scale", "missing"});
  expect_load_error(kStFixture, 1, base, set(b + "up_gate_proj.activation_scale", f32_of({0.f}, {1})),
                    {b + "up_gate_proj.activation_scale", "must be finite and > 0"});
  expect_load_error(kStFixture, 1, base, set(b + "3.down_proj.activation_scale", f32_of({NAN}, {1})),
                    {b + "3.down_proj.activation_scale", "nan"});
  expect_load_error(kStFixture, 1, base, set(b + "0.up_gate_proj.weight_scale", f32_of(std::vector<float>(32, -1.f), {32})),
                    {b + "0.up_gate_proj.weight_scale", "-1"});
  expect_load_error(kStFixture, 1, base,
                    [&](test::Tensors& ts) {
                      Tensor* t = test::find_tensor(ts, b + "6.up_gate_proj.weight");
                      *t = int8_as_f32(*t);
                    },
                    {b + "6.up_gate_proj.weight", "dtype f32", "i8"});
  // The shared activation scale stored per expert: the copies must agree.
  expect_load_error(kStFixture, 1, base,
                    [&](test::Tensors& ts) {
                      const Tensor a = *test::find_tensor(ts, b + "up_gate_proj.activation_scale");
                      test::erase_tensor(ts, b + "up_gate_proj.activation_scale");
                      for (int e = 0; e < 12; ++e)
                        ts.emplace_back(b + std::to_string(e) + ".up_gate_proj.activation_scale",
                                        e == 9 ? f32_of({2.f * a.data<float>()[0]}, {1}) : a.clone());
                    },
                    {b + "9.up_gate_proj.activation_scale", "shared by all experts"});
}

// Per-expert copies of the shared activation scale that agree load like the shared key.
TEST(QuantFormats, StaticPerExpertCopiesOfTheSharedScale) {
  test::TempDir a, c;
  test::Tensors ts = test::static_w8a8_tensors(kStFixture, kStLayer, calibration_rows(32));
  test::write_checkpoint(a.path(), kStFixture, ts);
  const std::string key = "model.layers.1.mlp.experts.up_gate_proj.activation_scale";
  const Tensor s = *test::find_tensor(ts, key);
  test::erase_tensor(ts, key);
  for (int e = 0; e < 12; ++e)
    ts.emplace_back("model.layers.1.mlp.experts." + std::to_string(e) + ".up_gate_proj.activation_scale", s.clone());
  test::write_checkpoint(c.path(), kStFixture, ts);
  Checkpoint cka = Checkpoint::open(a.path()), ckc = Checkpoint::open(c.path());
  const MoeConfig cfg = MoeConfig::from_hf(cka.config());
  MoeLayer la(cfg, load_moe_layer(cka, cfg, kStLayer, {})), lc(cfg, load_moe_layer(ckc, cfg, kStLayer, {}));
  EXPECT_TRUE(unexpected_mlp_tensors(ckc, cfg, kStLayer).empty());
  const Tensor x = golden_input(kStFixture, kStLayer, 7);
  const Tensor ya = la.forward(x), yc = lc.forward(x);
  EXPECT_EQ(0, std::memcmp(ya.raw(), yc.raw(), ya.nbytes()));
}

}  // namespace
}  // namespace moe
