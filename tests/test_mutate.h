// Edited copies of the single-file fixtures, for bad-input tests: copy a fixture's
// tensors and config.json into a directory, letting the test change either first.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loader/safetensors.h"
#include "test_util.h"

namespace moe::test {

using Tensors = std::vector<std::pair<std::string, Tensor>>;

inline void mutate_fixture(const std::string& name, const std::string& dst,
                           const std::function<void(Tensors&)>& edit_tensors,
                           const std::function<void(nlohmann::json&)>& edit_config = {}) {
  const std::string src = fixtures_dir() + "/" + name;
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  Tensors ts;
  for (const TensorInfo& info : file->tensors()) ts.emplace_back(info.name, file->view(info.name).clone());
  if (edit_tensors) edit_tensors(ts);
  write_safetensors(dst + "/model.safetensors", ts);
  std::ifstream in(src + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  if (edit_config) edit_config(cfg);
  std::ofstream(dst + "/config.json") << cfg.dump(2);
}

inline Tensor* find_tensor(Tensors& ts, const std::string& key) {
  for (auto& [k, t] : ts)
    if (k == key) return &t;
  return nullptr;
}

}  // namespace moe::test
