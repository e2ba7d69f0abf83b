// `moe-ep inspect`: checkpoint inventory and per-rank read plan (the loader issue).
#include "cli/verbs.h"

namespace moe {

std::vector<Verb> add_inspect_verbs(CLI::App&) { return {}; }

}  // namespace moe
