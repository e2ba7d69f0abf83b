// The files of expert-parallel load balancing:
//   expert load (--expert-load-out, `moe-ep eplb --load`):
//     {"format": "moe-ep expert load v1", "experts": E, "window": W, "steps": S,
//      "layers": [l0, l1, ...], "load": [[rows of expert 0..E-1 of layer l0], ...]}
//     rows = (token, k) choices routed to each expert over the last `steps` steps
//     (at most `window`), summed over ranks.
//   placement (--placement, `moe-ep eplb --output`):
//     {"format": "moe-ep placement v1", "experts": E, "ep": N,
//      "layers": [{"layer": l, "ranks": [[experts of EP rank 0], ...]}, ...]}
// Readers check everything and name the file and the field in their errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "comm/communicator.h"
#include "moe/eplb.h"
#include "moe/placement.h"

namespace moe {

struct ExpertLoadFile {
  int64_t n_experts = 0;
  int64_t window = 0, steps = 0;
  std::vector<int64_t> layers;            // MoE layer indices
  std::vector<std::vector<double>> load;  // [layers][E]
};

struct PlacementFile {
  int64_t n_experts = 0;
  int ep = 0;
  std::vector<int64_t> layers;                              // MoE layer indices
  std::vector<std::vector<std::vector<int32_t>>> ranks;     // [layers][ep][slots]
  // The placement of layer `layer` (Placement::from_ranks checks it); errors name it.
  Placement layer_placement(int64_t layer, int tp) const;
};

// The placement every MoE layer gets from the flags (EplbOptions): the placement
// file's (read once; checked for E and ep, and, with a world, equal on every rank),
// DeepSeek's EPLB on a uniform load when slots are redundant (no statistics yet: the
// first experts get the replicas), else contiguous blocks. ep 1: always contiguous.
class PlacementSource {
 public:
  PlacementSource(const EplbOptions& opt, int64_t n_experts, int ep, int tp, int n_group, Communicator* world);
  // For MoE layer `layer` (a file must list it).
  Placement layer(int64_t layer) const;
  const EplbParams& params() const { return params_; }
  // The layers the placement file lists (empty without one).
  std::vector<int64_t> file_layers() const { return file_ ? file_->layers : std::vector<int64_t>{}; }

 private:
  int64_t n_experts_;
  int tp_;
  EplbParams params_;
  std::optional<PlacementFile> file_;
  std::optional<Placement> uniform_;  // --redundant-experts without a file: the same for every layer
};

nlohmann::json to_json(const ExpertLoadFile& f);
nlohmann::json to_json(const PlacementFile& f);
ExpertLoadFile parse_expert_load(const nlohmann::json& j, const std::string& where);
PlacementFile parse_placement(const nlohmann::json& j, const std::string& where);
ExpertLoadFile read_expert_load(const std::string& path);
PlacementFile read_placement(const std::string& path);

}  // namespace moe
