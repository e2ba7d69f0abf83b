// `moe-ep eplb --load LOAD.json --ep N --redundant-experts R [--nodes M] [--groups G]
//  [--current PLACEMENT.json] --output PLACEMENT.json`: DeepSeek's EPLB policy
// (moe/eplb.h) on a load file (`generate --expert-load-out`), per MoE layer; prints
// each layer's imbalance under the contiguous placement, the current one (if given)
// and the new one, and how many experts move.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "cli/verbs.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "moe/eplb.h"
#include "moe/placement_file.h"

namespace moe {
namespace {

struct EplbCmd {
  std::string load, output, current;
  int ep = 0;
  int64_t redundant = 0;
  int nodes = 1, groups = 1;
  bool keep = true;
};

int run(const EplbCmd& o) {
  const ExpertLoadFile lf = read_expert_load(o.load);
  std::optional<PlacementFile> cur;
  if (!o.current.empty()) {
    cur = read_placement(o.current);
    MOE_CHECK(cur->n_experts == lf.n_experts && cur->ep == o.ep && cur->layers == lf.layers,
              "--current '{}' is for {} experts over ep {} and {} layers; the load file has {} experts and {} layers, "
              "--ep is {}",
              o.current, cur->n_experts, cur->ep, cur->layers.size(), lf.n_experts, lf.layers.size(), o.ep);
  }
  const EplbParams p{o.ep, o.redundant, o.nodes, o.groups};
  PlacementFile out;
  out.n_experts = lf.n_experts;
  out.ep = o.ep;
  out.layers = lf.layers;
  fmt::print("moe-ep eplb: {} MoE layers, {} experts, {} load steps; ep {}, {} redundant slots ({} per rank), {} "
             "node(s), {} expert group(s): {} policy\n",
             lf.layers.size(), lf.n_experts, lf.steps, o.ep, o.redundant, (lf.n_experts + o.redundant) / o.ep,
             o.nodes, o.groups,
             o.groups > 1 && o.groups % o.nodes == 0 && lf.n_experts % o.groups == 0 ? "hierarchical" : "global");
  fmt::print("{:>6} {:>11} {:>9} {:>9} {:>7}\n", "layer", "contiguous", "current", "eplb", "moved");
  double sum_c = 0, sum_n = 0;
  int64_t moved_total = 0;
  for (size_t i = 0; i < lf.layers.size(); ++i) {
    auto ranks = eplb_place(lf.load[i], p);
    int64_t moved = -1;
    if (cur && o.keep) moved = eplb_keep_in_place(ranks, cur->ranks[i], o.nodes);
    const Placement next = Placement::from_ranks(lf.n_experts, 1, ranks);
    if (cur && !o.keep) moved = slots_moved(Placement::from_ranks(lf.n_experts, 1, cur->ranks[i]), next);
    const double c = o.ep <= lf.n_experts
                         ? placement_imbalance(Placement::contiguous(lf.n_experts, o.ep, 1), lf.load[i])
                         : 0.0;
    const double n = placement_imbalance(next, lf.load[i]);
    const std::string curs =
        cur ? fmt::format("{:.3f}", placement_imbalance(Placement::from_ranks(lf.n_experts, 1, cur->ranks[i]),
                                                        lf.load[i]))
            : "-";
    fmt::print("{:>6} {:>11.3f} {:>9} {:>9.3f} {:>7}\n", lf.layers[i], c, curs, n,
               moved >= 0 ? fmt::format("{}", moved) : "-");
    sum_c += c;
    sum_n += n;
    moved_total += std::max<int64_t>(0, moved);
    out.ranks.push_back(std::move(ranks));
  }
  const double L = std::max<double>(1, static_cast<double>(lf.layers.size()));
  fmt::print("mean imbalance (max over mean of the rows per rank, each expert's load split evenly over its "
             "replicas): contiguous {:.3f}, EPLB {:.3f}{}\nwrote {}\n",
             sum_c / L, sum_n / L, cur ? fmt::format("; {} expert slots move from --current", moved_total) : "",
             o.output);
  write_file_atomic(o.output, to_json(out).dump(1) + "\n", "--output");
  return 0;
}

}  // namespace

Verb add_eplb_verb(CLI::App& app) {
  auto o = std::make_shared<EplbCmd>();
  CLI::App* c = app.add_subcommand(
      "eplb",
      "Place experts over EP ranks from measured load (DeepSeek's EPLB: hierarchical when expert groups divide over "
      "the nodes, else global), with redundant slots for hot experts; writes a --placement file");
  c->add_option("--load", o->load, "Expert load JSON (`moe-ep generate --expert-load-out`)")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--ep", o->ep, "EP ranks to place the experts on")->required()->check(CLI::PositiveNumber);
  c->add_option("--redundant-experts", o->redundant,
                "Extra slots for replicas of hot experts (experts + R must divide by --ep)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--nodes", o->nodes, "Hosts the EP ranks span (blocks of consecutive ranks)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--groups", o->groups,
                "The router's expert groups (config n_group, e.g. 8 for DeepSeek-V3): with --nodes dividing them, "
                "whole groups stay on one node")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--current", o->current,
                "The placement running now: the new one renumbers ranks to move as few experts as possible")
      ->check(CLI::ExistingFile);
  c->add_flag("!--no-keep", o->keep, "With --current: do not renumber ranks to keep experts in place");
  c->add_option("--output", o->output, "Where to write the placement JSON")->required();
  return {c, [o] { return run(*o); }};
}

}  // namespace moe
