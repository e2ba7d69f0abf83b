#include "loader/hf_int4/hf_int4.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/grouped_gemm_int4.h"
#include "loader/quant_config.h"

namespace moe::hf_int4 {

namespace {

using Method = QuantConfig::Method;

// The companions of module m in its format.
struct Keys {
  std::string packed, zeros, scales, g_idx, shape;  // shape: compressed-tensors only
};
Keys keys_of(const std::string& m, Method method) {
  if (method == Method::CompressedTensors)
    return {m + ".weight_packed", m + ".weight_zero_point", m + ".weight_scale", m + ".weight_g_idx",
            m + ".weight_shape"};
  return {m + ".qweight", m + ".qzeros", m + ".scales", m + ".g_idx", ""};
}

constexpr const char* kSuffixes[] = {".qweight",       ".qzeros",           ".scales",
                                     ".g_idx",         ".weight_packed",    ".weight_scale",
                                     ".weight_shape",  ".weight_zero_point", ".weight_g_idx"};

std::string module_of_weight(const std::string& weight_key) {
  return weight_key.substr(0, weight_key.size() - std::char_traits<char>::length(".weight"));
}

bool float_type(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }
bool index_type(DType t) { return t == DType::I32 || t == DType::I64; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

const char* method_label(Method m) {
  switch (m) {
    case Method::Gptq: return "GPTQ";
    case Method::Awq: return "AWQ";
    case Method::CompressedTensors: return "compressed-tensors";
    default: return "float";
  }
}

// The geometry of one int4 weight: its config, full shape and file groups.
struct Geometry {
  QuantConfig qc;
  std::string module, file;
  Keys k;
  int64_t N = 0, K = 0, G = 0;
  bool has_zeros = false, has_g_idx = false;
};

// Header checks; fills g. The error text, or nullopt.
std::optional<std::string> geometry(const Checkpoint& ck, const TensorRead& r, Geometry& g) {
  g.module = module_of_weight(r.key);
  try {
    g.qc = parse_quant_config(ck.config());
  } catch (const Error& e) {
    return fmt::format("tensor '{}' is stored as int4 ({}), but {}", r.key, g.module, e.what());
  }
  const bool gptq_keys = ck.has(g.module + ".qweight");
  const std::string first = gptq_keys ? g.module + ".qweight" : g.module + ".weight_packed";
  g.file = ck.file_of(first);
  if (!g.qc.int4())
    return fmt::format("tensor '{}' in {} holds int4 codes of '{}', but config.json's quantization_config {} (expected "
                       "quant_method \"{}\")",
                       first, g.file, r.key,
                       g.qc.method_name.empty() ? std::string("is absent") : "says \"" + g.qc.method_name + "\"",
                       gptq_keys ? "gptq\" or \"awq" : "compressed-tensors");
  if (gptq_keys != (g.qc.method != Method::CompressedTensors))
    return fmt::format("tensor '{}' in {} is not how quant_method \"{}\" stores '{}' (expected '{}')", first, g.file,
                       g.qc.method_name, r.key,
                       g.qc.method == Method::CompressedTensors ? g.module + ".weight_packed" : g.module + ".qweight");
  if (g.qc.ignores(g.module))
    return fmt::format("tensor '{}' in {} is int4, but config.json's quantization_config lists its module '{}' as not "
                       "converted (modules_to_not_convert / ignore)",
                       first, g.file, g.module);
  if (r.shape.size() != 2)
    return fmt::format("int4 weight '{}' ({}): expected a matrix, the model reads {}", g.module, g.file,
                       shape_str(r.shape));
  g.N = r.shape[0];
  g.K = r.shape[1];
  g.k = keys_of(g.module, g.qc.method);
  const int64_t gs = g.qc.group_size, N = g.N, K = g.K;
  g.G = gs < 0 ? 1 : ceil_div(K, gs);
  auto expect = [&](const std::string& key, bool (*type_ok)(DType), const char* types,
                    const Shape& shape) -> std::optional<std::string> {
    if (!ck.has(key))
      return fmt::format("int4 weight '{}' ({} in {}): tensor '{}' is missing (expected {} {})", r.key,
                         method_label(g.qc.method), g.file, key, types, shape_str(shape));
    const TensorInfo& info = ck.info(key);
    if (!type_ok(info.dtype))
      return fmt::format("tensor '{}' in {} has dtype {}, expected {}", key, ck.file_of(key), dtype_name(info.dtype),
                         types);
    if (info.shape != shape)
      return fmt::format("tensor '{}' in {} has shape {}, expected {} (int4 weight '{}' {} of the model, {} "
                         "group_size {})",
                         key, ck.file_of(key), shape_str(info.shape), shape_str(shape), r.key, shape_str(r.shape),
                         method_label(g.qc.method), gs);
    return std::nullopt;
  };
  auto i32 = [](DType t) { return t == DType::I32; };
  std::optional<std::string> p;
  switch (g.qc.method) {
    case Method::Gptq:
    case Method::Awq:
      if (K % 8 || N % 8)
        return fmt::format("int4 weight '{}' in {}: shape {} does not divide into {}'s 8-code int32 words", r.key,
                           g.file, shape_str(r.shape), method_label(g.qc.method));
      if ((p = expect(g.k.packed, i32, "i32",
                      g.qc.method == Method::Gptq ? Shape{K / 8, N} : Shape{K, N / 8})))
        return p;
      if ((p = expect(g.k.zeros, i32, "i32", {g.G, N / 8}))) return p;
      if ((p = expect(g.k.scales, float_type, "f32, bf16 or f16", {g.G, N}))) return p;
      g.has_zeros = true;
      break;
    case Method::CompressedTensors:
      if ((p = expect(g.k.packed, i32, "i32", {N, ceil_div(K, 8)}))) return p;
      if ((p = expect(g.k.scales, float_type, "f32, bf16 or f16", {N, g.G}))) return p;
      if (!g.qc.sym) {
        if ((p = expect(g.k.zeros, i32, "i32", {ceil_div(N, 8), g.G}))) return p;
        g.has_zeros = true;
      }
      if (ck.has(g.k.shape)) {
        if ((p = expect(g.k.shape, index_type, "i32 or i64", {2}))) return p;
      }
      break;
    default:
      break;
  }
  if (ck.has(g.k.g_idx)) {
    if ((p = expect(g.k.g_idx, index_type, "i32 or i64", {K}))) return p;
    g.has_g_idx = true;
  }
  return std::nullopt;
}

// A 4-bit field of a little-endian int32 word.
inline uint8_t nibble(uint32_t w, int64_t j) { return static_cast<uint8_t>((w >> (4 * j)) & 15u); }

// Word i of a view of the file (safetensors does not promise aligned data: memcpy).
inline uint32_t word(const Tensor& t, int64_t i) {
  uint32_t w;
  std::memcpy(&w, static_cast<const char*>(t.raw()) + 4 * i, 4);
  return w;
}

int64_t read_index(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::I64) {
    int64_t v;
    std::memcpy(&v, static_cast<const char*>(t.raw()) + 8 * i, 8);
    return v;
  }
  return static_cast<int32_t>(word(t, i));
}

// The file group of each input column: g_idx (checked), else k / group_size.
std::vector<int64_t> column_groups(const Checkpoint& ck, const Geometry& g) {
  std::vector<int64_t> group(static_cast<size_t>(g.K));
  const int64_t gs = g.qc.group_size;
  if (g.has_g_idx) {
    const Tensor gi = ck.view(g.k.g_idx);
    for (int64_t k = 0; k < g.K; ++k) {
      const int64_t v = read_index(gi, k);
      MOE_CHECK(v >= 0 && v < g.G, "tensor '{}' in {}: entry {} is {}, expected a group in [0, {})", g.k.g_idx,
                ck.file_of(g.k.g_idx), k, v, g.G);
      group[k] = v;
    }
  } else {
    for (int64_t k = 0; k < g.K; ++k) group[k] = gs < 0 ? 0 : k / gs;
  }
  return group;
}

int64_t group_for(const QuantConfig& qc);

// The file group of each kernel group of a slice's columns `cols`, or nothing when a
// kernel group is not consecutive columns of one file group (the first such block in
// *bad: its first and last column).
// consecutive: the columns of a kernel group must also be consecutive in the file (they
// are not when the slice's columns were reordered for act-order).
std::optional<std::vector<int64_t>> kernel_file_groups(const std::vector<int64_t>& group,
                                                       const std::vector<int64_t>& cols, int64_t kg,
                                                       std::pair<int64_t, int64_t>* bad = nullptr,
                                                       bool consecutive = true) {
  const int64_t k = static_cast<int64_t>(cols.size()), ng = int4_n_groups(k, kg);
  std::vector<int64_t> fg(static_cast<size_t>(ng));
  for (int64_t j = 0; j < ng; ++j) {
    const int64_t b = j * kg, e = std::min(k, b + kg);
    fg[j] = group[cols[b]];
    for (int64_t i = b; i < e; ++i)
      if ((consecutive && cols[i] != cols[b] + (i - b)) || group[cols[i]] != fg[j]) {
        if (bad) *bad = {b, e};
        return std::nullopt;
      }
  }
  return fg;
}

// The whole weight decoded: q [N, K] (int4 u), z [N, G], s [N, G] (f32, finite), the file
// group of each column.
struct Decoded {
  std::vector<uint8_t> q, z;
  std::vector<float> s;
  std::vector<int64_t> group;  // [K]
};

Decoded decode(const Checkpoint& ck, const Geometry& g) {
  const int64_t N = g.N, K = g.K, G = g.G;
  Decoded d;
  d.q.resize(static_cast<size_t>(N * K));
  d.z.resize(static_cast<size_t>(N * G));
  d.s.resize(static_cast<size_t>(N * G));
  d.group.resize(static_cast<size_t>(K));
  const Tensor packed = ck.view(g.k.packed);
  const Tensor scales = ck.view(g.k.scales);
  std::vector<float> sf(static_cast<size_t>(scales.numel()));
  {
    std::vector<uint64_t> aligned((scales.nbytes() + 7) / 8);
    std::memcpy(aligned.data(), scales.raw(), scales.nbytes());
    convert_to_f32(aligned.data(), scales.dtype(), sf.data(), sf.size());
  }
  const bool ct = g.qc.method == Method::CompressedTensors;
  if (ct && ck.has(g.k.shape)) {
    const Tensor sh = ck.view(g.k.shape);
    MOE_CHECK(read_index(sh, 0) == N && read_index(sh, 1) == K,
              "tensor '{}' in {} says [{}, {}], but the model reads '{}' as {}", g.k.shape, ck.file_of(g.k.shape),
              read_index(sh, 0), read_index(sh, 1), g.module + ".weight", shape_str({N, K}));
  }
  // Codes.
  switch (g.qc.method) {
    case Method::Gptq:  // [K / 8, N], along k
      for (int64_t i = 0; i < K / 8; ++i)
        for (int64_t n = 0; n < N; ++n) {
          const uint32_t w = word(packed, i * N + n);
          for (int64_t j = 0; j < 8; ++j) d.q[n * K + 8 * i + j] = nibble(w, j);
        }
      break;
    case Method::Awq: {  // [K, N / 8], along n in AutoAWQ's order
      static constexpr int64_t kOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
      for (int64_t k = 0; k < K; ++k)
        for (int64_t i = 0; i < N / 8; ++i) {
          const uint32_t w = word(packed, k * (N / 8) + i);
          for (int64_t j = 0; j < 8; ++j) d.q[(8 * i + kOrder[j]) * K + k] = nibble(w, j);
        }
      break;
    }
    default: {  // compressed-tensors [N, ceil(K / 8)], along k, q + 8
      const int64_t words = ceil_div(K, 8);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) d.q[n * K + k] = nibble(word(packed, n * words + k / 8), k % 8);
      break;
    }
  }
  // Zero points.
  if (g.qc.method == Method::CompressedTensors && !g.has_zeros) {
    std::fill(d.z.begin(), d.z.end(), uint8_t{8});  // symmetric: zp 0, stored + 8
  } else {
    const Tensor zt = ck.view(g.k.zeros);
    if (ct) {  // [ceil(N / 8), G], along n, zp + 8
      for (int64_t n = 0; n < N; ++n)
        for (int64_t gi = 0; gi < G; ++gi) d.z[n * G + gi] = nibble(word(zt, (n / 8) * G + gi), n % 8);
    } else {
      static constexpr int64_t kIdentity[8] = {0, 1, 2, 3, 4, 5, 6, 7}, kAwq[8] = {0, 2, 4, 6, 1, 3, 5, 7};
      const int64_t* order = g.qc.method == Method::Awq ? kAwq : kIdentity;
      // GPTQ v1 stored z - 1 with the borrows of a word-wide subtraction (GPTQModel's
      // v2 -> v1 conversion): its v1 -> v2 conversion adds 0x11111111 to the word.
      const uint32_t add = g.qc.method == Method::Gptq && g.qc.gptq_v1 ? 0x11111111u : 0u;
      for (int64_t gi = 0; gi < G; ++gi)
        for (int64_t i = 0; i < N / 8; ++i) {
          const uint32_t w = word(zt, gi * (N / 8) + i) + add;
          for (int64_t j = 0; j < 8; ++j) d.z[(8 * i + order[j]) * G + gi] = nibble(w, j);
        }
    }
  }
  // Scales: [G, N] (GPTQ, AWQ) or [N, G] (compressed-tensors).
  for (int64_t n = 0; n < N; ++n)
    for (int64_t gi = 0; gi < G; ++gi) {
      const float s = ct ? sf[n * G + gi] : sf[gi * N + n];
      MOE_CHECK(std::isfinite(s), "tensor '{}' in {}: the scale of output {} group {} is {}, expected a finite number",
                g.k.scales, ck.file_of(g.k.scales), n, gi, s);
      d.s[n * G + gi] = s;
    }
  d.group = column_groups(ck, g);
  return d;
}

Geometry checked_geometry(const Checkpoint& ck, const TensorRead& r) {
  Geometry g;
  if (auto p = geometry(ck, r, g)) throw_error(__FILE__, __LINE__, *p);
  return g;
}

int64_t group_for(const QuantConfig& qc) {
  if (qc.group_size < 0) return 128;
  for (int64_t g : {128, 64, 32})
    if (qc.group_size % g == 0) return g;
  MOE_FAIL("quantization_config.group_size {} is not a multiple of 32", qc.group_size);
}

}  // namespace

bool checkpoint_int4(const Checkpoint& ck) {
  try {
    return parse_quant_config(ck.config()).int4();
  } catch (const Error&) {
    return false;
  }
}

bool is_int4_weight(const Checkpoint& ck, const std::string& weight_key) {
  if (!weight_key.ends_with(".weight") || ck.has(weight_key)) return false;
  const std::string m = module_of_weight(weight_key);
  return ck.has(m + ".qweight") || ck.has(m + ".weight_packed");
}

bool is_int4_key(const std::string& key) {
  for (const char* s : kSuffixes)
    if (key.ends_with(s)) return true;
  return false;
}

uint64_t stored_bytes(const Checkpoint& ck, const std::string& weight_key) {
  const std::string m = module_of_weight(weight_key);
  uint64_t n = 0;
  for (const char* suffix : kSuffixes)
    if (ck.has(m + suffix)) n += ck.info(m + suffix).nbytes;
  return n;
}

std::string weight_key_of(const std::string& key) {
  for (const char* s : kSuffixes)
    if (key.ends_with(s)) return key.substr(0, key.size() - std::char_traits<char>::length(s)) + ".weight";
  return key;
}

int64_t kernel_group(const Checkpoint& ck) { return group_for(parse_quant_config(ck.config())); }

std::optional<std::string> int4_problem(const Checkpoint& ck, const TensorRead& r) {
  Geometry g;
  return geometry(ck, r, g);
}

Int4Slice read_slice(const Checkpoint& ck, const TensorRead& r, const std::vector<int64_t>* order) {
  const Geometry g = checked_geometry(ck, r);
  const Decoded d = decode(ck, g);
  const std::vector<int64_t> rows = shard_index_map(r.key, r.shape, r.rule, r.rank, r.size, 0);
  std::vector<int64_t> cols = shard_index_map(r.key, r.shape, r.rule, r.rank, r.size, 1);
  if (order) {
    MOE_CHECK(order->size() == cols.size(), "int4 weight '{}': a column order of {} for a slice of {} columns",
              r.key, order->size(), cols.size());
    std::vector<int64_t> in_order(cols.size());
    for (size_t j = 0; j < cols.size(); ++j) in_order[j] = cols.at(static_cast<size_t>((*order)[j]));
    cols = std::move(in_order);
  }
  const int64_t n = static_cast<int64_t>(rows.size()), k = static_cast<int64_t>(cols.size());
  const int64_t kg = group_for(g.qc), ng = int4_n_groups(k, kg), G = g.G;
  // Each kernel group: consecutive columns of one file group.
  std::pair<int64_t, int64_t> bad;
  const auto fgs = kernel_file_groups(d.group, cols, kg, &bad, /*consecutive=*/order == nullptr);
  MOE_CHECK(fgs.has_value(),
            "int4 weight '{}' in {}: input columns {}..{} (this rank's kernel group {} of {} columns) are not one "
            "contiguous quantisation group{} ({} group_size {}): {}",
            r.key, g.file, cols[bad.first], cols[bad.second - 1], bad.first / kg, kg,
            g.has_g_idx ? " of its g_idx" : "", method_label(g.qc.method), g.qc.group_size,
            g.has_g_idx ? "act-order (desc_act) with a g_idx that scatters a group's columns has no int4 form here "
                          "(it would need the weight's input columns and its activations permuted; the loaders "
                          "dequantise such a weight instead)"
                        : "a tensor-parallel slice must start and end on a group boundary");
  const std::vector<int64_t>& file_group = *fgs;
  Int4Slice s{Tensor::empty({n, k}, DType::U8), Tensor::empty({n, ng}, DType::U8),
              Tensor::empty({n, ng}, DType::F32)};
  uint8_t* u = s.u.data<uint8_t>();
  uint8_t* z = s.zero.data<uint8_t>();
  float* sc = s.scale.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[i];
    for (int64_t j = 0; j < ng; ++j) {
      const int64_t fg = file_group[j], b = j * kg, e = std::min(k, b + kg);
      const float v = d.s[row * G + fg];
      const uint8_t zz = d.z[row * G + fg];
      // (u - z) * s == ((15 - u) - (15 - z)) * -s: a negative scale flips the codes.
      const bool flip = std::signbit(v);
      z[i * ng + j] = flip ? static_cast<uint8_t>(15 - zz) : zz;
      sc[i * ng + j] = flip ? -v : v;
      for (int64_t c = b; c < e; ++c) {
        const uint8_t q = d.q[row * g.K + cols[c]];
        u[i * k + c] = flip ? static_cast<uint8_t>(15 - q) : q;
      }
    }
  }
  return s;
}

bool int4_exact(const Checkpoint& ck, const TensorRead& r) {
  const Geometry g = checked_geometry(ck, r);
  const std::vector<int64_t> cols = shard_index_map(r.key, r.shape, r.rule, r.rank, r.size, 1);
  return kernel_file_groups(column_groups(ck, g), cols, group_for(g.qc)).has_value();
}

std::optional<std::vector<int64_t>> act_order(const Checkpoint& ck, const TensorRead& r) {
  const Geometry g = checked_geometry(ck, r);
  const std::vector<int64_t> cols = shard_index_map(r.key, r.shape, r.rule, r.rank, r.size, 1);
  const std::vector<int64_t> group = column_groups(ck, g);
  std::vector<int64_t> order(cols.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = static_cast<int64_t>(j);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return group[cols[a]] < group[cols[b]]; });
  std::vector<int64_t> sorted(cols.size());
  for (size_t j = 0; j < order.size(); ++j) sorted[j] = cols[order[j]];
  if (!kernel_file_groups(group, sorted, group_for(g.qc), nullptr, /*consecutive=*/false)) return std::nullopt;
  return order;
}

Tensor dequantize(const Checkpoint& ck, const TensorRead& r) {
  // From the decoded weight with each column's own group: any g_idx (act-order
  // included) and any slice.
  const Geometry g = checked_geometry(ck, r);
  const Decoded d = decode(ck, g);
  const std::vector<int64_t> rows = shard_index_map(r.key, r.shape, r.rule, r.rank, r.size, 0);
  const std::vector<int64_t> cols = shard_index_map(r.key, r.shape, r.rule, r.rank, r.size, 1);
  const int64_t n = static_cast<int64_t>(rows.size()), k = static_cast<int64_t>(cols.size());
  Tensor out = Tensor::empty({n, k}, DType::F32);
  float* o = out.data<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < k; ++c) {
      const int64_t row = rows[i], col = cols[c], fg = d.group[col];
      o[i * k + c] = (static_cast<float>(d.q[row * g.K + col]) - static_cast<float>(d.z[row * g.G + fg])) *
                     d.s[row * g.G + fg];
    }
  return out;
}

std::optional<ExpertOrders> expert_act_order(const Checkpoint& ck, const TensorRead& gate, const TensorRead& up,
                                             const TensorRead& down) {
  auto hidden = act_order(ck, gate);
  const auto up_order = act_order(ck, up);
  auto inter = act_order(ck, down);
  if (!hidden || !up_order || !inter || *hidden != *up_order) return std::nullopt;
  return ExpertOrders{std::move(*hidden), std::move(*inter)};
}

namespace {

// s's rows in `order` (row i of the result = row order[i] of s).
Int4Slice rows_in_order(const Int4Slice& s, const std::vector<int64_t>& order) {
  const int64_t n = s.u.dim(0);
  MOE_CHECK(static_cast<int64_t>(order.size()) == n, "internal: a row order of {} for {} rows", order.size(), n);
  Int4Slice o{Tensor::empty(s.u.shape(), DType::U8), Tensor::empty(s.zero.shape(), DType::U8),
              Tensor::empty(s.scale.shape(), DType::F32)};
  for (const auto& [dst, src] : {std::pair{&o.u, &s.u}, {&o.zero, &s.zero}, {&o.scale, &s.scale}}) {
    const size_t rb = src->nbytes() / static_cast<size_t>(n);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(static_cast<char*>(dst->raw()) + i * rb, static_cast<const char*>(src->raw()) + order[i] * rb, rb);
  }
  return o;
}

}  // namespace

void pack_expert(const Checkpoint& ck, PackedExperts& w13, PackedExperts& w2, int64_t e, const TensorRead& gate,
                 const TensorRead& up, const TensorRead& down, const ExpertOrders* orders) {
  if (!orders) {
    const Int4Slice g = read_slice(ck, gate), u = read_slice(ck, up), d = read_slice(ck, down);
    pack_gated_expert_q4(w13, w2, e, {g.u, g.zero, g.scale}, {u.u, u.zero, u.scale}, {d.u, d.zero, d.scale});
    return;
  }
  MOE_CHECK(w13.in_perm.defined() && w13.in_perm.dtype() == DType::I32 &&
                w13.in_perm.shape() == Shape({w13.n_experts, w13.k}) &&
                static_cast<int64_t>(orders->hidden.size()) == w13.k,
            "internal: act-order expert {} without an in_perm [{}, {}]", e, w13.n_experts, w13.k);
  const Int4Slice g = rows_in_order(read_slice(ck, gate, &orders->hidden), orders->inter);
  const Int4Slice u = rows_in_order(read_slice(ck, up, &orders->hidden), orders->inter);
  const Int4Slice d = read_slice(ck, down, &orders->inter);
  pack_gated_expert_q4(w13, w2, e, {g.u, g.zero, g.scale}, {u.u, u.zero, u.scale}, {d.u, d.zero, d.scale});
  int32_t* perm = w13.in_perm.data<int32_t>() + e * w13.k;
  for (int64_t j = 0; j < w13.k; ++j) perm[j] = static_cast<int32_t>(orders->hidden[j]);
}

void pack_matrix(const Checkpoint& ck, PackedExperts& w, int64_t e, const TensorRead& r) {
  const Int4Slice s = read_slice(ck, r);
  pack_expert_q4(w, e, s.u, s.zero, s.scale);
}

}  // namespace moe::hf_int4
