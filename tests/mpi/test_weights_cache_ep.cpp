// --weights-cache under EP: each rank writes and maps its own file (its experts only),
// and the start that maps them gives the logits of a start without the cache, bit for bit.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>

#include "comm/communicator.h"
#include "model/model.h"
#include "runtime/generate.h"
#include "../test_model_util.h"

namespace moe {
namespace {

Communicator& world() { return world_comm(true); }

// A directory every rank names alike: rank 0 makes it and broadcasts its path.
std::string shared_temp_dir() {
  char path[256] = {};
  if (world().rank() == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "moe_wc_ep_XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) std::snprintf(path, sizeof path, "%s", tmpl.c_str());
  }
  world().broadcast(path, sizeof path, 0);
  return path;
}

TEST(WeightsCacheEp, EachRankMapsItsOwnExperts) {
  const int R = world().size();
  if (R < 2) GTEST_SKIP() << "needs several ranks";
  const std::string gguf = test::fixtures_dir() + "/gguf/models/";
  std::vector<std::pair<std::string, ParallelConfig>> cases = {
      {gguf + "qwen2_moe-F32-00001-of-00002.gguf", {R, 1, 1, 1}},  // EP, attention replicated
  };
  if (R == 2) cases.push_back({gguf + "qwen3moe-kquant.gguf", {R, 1, 1, R}});  // its codes, --attn-tp
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5, 6}, {9, 8, 7}};
  for (const auto& [path, par] : cases) {
    SCOPED_TRACE(path + " " + to_string(par));
    const std::string dir = shared_temp_dir();
    ASSERT_FALSE(dir.empty());
    ModelOptions o;
    o.n_slots = 2;
    o.max_seq = 16;
    o.show_progress = false;
    o.world = &world();
    o.par = par;
    const Tensor want = prefill_logits(*Model::load(path, o), prompts);
    o.weights_cache_dir = dir;
    for (int start = 0; start < 2; ++start) {
      auto m = Model::load(path, o);
      const WeightsCacheStats& s = m->weights_cache_stats();
      if (start == 0) {
        EXPECT_GT(s.misses, 0u);
        EXPECT_EQ(s.hits, 0u);
      } else {
        EXPECT_EQ(s.misses, 0u);
        EXPECT_GT(s.hits, 0u);
      }
      const Tensor got = prefill_logits(*m, prompts);
      ASSERT_EQ(got.shape(), want.shape());
      EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes())) << "start " << start;
    }
    world().barrier();
    if (world().rank() == 0) {
      size_t files = 0;
      for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.path().extension() == ".moe-ep-cache";
      EXPECT_EQ(files, static_cast<size_t>(R)) << "one file per rank";
      std::filesystem::remove_all(dir);
    }
    world().barrier();
  }
}

}  // namespace
}  // namespace moe
