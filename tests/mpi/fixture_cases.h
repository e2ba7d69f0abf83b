// The MoE-block cases of the fixture manifest (tests/fixtures/manifest.json) that the
// multi-rank suites run: model dir, input file and layer, for the token counts asked.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace moe::test {

struct MoeCase {
  std::string dir, input;
  int64_t layer;
};

inline std::vector<MoeCase> moe_cases(const std::vector<int64_t>& tokens) {
  std::ifstream in(std::string(MOE_FIXTURES_DIR) + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  std::vector<MoeCase> out;
  for (const auto& f : m)
    for (const auto& c : f["cases"]) {
      if (c["kind"] != "moe") continue;
      if (std::find(tokens.begin(), tokens.end(), c["tokens"].get<int64_t>()) == tokens.end()) continue;
      out.push_back({std::string(MOE_FIXTURES_DIR) + "/" + f["name"].get<std::string>(),
                     std::string(MOE_FIXTURES_DIR) + "/" + c["input"].get<std::string>(), c["layer"]});
    }
  return out;
}

}  // namespace moe::test
