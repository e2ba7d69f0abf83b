// Checks that every rank of a job runs with the same inputs (config, flags,
// placement, ...), so that a mismatch is a clear error instead of a hang or
// silently wrong numbers.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace moe {

// Collective over `comm`. Every rank hashes each (name, value) field and the hashes
// are all-gathered; on any difference EVERY rank throws the same moe::Error naming
// the first differing field and the ranks that differ with their values, e.g.
//   ranks disagree on 'flags': rank 0 has '--ep 2' (hash 0x...), rank 2 has '--ep 4' (hash 0x...)
// Ranks passing a different number of fields also get an error (never a hang).
void check_same_on_all_ranks(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& fields);

}  // namespace moe
