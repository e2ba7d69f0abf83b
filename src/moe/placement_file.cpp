#include "moe/placement_file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "comm/consistency.h"
#include "core/check.h"

namespace moe {
namespace {

using nlohmann::json;

const json& field(const json& j, const char* key, const std::string& where) {
  MOE_CHECK(j.is_object() && j.contains(key), "{}: missing field '{}'", where, key);
  return j.at(key);
}

int64_t int_field(const json& j, const char* key, const std::string& where, int64_t lo, int64_t hi) {
  const json& v = field(j, key, where);
  MOE_CHECK(v.is_number_integer(), "{}: '{}' must be an integer", where, key);
  const int64_t x = v.get<int64_t>();
  MOE_CHECK(x >= lo && x <= hi, "{}: '{}' is {}, expected [{}, {}]", where, key, x, lo, hi);
  return x;
}

void check_format(const json& j, const char* want, const std::string& where) {
  const json& f = field(j, "format", where);
  MOE_CHECK(f.is_string() && f.get<std::string>() == want, "{}: 'format' is {}, expected \"{}\"", where, f.dump(),
            want);
}

std::vector<int64_t> layer_list(const json& j, const std::string& where) {
  std::vector<int64_t> out;
  for (const json& l : j) {
    MOE_CHECK(l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < (1 << 20),
              "{}: a layer index is {}, expected a non-negative integer", where, l.dump());
    MOE_CHECK(out.empty() || l.get<int64_t>() > out.back(), "{}: layers must be listed in increasing order", where);
    out.push_back(l.get<int64_t>());
  }
  return out;
}

json read_json(const std::string& path, const char* what) {
  std::ifstream in(path);
  MOE_CHECK(in, "cannot open {} file '{}'", what, path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    MOE_FAIL("{} file '{}' is not valid JSON: {}", what, path, e.what());
  }
}

}  // namespace

json to_json(const ExpertLoadFile& f) {
  json load = json::array();
  for (const auto& row : f.load) {
    json r = json::array();
    for (const double v : row) r.push_back(static_cast<int64_t>(std::llround(v)));
    load.push_back(std::move(r));
  }
  return {{"format", "moe-ep expert load v1"}, {"experts", f.n_experts}, {"window", f.window},
          {"steps", f.steps},                  {"layers", f.layers},     {"load", std::move(load)}};
}

json to_json(const PlacementFile& f) {
  json layers = json::array();
  for (size_t i = 0; i < f.layers.size(); ++i) layers.push_back({{"layer", f.layers[i]}, {"ranks", f.ranks[i]}});
  return {{"format", "moe-ep placement v1"}, {"experts", f.n_experts}, {"ep", f.ep}, {"layers", std::move(layers)}};
}

ExpertLoadFile parse_expert_load(const json& j, const std::string& where) {
  check_format(j, "moe-ep expert load v1", where);
  ExpertLoadFile f;
  f.n_experts = int_field(j, "experts", where, 1, 1 << 20);
  f.window = int_field(j, "window", where, 0, INT64_MAX);
  f.steps = int_field(j, "steps", where, 0, INT64_MAX);
  const json& layers = field(j, "layers", where);
  const json& load = field(j, "load", where);
  MOE_CHECK(layers.is_array() && load.is_array() && layers.size() == load.size(),
            "{}: 'layers' and 'load' must be arrays of the same length (got {} and {})", where,
            layers.is_array() ? layers.size() : 0, load.is_array() ? load.size() : 0);
  f.layers = layer_list(layers, where);
  for (size_t i = 0; i < load.size(); ++i) {
    const json& row = load[i];
    MOE_CHECK(row.is_array() && static_cast<int64_t>(row.size()) == f.n_experts,
              "{}: load of layer {} has {} entries, expected {} (one per expert)", where, f.layers[i],
              row.is_array() ? row.size() : 0, f.n_experts);
    std::vector<double> r;
    for (const json& v : row) {
      MOE_CHECK(v.is_number() && v.get<double>() >= 0 && std::isfinite(v.get<double>()),
                "{}: load of layer {} holds {}, expected non-negative numbers", where, f.layers[i], v.dump());
      r.push_back(v.get<double>());
    }
    f.load.push_back(std::move(r));
  }
  return f;
}

PlacementFile parse_placement(const json& j, const std::string& where) {
  check_format(j, "moe-ep placement v1", where);
  PlacementFile f;
  f.n_experts = int_field(j, "experts", where, 1, 1 << 20);
  f.ep = static_cast<int>(int_field(j, "ep", where, 1, 1 << 16));
  const json& layers = field(j, "layers", where);
  MOE_CHECK(layers.is_array(), "{}: 'layers' must be an array", where);
  for (const json& l : layers) {
    const int64_t li = int_field(l, "layer", where, 0, (1 << 20) - 1);
    MOE_CHECK(f.layers.empty() || li > f.layers.back(), "{}: layers must be listed in increasing order", where);
    const std::string lw = fmt::format("{} layer {}", where, li);
    const json& ranks = field(l, "ranks", lw);
    MOE_CHECK(ranks.is_array() && static_cast<int>(ranks.size()) == f.ep,
              "{}: 'ranks' lists {} EP ranks, the file says ep {}", lw, ranks.is_array() ? ranks.size() : 0, f.ep);
    std::vector<std::vector<int32_t>> rs;
    for (size_t r = 0; r < ranks.size(); ++r) {
      MOE_CHECK(ranks[r].is_array(), "{}: rank {} must be an array of expert ids", lw, r);
      std::vector<int32_t> list;
      for (const json& e : ranks[r]) {
        MOE_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < f.n_experts,
                  "{}: EP rank {} names expert {}, outside [0, {})", lw, r, e.dump(), f.n_experts);
        list.push_back(e.get<int32_t>());
      }
      rs.push_back(std::move(list));
    }
    // Checks the rest (every expert placed, no two replicas on a rank) now.
    try {
      (void)Placement::from_ranks(f.n_experts, 1, rs);
    } catch (const Error& e) {
      MOE_FAIL("{}: {}", lw, e.what());
    }
    f.layers.push_back(li);
    f.ranks.push_back(std::move(rs));
  }
  return f;
}

Placement PlacementFile::layer_placement(int64_t layer, int tp) const {
  const auto it = std::find(layers.begin(), layers.end(), layer);
  MOE_CHECK(it != layers.end(), "the placement file has no entry for MoE layer {}", layer);
  return Placement::from_ranks(n_experts, tp, ranks[it - layers.begin()]);
}

PlacementSource::PlacementSource(const EplbOptions& opt, int64_t n_experts, int ep, int tp, int n_group,
                                 Communicator* world)
    : n_experts_(n_experts), tp_(tp), params_{ep, opt.redundant, opt.nodes, std::max(1, n_group)} {
  MOE_CHECK(!opt.any() || ep > 1,
            "--redundant-experts, --placement and --eplb-interval place experts over EP ranks: they need --ep > 1");
  if (opt.placement_file.empty()) {
    if (opt.redundant > 0 && ep > 1)
      uniform_ = Placement::from_ranks(n_experts, tp, eplb_place(std::vector<double>(n_experts, 1.0), params_));
    return;
  }
  MOE_CHECK(opt.redundant == 0, "--placement FILE says where every slot goes: do not add --redundant-experts");
  file_ = read_placement(opt.placement_file);
  MOE_CHECK(file_->n_experts == n_experts && file_->ep == ep,
            "placement file '{}' is for {} experts over ep {}, the model has {} experts and the job --ep {}",
            opt.placement_file, file_->n_experts, file_->ep, n_experts, ep);
  // Every rank reads its own copy (a path on each host): they must hold the same slots.
  if (world && world->size() > 1)
    check_same_on_all_ranks(*world, {{"placement file '" + opt.placement_file + "'", to_json(*file_).dump()}});
}

Placement PlacementSource::layer(int64_t l) const {
  if (params_.ep == 1) return Placement::contiguous(n_experts_, 1, tp_);
  if (file_) return file_->layer_placement(l, tp_);
  if (uniform_) return *uniform_;
  return Placement::contiguous(n_experts_, params_.ep, tp_);
}

ExpertLoadFile read_expert_load(const std::string& path) {
  return parse_expert_load(read_json(path, "expert load"), fmt::format("expert load file '{}'", path));
}

PlacementFile read_placement(const std::string& path) {
  return parse_placement(read_json(path, "placement"), fmt::format("placement file '{}'", path));
}

}  // namespace moe
