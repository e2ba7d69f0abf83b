// GPTQ, AWQ and compressed-tensors int4 checkpoints (loader/hf_int4/hf_int4.h): every
// int4 weight loads into the W4A8 int4 format with (u - z) * s equal, bit for bit, to the
// format's own package's dequantisation (tests/fixtures/hf_int4/<name>-ref, written by
// tools/gen_hf_int4_fixtures.py with compressed-tensors, AutoAWQ and, for act order,
// GPTQModel), for experts under EP
// and MoE-TP and for linears under TP; dequantised, the model gives the reference
// directory's logits bit for bit; in int4 it stays within the int8 activations' rounding
// of them; bad files fail with errors that name the tensor or key.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <tuple>

#include "core/check.h"
#include "kernels/grouped_gemm_int4.h"
#include "kernels/quant.h"
#include "loader/checkpoint.h"
#include "loader/hf_int4/hf_int4.h"
#include "loader/inventory.h"
#include "loader/moe_weights.h"
#include "loader/quant_config.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/registry.h"
#include "model/weights.h"
#include "moe/config.h"
#include "runtime/generate.h"
#include "test_model_util.h"
#include "test_isa.h"
#include "test_mutate.h"

namespace moe {
namespace {

using json = nlohmann::json;

const std::string kDir = std::string(MOE_FIXTURES_DIR) + "/hf_int4/";
const std::vector<std::string> kVariants = {"gptq_sym_g32",  "gptq_asym_g64", "gptq_v2_asym_channel",
                                            "awq_g32",       "ct_sym_g32",    "ct_asym_channel"};
const std::vector<std::vector<int32_t>> kPrompts = {{3}, {1, 4, 1, 5, 9}, {2, 6, 5, 3, 5, 8, 9, 7, 9, 60}};
// Int4ModelNearTheReference: only the int8 rounding of the int4 layers' inputs (per token,
// absmax / 127) differs from the f32 reference. Measured worst 1 - cosine over the six
// fixtures: about 1e-5 (attention and experts all int4); 1e-3 is GGUF Q4_0's bound
// (test_gguf_checkpoint.cpp) and leaves a wide margin.
constexpr double kInt4Cosine = 1 - 1e-3;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::unique_ptr<Model> load(const std::string& dir, DType dt, bool int4) {
  ModelOptions o;
  o.dtype = dt;
  o.n_slots = 3;
  o.max_seq = 32;
  o.gguf_q4_0_as_int4 = int4;
  return Model::load(dir, o);
}

// (u - z) * s of row n, column k of an unpacked int4 matrix with `group`.
float value(const Tensor& u, const Tensor& z, const Tensor& s, int64_t n, int64_t k, int64_t group) {
  const int64_t K = u.dim(1), ng = int4_n_groups(K, group);
  return (float(u.data<uint8_t>()[n * K + k]) - float(z.data<uint8_t>()[n * ng + k / group])) *
         s.data<float>()[n * ng + k / group];
}

// A compressed-tensors pack-quantized config whose ignore list is `ignore`.
QuantConfig ct_with_ignore(const json& ignore) {
  const json w = {{"num_bits", 4}, {"type", "int"}, {"strategy", "channel"}};
  return parse_quant_config(json{{"quantization_config",
                                  {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
                                   {"config_groups", {{"group_0", {{"weights", w}}}}}, {"ignore", ignore}}}});
}

TEST(HfInt4Config, ParsesGptqAwqAndCompressedTensors) {
  auto cfg = [](json q) { return json{{"quantization_config", q}}; };
  QuantConfig g = parse_quant_config(cfg({{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128},
                                          {"sym", false}, {"desc_act", true}, {"checkpoint_format", "gptq_v2"}}));
  EXPECT_TRUE(g.int4());
  EXPECT_EQ(g.method, QuantConfig::Method::Gptq);
  EXPECT_EQ(g.group_size, 128);
  EXPECT_FALSE(g.sym);
  EXPECT_TRUE(g.desc_act);
  EXPECT_FALSE(g.gptq_v1);
  const QuantConfig a = parse_quant_config(cfg({{"quant_method", "awq"}, {"bits", 4}, {"group_size", 64},
                                                {"version", "gemm"}, {"zero_point", true},
                                                {"modules_to_not_convert", {"gate"}}}));
  EXPECT_EQ(a.method, QuantConfig::Method::Awq);
  EXPECT_TRUE(a.ignores("model.layers.0.mlp.gate"));
  EXPECT_FALSE(a.ignores("model.layers.0.mlp.experts.0.gate_proj"));
  const json w = {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "channel"}};
  const QuantConfig c = parse_quant_config(
      cfg({{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
           {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", w}}}}},
           {"ignore", {"lm_head", "re:.*mlp\\.gate$"}}}));
  EXPECT_EQ(c.method, QuantConfig::Method::CompressedTensors);
  EXPECT_EQ(c.group_size, -1);
  EXPECT_TRUE(c.ignores("lm_head"));
  EXPECT_TRUE(c.ignores("model.layers.3.mlp.gate"));
  EXPECT_FALSE(c.ignores("model.layers.3.mlp.gate_proj"));

  json ct = cfg({{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
                 {"config_groups", {{"group_0", {{"weights", w}}}}}})["quantization_config"];
  auto with = [&](const std::function<void(json&)>& f) {
    json q = ct;
    f(q);
    return q;
  };
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"quant_method", "gptq"}, {"bits", 8}, {"group_size", 128}}, "quantization_config.bits 8 is not supported"},
      {{{"quant_method", "gptq"}, {"bits", 4}}, "quantization_config.group_size missing"},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 16}}, "group_size 16 is not supported"},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"checkpoint_format", "marlin"}},
       "checkpoint_format \"marlin\""},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"sym", "yes"}}, "quantization_config.sym must"},
      {{{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"version", "gemv"}}, "version \"gemv\""},
      {{{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}, {"zero_point", false}}, "zero_point false"},
      {with([](json& q) { q["format"] = "float-quantized"; }), "format \"float-quantized\""},
      {with([](json& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 8; }), "num_bits 8"},
      {with([](json& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "tensor"; }),
       "strategy \"tensor\""},
      {with([](json& q) { q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}}; }),
       "input_activations is set"},
      {with([](json& q) { q.erase("config_groups"); }), "config_groups must be"},
      // Module regexes RE2 cannot run (backreferences, lookaround: no linear-time match),
      // that do not parse, or whose program passes the memory bound.
      {with([](json& q) { q["ignore"] = {"re:(a)\\1"}; }), "entry \"re:(a)\\\\1\" is not a regex moe-ep can run"},
      {with([](json& q) { q["ignore"] = {"lm_head", "re:model(?=\\.)"}; }), "is not a regex moe-ep can run"},
      {with([](json& q) { q["ignore"] = {"re:[a-"}; }), "missing ]"},
      {with([](json& q) { q["ignore"] = {"re:((((a{100}){100}){100}){100})"}; }), "is not a regex moe-ep can run"},
      {with([](json& q) { q["ignore"] = json(std::vector<std::string>(1025, "re:.*gate")); }),
       "more than 1024 \"re:\" module patterns"},
  };
  for (const auto& [q, want] : bad) {
    const std::string msg = error_of([&] { parse_quant_config(cfg(q)); });
    EXPECT_NE(msg.find(want), std::string::npos) << q.dump() << ": " << msg;
  }
}

// compressed-tensors leaves a module unquantised when re.match(entry[3:], module) holds:
// anchored at the start only. Every (entry, module) pair of the table Python's re wrote
// (tools/gen_module_regex_cases.py) gives the same answer here.
TEST(HfInt4Config, ModuleRegexAsPython) {
  std::ifstream in(kDir + "module_regex_cases.json");
  ASSERT_TRUE(in) << kDir << "module_regex_cases.json";
  const json doc = json::parse(in);
  ASSERT_GE(doc["cases"].size(), 300u);
  int matches = 0;
  for (const auto& c : doc["cases"]) {
    const std::string entry = c["entry"], module = c["module"];
    EXPECT_EQ(ct_with_ignore({entry}).ignores(module), c["match"].get<bool>()) << entry << " on " << module;
    matches += c["match"].get<bool>();
  }
  EXPECT_GT(matches, 20);  // the table holds both answers
}

// Patterns a backtracking matcher takes exponential time on, against long names: RE2
// answers in linear time (Python's re, and std::regex, would not return).
TEST(HfInt4Config, ModuleRegexLinearOnHostilePatterns) {
  auto ignores = [](const std::string& entry, const std::string& module) {
    return ct_with_ignore({entry}).ignores(module);
  };
  const std::string as(5000, 'a');
  EXPECT_FALSE(ignores("re:(a*)*b", as));
  EXPECT_TRUE(ignores("re:(a*)*b", as + "b"));
  EXPECT_FALSE(ignores("re:(.*)*x$", as));
  EXPECT_TRUE(ignores("re:(.*)*x$", as + "x"));
  EXPECT_FALSE(ignores("re:(a|aa)*c", as));
  EXPECT_FALSE(ignores("re:.*.*.*.*.*.*.*.*x", as));
}

// Every local expert's (u - z) * s is the reference's dequantised value, bit for bit, on
// one rank, under EP (experts [2, 4)) and under EP with MoE-TP (rank 1 of 2's I slice).
TEST(HfInt4Loader, ExpertsAreExactInt4) {
  for (const std::string& name : kVariants) {
    SCOPED_TRACE(name);
    const Checkpoint q = Checkpoint::open(kDir + name), r = Checkpoint::open(kDir + name + "-ref");
    const MoeConfig cfg = MoeConfig::from_hf(q.config());
    struct Layout { int64_t begin, end; int tp_rank, tp_size; };
    for (const Layout lay : {Layout{0, -1, 0, 1}, Layout{2, 4, 0, 1}, Layout{1, 3, 1, 2}})
      for (int64_t layer = 0; layer < cfg.n_layers; ++layer) {
        MlpLoadOptions o;
        o.compute = DType::BF16;
        o.expert_begin = lay.begin;
        o.expert_end = lay.end;
        o.tp_rank = lay.tp_rank;
        o.tp_size = lay.tp_size;
        o.strict = true;  // no tensor of the int4 layout is unexpected
        const MoeLayerWeights w = load_moe_layer(q, cfg, layer, o);
        const int64_t group = w.w13.int4_group;
        ASSERT_EQ(group, hf_int4::kernel_group(q));
        ASSERT_EQ(w.w2.int4_group, group);
        const int64_t I = cfg.moe_intermediate_size, Il = I / lay.tp_size, i0 = lay.tp_rank * Il, H = cfg.hidden_size;
        const int64_t n_local = (lay.end < 0 ? cfg.n_experts : lay.end) - lay.begin;
        for (int64_t e = 0; e < n_local; ++e) {
          const std::string p = fmt::format("model.layers.{}.mlp.experts.{}.", layer, lay.begin + e);
          const Tensor gate = r.view(p + "gate_proj.weight"), up = r.view(p + "up_proj.weight"),
                       down = r.view(p + "down_proj.weight");
          Tensor u, z, sc;
          unpack_expert_q4(w.w13, e, u, z, sc);
          for (int64_t n = 0; n < 2 * Il; ++n)
            for (int64_t k = 0; k < H; ++k)
              ASSERT_EQ(value(u, z, sc, n, k, group), (n < Il ? gate : up).data<float>()[(i0 + n % Il) * H + k])
                  << p << " w13 row " << n << " col " << k;
          unpack_expert_q4(w.w2, e, u, z, sc);
          for (int64_t n = 0; n < H; ++n)
            for (int64_t k = 0; k < Il; ++k)
              ASSERT_EQ(value(u, z, sc, n, k, group), down.data<float>()[n * I + i0 + k])
                  << p << " w2 row " << n << " col " << k;
        }
      }
  }
}

// Attention projections load as int4 linears with the same exactness: whole, as a
// row-parallel (input-column) slice and as a column-parallel (output-row) slice of 2.
TEST(HfInt4Loader, LinearsAreExactInt4) {
  for (const std::string& name : kVariants) {
    SCOPED_TRACE(name);
    const Checkpoint q = Checkpoint::open(kDir + name), r = Checkpoint::open(kDir + name + "-ref");
    for (const char* mod : {"self_attn.o_proj", "self_attn.k_proj"}) {
      const std::string key = fmt::format("model.layers.1.{}.weight", mod);
      ASSERT_TRUE(hf_int4::is_int4_weight(q, key)) << key;
      const Tensor want = r.view(key);
      const int64_t N = want.dim(0), K = want.dim(1);
      for (const ShardRule& rule : {ShardRule::replicated(), ShardRule::row(), ShardRule::column()})
        for (int size : {1, 2}) {
          if (rule.kind == ShardKind::Replicated && size == 2) continue;
          for (int rank = 0; rank < size; ++rank) {
            LinearRead rd;
            rd.weight = TensorRead{key, {N, K}, rule, rank, size, 1};
            const Linear l = load_linear(q, rd, LinearOptions::keeping_int4(DType::BF16));
            const int64_t group = l.w.int4_group;
            ASSERT_EQ(group, hf_int4::kernel_group(q));
            Tensor u, z, sc;
            unpack_expert_q4(l.w, 0, u, z, sc);
            const bool rows = rule.kind == ShardKind::Column;
            const int64_t Nl = rows ? N / size : N, Kl = rows ? K : K / size;
            const int64_t n0 = rows ? rank * Nl : 0, k0 = rows ? 0 : rank * Kl;
            ASSERT_EQ(u.dim(0), Nl);
            ASSERT_EQ(u.dim(1), Kl);
            for (int64_t n = 0; n < Nl; ++n)
              for (int64_t k = 0; k < Kl; ++k)
                ASSERT_EQ(value(u, z, sc, n, k, group), want.data<float>()[(n0 + n) * K + k0 + k])
                    << key << " " << rule.describe() << " rank " << rank << "/" << size << " row " << n << " col "
                    << k;
            // Dequantised: the same values as f32 (load_f32, the float path).
            const Tensor d = load_f32(q, rd.weight);
            for (int64_t n = 0; n < Nl; ++n)
              for (int64_t k = 0; k < Kl; ++k)
                ASSERT_EQ(d.data<float>()[n * Kl + k], want.data<float>()[(n0 + n) * K + k0 + k]);
          }
        }
    }
  }
}

// A true act-order g_idx (GPTQ desc_act: a group's columns scattered): a linear stays
// int4 with its input columns sorted by group and its input gathered in that order
// (PackedExperts::in_perm), values unchanged; where no order makes groups whole (an expert whose
// gate and up are in different orders; a TP slice holding part of a group) the weight loads
// dequantised exactly, each column with the scale and zero point of its g_idx group (an
// expert: its whole layer's experts); the other weights stay int4.
TEST(HfInt4Loader, ActOrderGIdxLoadsDequantisedExactly) {
  const std::string attn = "model.layers.0.self_attn.q_proj", ex = "model.layers.1.mlp.experts.2.up_proj";
  test::TempDir d;
  test::mutate_fixture(
      "hf_int4/gptq_sym_g32", d.path(),
      [&](test::Tensors& ts) {
        for (const std::string& m : {attn, ex}) {
          int32_t* g = test::find_tensor(ts, m + ".g_idx")->data<int32_t>();
          std::swap(g[0], g[40]);  // column 0 in group 1, column 40 in group 0
        }
      },
      [](json& c) { c["quantization_config"]["desc_act"] = true; });
  const Checkpoint a = Checkpoint::open(d.path()), orig = Checkpoint::open(kDir + "gptq_sym_g32"),
                   ref = Checkpoint::open(kDir + "gptq_sym_g32-ref");
  for (const std::string& m : {attn, ex}) {
    SCOPED_TRACE(m);
    const Tensor want = ref.view(m + ".weight");
    const int64_t N = want.dim(0), K = want.dim(1), ng = K / 32;
    const TensorRead rd{m + ".weight", {N, K}, ShardRule::replicated(), 0, 1, -1};
    EXPECT_TRUE(hf_int4::int4_exact(orig, rd));
    EXPECT_FALSE(hf_int4::int4_exact(a, rd));
    const std::string msg = error_of([&] { hf_int4::read_slice(a, rd); });
    EXPECT_NE(msg.find("act-order"), std::string::npos) << msg;
    EXPECT_NE(msg.find(m + ".weight"), std::string::npos) << msg;
    const hf_int4::Int4Slice s = hf_int4::read_slice(orig, rd);  // symmetric: zero point 8 everywhere
    const Tensor got = hf_int4::dequantize(a, rd);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = k == 0 ? 1 : k == 40 ? 0 : k / 32;
        const float q = want.data<float>()[n * K + k] / s.scale.data<float>()[n * ng + k / 32];  // q - 8, exact
        ASSERT_EQ(got.data<float>()[n * K + k], q * s.scale.data<float>()[n * ng + g]) << "row " << n << " col " << k;
      }
  }
  // q_proj: int4 in group order, whole and as rank 1 of 2 of a column-parallel split
  // (all input columns); as a row-parallel slice (columns 32..63: part of group 0) it is
  // dequantised.
  const Tensor deq = hf_int4::dequantize(a, TensorRead{attn + ".weight", {64, 64}, ShardRule::replicated(), 0, 1, 0});
  for (int size : {1, 2}) {
    LinearRead lr;
    lr.weight = TensorRead{attn + ".weight", {64, 64}, size == 1 ? ShardRule::replicated() : ShardRule::column(), 1 % size,
                           size, 0};
    const Linear l = load_linear(a, lr, LinearOptions::keeping_int4(DType::F32));
    ASSERT_EQ(l.w.int4_group, 32);
    ASSERT_TRUE(l.w.in_perm.defined());
    const int32_t* perm = l.w.in_perm.data<int32_t>();
    EXPECT_EQ(perm[0], 1);  // group 0: columns 1..31 and 40
    EXPECT_EQ(perm[31], 40);
    EXPECT_EQ(perm[32], 0);  // group 1: columns 0, 32..39, 41..63
    Tensor u, z, sc;
    unpack_expert_q4(l.w, 0, u, z, sc);
    const int64_t Nl = 64 / size, n0 = (1 % size) * Nl;
    for (int64_t n = 0; n < Nl; ++n)
      for (int64_t j = 0; j < 64; ++j)
        ASSERT_EQ(value(u, z, sc, n, j, 32), deq.data<float>()[(n0 + n) * 64 + perm[j]]) << "row " << n << " col " << j;
    // Its output: the dequantised linear's, to the int8 input rounding.
    const Linear f = make_linear(deq.slice_rows(n0, n0 + Nl), DType::F32);
    std::vector<float> x(3 * 64), yq(3 * Nl), yf(3 * Nl);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) + 0.1f;
    LinearScratch ls;
    linear_forward(l, x.data(), 3, yq.data(), ls);
    linear_forward(f, x.data(), 3, yf.data(), ls);
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < yq.size(); ++i) ab += yq[i] * yf[i], aa += yq[i] * yq[i], bb += yf[i] * yf[i];
    EXPECT_GE(ab / std::sqrt(aa * bb), 1 - 1e-4);
  }
  LinearRead lr;
  lr.weight = TensorRead{attn + ".weight", {64, 64}, ShardRule::row(), 1, 2, 0};
  EXPECT_FALSE(hf_int4::act_order(a, lr.weight).has_value());
  EXPECT_EQ(load_linear(a, lr, LinearOptions::keeping_int4(DType::F32)).w.int4_group, 0);  // dequantised
  lr.weight = TensorRead{attn + ".weight", {64, 64}, ShardRule::replicated(), 0, 1, 0};
  lr.weight.key = "model.layers.0.self_attn.k_proj.weight";
  lr.weight.shape = {32, 64};
  EXPECT_EQ(load_linear(a, lr, LinearOptions::keeping_int4(DType::F32)).w.int4_group, 32);  // untouched: int4
  const MoeConfig cfg = MoeConfig::from_hf(a.config());
  MlpLoadOptions o;
  EXPECT_EQ(load_moe_layer(a, cfg, 0, o).w13.int4_group, 32);
  EXPECT_EQ(load_moe_layer(a, cfg, 1, o).w13.int4_group, 0);
  // The whole model loads and runs; dequantised everywhere it gives the same logits as
  // with int4 where it can, to the int8 activations' rounding.
  auto qm = load(d.path(), DType::F32, true), fm = load(d.path(), DType::F32, false);
  const Tensor lq = prefill_logits(*qm, kPrompts), lf = prefill_logits(*fm, kPrompts);
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < lq.numel(); ++i) {
    const double x = lq.data<float>()[i], y = lf.data<float>()[i];
    ab += x * y, aa += x * x, bb += y * y;
  }
  EXPECT_GE(ab / std::sqrt(aa * bb), kInt4Cosine);
}

// An act-order expert whose gate and up share a g_idx (GPTQ quantises both on the same
// inputs) stays int4: its input columns sorted by group (PackedExperts::in_perm, the
// activations gathered to match inside grouped_gemm) and, where down has an act order
// over the intermediate neurons, gate's and up's rows and down's columns reordered alike.
TEST(HfInt4Loader, ActOrderExpertsStayInt4WithTheirInputsGathered) {
  const std::string ex = "model.layers.1.mlp.experts.2.";
  test::TempDir d;
  test::mutate_fixture(
      "hf_int4/gptq_sym_g32", d.path(),
      [&](test::Tensors& ts) {
        for (const char* proj : {"gate_proj", "up_proj"}) {
          int32_t* g = test::find_tensor(ts, ex + proj + ".g_idx")->data<int32_t>();
          std::swap(g[0], g[40]);  // column 0 in group 1, column 40 in group 0
        }
      },
      [](json& c) { c["quantization_config"]["desc_act"] = true; });
  const Checkpoint a = Checkpoint::open(d.path());
  const MoeConfig cfg = MoeConfig::from_hf(a.config());
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size, E = cfg.n_experts;
  auto rd = [](const std::string& m, int64_t n, int64_t k) {
    return TensorRead{m + ".weight", {n, k}, ShardRule::replicated(), 0, 1, -1};
  };
  const TensorRead gate = rd(ex + "gate_proj", I, H), up = rd(ex + "up_proj", I, H), down = rd(ex + "down_proj", H, I);
  const auto orders = hf_int4::expert_act_order(a, gate, up, down);
  ASSERT_TRUE(orders.has_value());
  EXPECT_EQ(orders->hidden[0], 1);  // group 0: columns 1..31 and 40
  EXPECT_EQ(orders->hidden[31], 40);
  EXPECT_EQ(orders->hidden[32], 0);  // group 1: columns 0, 32..39, 41..63
  for (int64_t i = 0; i < I; ++i) ASSERT_EQ(orders->inter[i], i);  // down: one group of 32, in order

  // The loaded layer: int4, expert 2's inputs in that order, the others' in theirs (identity).
  MlpLoadOptions o;
  const MoeLayerWeights w = load_moe_layer(a, cfg, 1, o);
  ASSERT_EQ(w.w13.int4_group, 32);
  ASSERT_TRUE(w.w13.in_perm.defined());
  EXPECT_FALSE(w.w2.in_perm.defined());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t j = 0; j < H; ++j)
      ASSERT_EQ(w.w13.in_perm.data<int32_t>()[e * H + j], e == 2 ? orders->hidden[j] : j) << "expert " << e;
  // A desc_act checkpoint gives every layer and every rank's slice of experts the same
  // format (EPLB copies experts between ranks' slots): in_perm even where every local
  // expert's groups are in order (identity).
  for (const auto& [layer, b, e] : {std::tuple{1, 0, 2}, {1, 2, 4}, {0, 0, 4}}) {
    MlpLoadOptions eo;
    eo.expert_begin = b;
    eo.expert_end = e;
    const MoeLayerWeights part = load_moe_layer(a, cfg, layer, eo);
    ASSERT_EQ(part.w13.int4_group, 32) << layer << " " << b;
    ASSERT_TRUE(part.w13.in_perm.defined()) << layer << " " << b;
    EXPECT_EQ(part.w13.in_perm.dim(0), e - b);
  }
  // Unpacked (in input order) every weight is the file's dequantised value, exactly.
  for (int64_t e = 0; e < E; ++e) {
    const std::string m = fmt::format("model.layers.1.mlp.experts.{}.", e);
    const Tensor g = hf_int4::dequantize(a, rd(m + "gate_proj", I, H)), u = hf_int4::dequantize(a, rd(m + "up_proj", I, H));
    const Tensor dn = hf_int4::dequantize(a, rd(m + "down_proj", H, I));
    const Tensor w13 = unpack_expert(w.w13, e), w2 = unpack_expert(w.w2, e);
    for (int64_t i = 0; i < I * H; ++i) {
      ASSERT_EQ(w13.data<float>()[i], g.data<float>()[i]) << "expert " << e << " gate " << i;
      ASSERT_EQ(w13.data<float>()[I * H + i], u.data<float>()[i]) << "expert " << e << " up " << i;
      ASSERT_EQ(w2.data<float>()[i], dn.data<float>()[i]) << "expert " << e << " down " << i;
    }
  }

  // grouped_gemm gathers each expert's rows: every ISA gives the reference's bits, and
  // the reference equals the float GEMM of the input-order weights to f32 rounding.
  const std::vector<int64_t> off = {0, 3, 3, 9, 10};  // expert 2: 6 rows (prefill), 1: none
  const int64_t R = off[E];
  std::vector<float> x(R * H);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.61f * static_cast<float>(i)) + 0.05f;
  auto quantize = [&](const float* v, int64_t k) {  // R rows of k values -> Q8 rows
    Tensor q = Tensor::empty({R, q8_row_bytes(k)}, DType::I8);
    QuantizeRowsParams qp;
    qp.x = v;
    qp.ldx = k;
    qp.rows = R;
    qp.k = k;
    qp.dst = q.raw();
    qp.ld_dst = q8_row_bytes(k);
    quantize_rows_q8(qp);
    return q;
  };
  const Tensor q8 = quantize(x.data(), H);
  // The R rows of Q8 activations a (k inputs) through wt, f32 out [R, n_out].
  auto gemm = [&](const PackedExperts& wt, const Tensor& a, const int64_t* offsets, Activation act, bool reference) {
    Tensor c = Tensor::zeros({R, wt.n_out()}, DType::F32);
    GroupedGemmParams p;
    p.w = &wt;
    p.a = a.raw();
    p.lda = q8_row_bytes(wt.k);
    p.offsets = offsets;
    p.c = c.raw();
    p.ldc = wt.n_out();
    p.act = act;
    reference ? grouped_gemm_reference(p) : grouped_gemm(p);
    return c;
  };
  auto run = [&](bool reference) { return gemm(w.w13, q8, off.data(), Activation::SiluMul, reference); };
  const Tensor want = run(true);
  for (Isa isa : test::available_isas()) {
    test::IsaScope scope(isa);
    const Tensor got = run(false);
    ASSERT_EQ(std::memcmp(got.raw(), want.raw(), want.nbytes()), 0) << isa_name(isa);
  }
  for (int64_t r = off[2]; r < off[3]; ++r) {  // expert 2 against its input-order weights
    const Tensor w13 = unpack_expert(w.w13, 2);
    const float as = q8_row_scale(static_cast<const char*>(q8.raw()) + r * q8_row_bytes(H), H);
    const int8_t* qa = static_cast<const int8_t*>(q8.raw()) + r * q8_row_bytes(H);
    for (int64_t i = 0; i < I; ++i) {
      double gs = 0, us = 0;
      for (int64_t k = 0; k < H; ++k) {
        gs += double(qa[k]) * as * w13.data<float>()[i * H + k];
        us += double(qa[k]) * as * w13.data<float>()[(I + i) * H + k];
      }
      const double y = gs / (1 + std::exp(-gs)) * us;
      ASSERT_NEAR(want.data<float>()[r * I + i], y, 1e-4 * (1 + std::fabs(y))) << "row " << r << " neuron " << i;
    }
  }

  // A neuron order (any order keeps down's one group of 32 whole): gate's and up's rows and
  // down's columns move together, so the MLP's output is the same, bit for bit (down's
  // single group sums exact integers in any order).
  hf_int4::ExpertOrders rev = *orders;
  std::reverse(rev.inter.begin(), rev.inter.end());
  auto mlp = [&](const hf_int4::ExpertOrders& ord) {
    PackedExperts p13 = make_packed_experts_int4(1, 2 * I, H, true, 32), p2 = make_packed_experts_int4(1, H, I, false, 32);
    p13.in_perm = Tensor::empty({1, H}, DType::I32);
    hf_int4::pack_expert(a, p13, p2, 0, gate, up, down, &ord);
    const Tensor u13 = unpack_expert(p13, 0), u2 = unpack_expert(p2, 0);
    const Tensor g = hf_int4::dequantize(a, gate), dn = hf_int4::dequantize(a, down);
    for (int64_t i = 0; i < I; ++i)
      for (int64_t k = 0; k < H; ++k) {
        EXPECT_EQ(u13.data<float>()[i * H + k], g.data<float>()[ord.inter[i] * H + k]);
        EXPECT_EQ(u2.data<float>()[k * I + i], dn.data<float>()[k * I + ord.inter[i]]);
      }
    const std::vector<int64_t> one = {0, R};
    const Tensor mid = gemm(p13, q8, one.data(), Activation::SiluMul, false);
    return gemm(p2, quantize(mid.data<float>(), I), one.data(), Activation::None, false);
  };
  const Tensor y_in_order = mlp(*orders), y_reversed = mlp(rev);
  EXPECT_EQ(std::memcmp(y_in_order.raw(), y_reversed.raw(), y_in_order.nbytes()), 0);

  // The whole model runs with it, near its dequantised twin (int8 activations' rounding).
  auto qm = load(d.path(), DType::F32, true), fm = load(d.path(), DType::F32, false);
  EXPECT_GE(test::worst_logit_cosine(prefill_logits(*qm, kPrompts), prefill_logits(*fm, kPrompts), kPrompts),
            kInt4Cosine);
}

// A GPTQ v1 linear [n, k] of random codes (zero point 8: the fixture is symmetric) and f16
// scales whose group of input column c is g_idx[c], packed as GPTQModel lays it out
// (tools/gen_hf_int4_fixtures.py numpy_gptq_v1: qweight [k/8, n] along k, qzeros [G, n/8]
// along n minus 0x11111111, scales [G, n]): what a desc_act checkpoint holds.
void add_gptq_linear(test::Tensors& ts, const std::string& m, int64_t n, int64_t k, const std::vector<int32_t>& g_idx,
                     std::mt19937& rng) {
  const int64_t G = k / 32;
  Tensor qw = Tensor::zeros({k / 8, n}, DType::I32), qz = Tensor::empty({G, n / 8}, DType::I32);
  Tensor sc = Tensor::empty({G, n}, DType::F16), gi = Tensor::empty({k}, DType::I32);
  for (int64_t c = 0; c < k; ++c)
    for (int64_t r = 0; r < n; ++r) {
      const uint32_t q = rng() % 16;
      reinterpret_cast<uint32_t*>(qw.data<int32_t>())[(c / 8) * n + r] |= q << (4 * (c % 8));
    }
  for (int64_t i = 0; i < qz.numel(); ++i) qz.data<int32_t>()[i] = static_cast<int32_t>(0x88888888u - 0x11111111u);
  std::uniform_real_distribution<float> s(0.004f, 0.012f);
  for (int64_t i = 0; i < sc.numel(); ++i) sc.data<uint16_t>()[i] = f32_to_f16(s(rng));
  std::copy(g_idx.begin(), g_idx.end(), gi.data<int32_t>());
  ts.emplace_back(m + ".qweight", qw);
  ts.emplace_back(m + ".qzeros", qz);
  ts.emplace_back(m + ".scales", sc);
  ts.emplace_back(m + ".g_idx", gi);
}

// An act order over k columns in groups of 32: a random permutation's first 32 columns are
// group 0, the next 32 group 1, ... (GPTQ's desc_act: columns quantised by descending
// activation, g_idx = position in that order / group size).
std::vector<int32_t> random_act_order(int64_t k, std::mt19937& rng) {
  std::vector<int32_t> perm(k), g(k);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t i = 0; i < k; ++i) g[perm[i]] = static_cast<int32_t>(i / 32);
  return g;
}

// A desc_act checkpoint in which every MLP weight has a scattered act order: a dense
// layer 0 (mlp_only_layers; intermediate 128) and layer 1's experts with I = 64, i.e. two
// groups over the intermediate neurons, so down's order moves neurons between groups (the
// fixtures' I = 32 is one group). Both stay int4: inputs gathered by in_perm, neurons
// reordered alike in gate, up and down; each unpacked weight is the file's dequantised
// value exactly, and the model runs near its dequantised twin.
TEST(HfInt4Loader, ActOrderDenseLayerAndTwoGroupNeuronsStayInt4) {
  constexpr int64_t kI = 64, kDense = 128;
  test::TempDir d;
  std::mt19937 rng(7);
  test::mutate_fixture(
      "hf_int4/gptq_sym_g32", d.path(),
      [&](test::Tensors& ts) {
        std::erase_if(ts, [](const auto& t) {
          return t.first.starts_with("model.layers.0.mlp.") || t.first.starts_with("model.layers.1.mlp.experts.");
        });
        const int64_t H = 64, E = 4;
        const std::vector<int32_t> dense_in = random_act_order(H, rng);
        add_gptq_linear(ts, "model.layers.0.mlp.gate_proj", kDense, H, dense_in, rng);
        add_gptq_linear(ts, "model.layers.0.mlp.up_proj", kDense, H, dense_in, rng);
        add_gptq_linear(ts, "model.layers.0.mlp.down_proj", H, kDense, random_act_order(kDense, rng), rng);
        for (int64_t e = 0; e < E; ++e) {
          const std::string m = fmt::format("model.layers.1.mlp.experts.{}.", e);
          const std::vector<int32_t> in = random_act_order(H, rng);  // gate and up: one order
          add_gptq_linear(ts, m + "gate_proj", kI, H, in, rng);
          add_gptq_linear(ts, m + "up_proj", kI, H, in, rng);
          add_gptq_linear(ts, m + "down_proj", H, kI, random_act_order(kI, rng), rng);
        }
      },
      [&](json& c) {
        c["quantization_config"]["desc_act"] = true;
        c["mlp_only_layers"] = json::array({0});
        c["moe_intermediate_size"] = kI;
        c["intermediate_size"] = kDense;
      });
  const Checkpoint a = Checkpoint::open(d.path());
  const MoeConfig cfg = MoeConfig::from_hf(a.config());
  const int64_t H = cfg.hidden_size;
  auto rd = [](const std::string& m, int64_t n, int64_t k) {
    return TensorRead{m + ".weight", {n, k}, ShardRule::replicated(), 0, 1, -1};
  };
  // gate/up rows and down columns of expert (or MLP) e in its neuron order, inputs in
  // the file's column order: the dequantised weights, bit for bit.
  auto check = [&](const PackedExperts& w13, const PackedExperts& w2, int64_t e, const std::string& m, int64_t I) {
    const TensorRead g = rd(m + "gate_proj", I, H), u = rd(m + "up_proj", I, H), dn = rd(m + "down_proj", H, I);
    const auto ord = hf_int4::expert_act_order(a, g, u, dn);
    ASSERT_TRUE(ord.has_value()) << m;
    // Down's two (or four) groups each gather scattered neurons: the order is no identity,
    // and it takes down's groups whole (neurons sorted by their group).
    bool moved = false;
    const Tensor dg = a.view(m + "down_proj.g_idx");
    for (int64_t i = 0; i < I; ++i) {
      moved = moved || ord->inter[i] != i;
      ASSERT_EQ(dg.data<int32_t>()[ord->inter[i]], i / 32) << m << " neuron " << i;
    }
    EXPECT_TRUE(moved) << m;
    ASSERT_EQ(w13.int4_group, 32) << m;
    ASSERT_EQ(w2.int4_group, 32) << m;
    ASSERT_TRUE(w13.in_perm.defined()) << m;
    for (int64_t j = 0; j < H; ++j) ASSERT_EQ(w13.in_perm.data<int32_t>()[e * H + j], ord->hidden[j]) << m;
    const Tensor gw = hf_int4::dequantize(a, g), uw = hf_int4::dequantize(a, u), dw = hf_int4::dequantize(a, dn);
    const Tensor u13 = unpack_expert(w13, e), u2 = unpack_expert(w2, e);
    for (int64_t i = 0; i < I; ++i)
      for (int64_t k = 0; k < H; ++k) {
        ASSERT_EQ(u13.data<float>()[i * H + k], gw.data<float>()[ord->inter[i] * H + k]) << m << " gate " << i;
        ASSERT_EQ(u13.data<float>()[(I + i) * H + k], uw.data<float>()[ord->inter[i] * H + k]) << m << " up " << i;
        ASSERT_EQ(u2.data<float>()[k * I + i], dw.data<float>()[k * I + ord->inter[i]]) << m << " down " << i;
      }
  };
  MlpLoadOptions o;
  const GatedMlpWeights dense = load_dense_mlp(a, cfg, 0, o);
  check(dense.w13, dense.w2, 0, "model.layers.0.mlp.", kDense);
  const MoeLayerWeights moe = load_moe_layer(a, cfg, 1, o);
  for (int64_t e = 0; e < cfg.n_experts; ++e)
    check(moe.w13, moe.w2, e, fmt::format("model.layers.1.mlp.experts.{}.", e), kI);
  auto qm = load(d.path(), DType::F32, true), fm = load(d.path(), DType::F32, false);
  EXPECT_GE(test::worst_logit_cosine(prefill_logits(*qm, kPrompts), prefill_logits(*fm, kPrompts), kPrompts),
            kInt4Cosine);
}

// Dequantised at load (int4 off), the model is the reference directory's, bit for bit, in
// f32 and in bf16.
TEST(HfInt4Model, DequantisedLoadGivesTheReferenceLogits) {
  for (const std::string& name : kVariants)
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(name + " " + dtype_name(dt));
      auto a = load(kDir + name, dt, false);
      auto b = load(kDir + name + "-ref", dt, false);
      const Tensor la = prefill_logits(*a, kPrompts), lb = prefill_logits(*b, kPrompts);
      ASSERT_EQ(la.shape(), lb.shape());
      int64_t differ = 0;
      for (int64_t i = 0; i < la.numel(); ++i) differ += la.data<float>()[i] != lb.data<float>()[i];
      EXPECT_EQ(differ, 0) << "of " << la.numel() << " logits";
    }
}

// In int4 (the default) every attention projection and expert is int4 with the file's
// values: only their int8-rounded inputs differ from the f32 reference.
// `moe-ep inspect`'s checks and read plan: every int4 tensor belongs to a weight the
// model reads (none unexpected), and a rank's plan counts the int4 bytes it reads: on
// one rank all the file's tensor bytes, under --ep 2 the experts split between ranks.
TEST(HfInt4Loader, InspectKnowsEveryInt4TensorAndItsBytes) {
  for (const std::string& name : kVariants) {
    SCOPED_TRACE(name);
    const Checkpoint ck = Checkpoint::open(kDir + name);
    const ModelConfig c = model_config_from_hf(ck.config());
    for (const TensorProblem& p : check_checkpoint(ck, c.moe, model_reads(c, 0, 1))) ADD_FAILURE() << p.message;
    const Inventory inv = take_inventory(ck);
    auto reads = [&](int tp_rank, int tp) { return model_reads(c, tp_rank, tp); };
    const std::vector<RankPlan> one = read_plan(ck, c.moe, inv, 1, 1, DType::F32, reads);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].non_expert_bytes + one[0].expert_bytes, inv.tensor_bytes);
    const std::vector<RankPlan> two = read_plan(ck, c.moe, inv, 2, 1, DType::F32, reads);
    ASSERT_EQ(two.size(), 2u);
    EXPECT_EQ(two[0].expert_bytes + two[1].expert_bytes, one[0].expert_bytes);
    EXPECT_GT(two[0].expert_bytes, 0u);
    // Held as int4: half a byte per weight plus a 5-byte (scale, zero point) per group.
    const uint64_t weights = 3 * c.moe.n_experts * c.moe.moe_intermediate_size * c.moe.hidden_size * c.moe.n_layers;
    EXPECT_EQ(one[0].resident_expert_bytes, weights / 2 + weights / hf_int4::kernel_group(ck) * 5);
  }
}

TEST(HfInt4Model, Int4ModelNearTheReference) {
  for (const std::string& name : kVariants) {
    SCOPED_TRACE(name);
    auto q = load(kDir + name, DType::F32, true);
    auto f = load(kDir + name + "-ref", DType::F32, false);
    const Tensor lq = prefill_logits(*q, kPrompts), lf = prefill_logits(*f, kPrompts);
    const double worst = test::worst_logit_cosine(lq, lf, kPrompts);
    std::printf("[ hf_int4 ] %s in int4 vs its f32 reference: worst logit cosine %.9f\n", name.c_str(), worst);
    EXPECT_GE(worst, kInt4Cosine);
    EXPECT_LT(worst, 1.0);  // the int4 path ran: int8 activations change something
  }
}

// GPTQ with desc_act as GPTQModel writes it (tests/fixtures/hf_int4/gptq_desc_act_asym_g32:
// its TorchLinear.pack_original with scattered g_idx, q/k/v sharing one order and gate/up of
// an expert one; experts of intermediate 64, so down's order moves neurons between two
// groups). Every attention projection and expert stays int4, its inputs gathered
// (in_perm), and unpacks to GPTQModel's own dequantisation bit for bit, on one rank and on
// each of two TP ranks (a column slice of q keeps its order; o_proj's row slice cuts
// groups, so it loads dequantised, exactly); dequantised, the model gives the reference's
// logits bit for bit; in int4 only the int8 inputs differ.
TEST(HfInt4Model, GptqModelActOrderCheckpointStaysInt4) {
  const std::string name = "gptq_desc_act_asym_g32";
  const Checkpoint q = Checkpoint::open(kDir + name), r = Checkpoint::open(kDir + name + "-ref");
  const MoeConfig cfg = MoeConfig::from_hf(q.config());
  ASSERT_EQ(cfg.moe_intermediate_size, 64);
  auto same = [](const Tensor& got, const Tensor& want, const std::string& what) {
    ASSERT_EQ(got.shape(), want.shape()) << what;
    for (int64_t i = 0; i < want.numel(); ++i)
      ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << what << " element " << i;
  };
  for (int64_t layer = 0; layer < cfg.n_layers; ++layer) {
    for (const char* mod : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      const std::string key = fmt::format("model.layers.{}.self_attn.{}.weight", layer, mod);
      const Tensor want = r.view(key);
      const int64_t N = want.dim(0), K = want.dim(1);
      ASSERT_TRUE(hf_int4::act_order(q, TensorRead{key, {N, K}, ShardRule::replicated(), 0, 1, layer}).has_value())
          << key;
      const bool row = std::string(mod) == "o_proj";
      for (int size : {1, 2})
        for (int rank = 0; rank < size; ++rank) {
          LinearRead rd;
          rd.weight = TensorRead{key, {N, K}, size == 1 ? ShardRule::replicated() : row ? ShardRule::row() : ShardRule::column(),
                                 rank, size, layer};
          const Linear l = load_linear(q, rd, LinearOptions::keeping_int4(DType::F32));
          const std::string what = fmt::format("{} rank {}/{}", key, rank, size);
          if (size == 2 && row) {  // half of the inputs of a scattered order: no whole groups
            EXPECT_EQ(l.w.int4_group, 0) << what;
          } else {
            EXPECT_EQ(l.w.int4_group, 32) << what;
            EXPECT_TRUE(l.w.in_perm.defined()) << what;
          }
          const Tensor got = unpack_expert(l.w, 0);
          const int64_t Nl = got.dim(0), Kl = got.dim(1);
          Tensor slice = Tensor::empty({Nl, Kl}, DType::F32);
          for (int64_t n = 0; n < Nl; ++n)
            for (int64_t k = 0; k < Kl; ++k)
              slice.data<float>()[n * Kl + k] =
                  want.data<float>()[(row ? n : rank * Nl + n) * K + (row ? rank * Kl : 0) + k];
          same(got, slice, what);
        }
    }
    // Experts: gate and up of one order, down's neurons reordered alike (expert_act_order).
    MlpLoadOptions o;
    o.strict = true;
    const MoeLayerWeights w = load_moe_layer(q, cfg, layer, o);
    ASSERT_EQ(w.w13.int4_group, 32);
    ASSERT_TRUE(w.w13.in_perm.defined());
    const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size;
    for (int64_t e = 0; e < cfg.n_experts; ++e) {
      const std::string m = fmt::format("model.layers.{}.mlp.experts.{}.", layer, e);
      auto read = [&](const char* proj, int64_t n, int64_t k) {
        return TensorRead{m + proj + ".weight", {n, k}, ShardRule::replicated(), 0, 1, layer};
      };
      const auto ord = hf_int4::expert_act_order(q, read("gate_proj", I, H), read("up_proj", I, H),
                                                 read("down_proj", H, I));
      ASSERT_TRUE(ord.has_value()) << m;
      const Tensor g = r.view(m + "gate_proj.weight"), u = r.view(m + "up_proj.weight"), dn = r.view(m + "down_proj.weight");
      const Tensor u13 = unpack_expert(w.w13, e), u2 = unpack_expert(w.w2, e);
      for (int64_t i = 0; i < I; ++i)
        for (int64_t k = 0; k < H; ++k) {
          const int64_t src = ord->inter[i];
          ASSERT_EQ(u13.data<float>()[i * H + k], g.data<float>()[src * H + k]) << m << " gate " << i << " " << k;
          ASSERT_EQ(u13.data<float>()[(I + i) * H + k], u.data<float>()[src * H + k]) << m << " up " << i << " " << k;
          ASSERT_EQ(u2.data<float>()[k * I + i], dn.data<float>()[k * I + src]) << m << " down " << i << " " << k;
        }
    }
  }
  for (DType dt : {DType::F32, DType::BF16}) {
    auto a = load(kDir + name, dt, false), b = load(kDir + name + "-ref", dt, false);
    const Tensor la = prefill_logits(*a, kPrompts), lb = prefill_logits(*b, kPrompts);
    ASSERT_EQ(la.shape(), lb.shape());
    EXPECT_EQ(std::memcmp(la.data<float>(), lb.data<float>(), la.nbytes()), 0) << dtype_name(dt);
  }
  auto qm = load(kDir + name, DType::F32, true), fm = load(kDir + name + "-ref", DType::F32, false);
  const double worst = test::worst_logit_cosine(prefill_logits(*qm, kPrompts), prefill_logits(*fm, kPrompts), kPrompts);
  std::printf("[ hf_int4 ] %s (GPTQModel's act order) in int4 vs its reference: worst logit cosine %.9f\n",
              name.c_str(), worst);
  EXPECT_GE(worst, kInt4Cosine);
  EXPECT_LT(worst, 1.0);
}

// Hostile int4 files: each an error naming the tensor (or key) when the model loads.
TEST(HfInt4Hostile, ErrorsNameTheTensorOrKey) {
  const std::string ex = "model.layers.1.mlp.experts.2.up_proj", attn = "model.layers.0.self_attn.q_proj";
  struct Case {
    const char* what;
    const char* fixture;
    std::function<void(test::Tensors&)> tensors;
    std::function<void(json&)> config;
    std::vector<std::string> want;
  };
  auto erase = [](test::Tensors& ts, const std::string& key) {
    std::erase_if(ts, [&](const auto& kv) { return kv.first == key; });
  };
  const std::vector<Case> cases = {
      {"NaN scale", "gptq_sym_g32",
       [&](test::Tensors& ts) { test::find_tensor(ts, ex + ".scales")->data<uint16_t>()[3] = 0x7e00; }, {},
       {ex + ".scales", "nan", "expected a finite number"}},
      {"Inf scale (compressed-tensors bf16)", "ct_sym_g32",
       [&](test::Tensors& ts) { test::find_tensor(ts, attn + ".weight_scale")->data<uint16_t>()[0] = 0x7f80; }, {},
       {attn + ".weight_scale", "inf"}},
      {"qzeros of the wrong shape", "gptq_asym_g64",
       [&](test::Tensors& ts) { *test::find_tensor(ts, ex + ".qzeros") = Tensor::zeros({2, 4}, DType::I32); }, {},
       {ex + ".qzeros", "has shape [2, 4], expected [1, 4]"}},
      {"qweight missing but qzeros left", "awq_g32",
       [&](test::Tensors& ts) { erase(ts, ex + ".qweight"); }, {}, {ex}},
      {"scales of an integer dtype", "awq_g32",
       [&](test::Tensors& ts) { *test::find_tensor(ts, attn + ".scales") = Tensor::zeros({2, 64}, DType::I32); }, {},
       {attn + ".scales", "dtype i32"}},
      {"g_idx out of range", "gptq_sym_g32",
       [&](test::Tensors& ts) { test::find_tensor(ts, attn + ".g_idx")->data<int32_t>()[5] = 9; }, {},
       {attn + ".g_idx", "entry 5 is 9"}},
      {"config group_size disagrees with the tensors", "gptq_sym_g32", {},
       [](json& c) { c["quantization_config"]["group_size"] = 128; }, {".qzeros", "expected [1, "}},
      {"no quantization_config", "gptq_sym_g32", {}, [](json& c) { c.erase("quantization_config"); },
       {".qweight", "quantization_config is absent"}},
      {"wrong method for the keys", "ct_sym_g32", {},
       [](json& c) {
         c["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 32}};
       },
       {".weight_packed", "expected 'model."}},
      {"module listed as not converted", "awq_g32", {},
       [](json& c) { c["quantization_config"]["modules_to_not_convert"] = {"q_proj"}; },
       {attn + ".qweight", "not converted"}},
      {"weight_shape disagrees", "ct_asym_channel",
       [&](test::Tensors& ts) { test::find_tensor(ts, ex + ".weight_shape")->data<int64_t>()[1] = 65; }, {},
       {ex + ".weight_shape", "says [32, 65]"}},
      {"weight_zero_point missing (asymmetric)", "ct_asym_channel",
       [&](test::Tensors& ts) { erase(ts, ex + ".weight_zero_point"); }, {},
       {ex + ".weight_zero_point", "is missing"}},
      {"shape that disagrees with the config", "gptq_sym_g32", {},
       [](json& c) { c["moe_intermediate_size"] = 40; },
       {"model.layers.0.mlp.experts.0.gate_proj.qweight", "has shape [8, 32], expected [8, 40]"}},
      {"8-bit GPTQ", "gptq_sym_g32", {}, [](json& c) { c["quantization_config"]["bits"] = 8; },
       {"quantization_config.bits 8"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    test::TempDir d;
    test::mutate_fixture(std::string("hf_int4/") + c.fixture, d.path(), c.tensors, c.config);
    for (bool int4 : {true, false}) {
      const std::string msg = error_of([&] { load(d.path(), DType::F32, int4); });
      ASSERT_FALSE(msg.empty()) << "no error (int4 " << int4 << ")";
      for (const std::string& w : c.want) EXPECT_NE(msg.find(w), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace moe
