// Whole-model verbs: forward, generate (the whole-model issue).
#include "cli/verbs.h"

namespace moe {

std::vector<Verb> add_model_verbs(CLI::App&) { return {}; }

}  // namespace moe
