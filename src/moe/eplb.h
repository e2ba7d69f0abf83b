// Expert-parallel load balancing: where to put E logical experts and R redundant slots
// on `ep` ranks so that every rank computes about the same number of rows.
//
// The policy is DeepSeek's EPLB (github.com/deepseek-ai/EPLB), written here:
//   hierarchical, when the router's expert groups divide over the nodes
//   (groups % nodes == 0): 1) pack whole groups onto nodes, balancing their load, so
//   group-limited routing keeps traffic inside a node; 2) inside each node, give
//   replicas one at a time to the expert with the largest load per replica; 3) pack
//   the node's slots onto its ranks, heaviest first onto the least loaded rank with a
//   free slot. Every rank gets the same number of slots, (E + R) / ep.
//   global, otherwise: the same with one group and one node.
// One change: two replicas of an expert never share a rank (they would only split
// its rows there), so an expert gets at most ranks-per-node replicas and step 3 skips
// ranks already holding the expert (a swap repairs the rare dead end).
//
// Everything is deterministic (ties go to the lower index), so every rank computing
// a placement from the same load gets the same one, without talking.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moe/placement.h"

namespace moe {

struct EplbParams {
  int ep = 1;             // EP ranks
  int64_t redundant = 0;  // extra slots R; (E + R) must divide by ep
  int nodes = 1;          // ranks are blocks of ep / nodes consecutive ranks per node
  int groups = 1;         // the router's expert groups (n_group); hierarchical when it divides by nodes
};

// The flags (--redundant-experts, --placement, --eplb-interval, --eplb-window,
// --eplb-nodes), as a model and the verbs take them.
struct EplbOptions {
  int64_t redundant = 0;       // extra slots over the EP ranks (0: none)
  std::string placement_file;  // slots per layer (moe/placement_file.h); empty: computed
  int64_t interval = 0;        // rebalance every this many steps (0: never)
  int64_t window = 0;          // steps of load statistics a rebalance uses (0: the interval)
  int nodes = 1;               // hosts the EP ranks span (blocks of consecutive ranks)
  // Told of every rebalance (rank 0 prints it); may be empty.
  std::function<void(const std::string&)> log;
  bool any() const { return redundant > 0 || !placement_file.empty() || interval > 0; }
};

// rank_experts for one layer (Placement::from_ranks): load[e] >= 0 is the rows expert
// e computed over a window (or 1 for all: no statistics yet). Slots of a rank are
// listed by ascending expert id. Errors name what does not divide or fit.
std::vector<std::vector<int32_t>> eplb_place(const std::vector<double>& load, const EplbParams& p);

// Renumbers the ranks of `next` inside each node so that as many slots as possible keep
// an expert their rank already holds under `cur` (same ep): the placement is the same
// up to which rank is which, and fewer weights move. Returns the experts that move
// (slots of next whose expert their rank did not hold in cur).
int64_t eplb_keep_in_place(std::vector<std::vector<int32_t>>& next, const std::vector<std::vector<int32_t>>& cur,
                           int nodes);

// Max over mean of the rows each EP rank computes when expert e's load splits evenly
// over its replicas (1.0: perfectly balanced; 0 load: 1.0).
double placement_imbalance(const Placement& p, const std::vector<double>& load);

// Slots that hold an expert their rank did not hold before: what a switch moves.
int64_t slots_moved(const Placement& from, const Placement& to);

}  // namespace moe
