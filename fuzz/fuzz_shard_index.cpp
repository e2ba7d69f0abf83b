// libFuzzer: arbitrary bytes as model.safetensors.index.json in a checkpoint directory
// that also holds a config.json and the four real shards of tests/fixtures/qwen2_moe
// (so the fixture's own index, the seed, opens and its keys resolve). The directory is
// made once per process with mkdtemp under /tmp and removed at exit; each input only
// rewrites the index there. Checkpoint::open and the accessors (keys, has, info,
// file_of, view, keys_with_prefix, open_all_shards) must either work or throw
// moe::Error, and what works must be consistent:
//   - keys() is sorted and unique, has() is true for each of them and false for others;
//   - file_of(key) is a file directly inside the directory (no "/", "." or ".." in the
//     shard name: the index must not reach outside it);
//   - info(key) names that key and its view has the shape and dtype info() gives.
// Nothing writes: the checkpoint is read-only, so an input cannot change the directory.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "core/check.h"
#include "fuzz_assert.h"
#include "loader/checkpoint.h"

namespace fs = std::filesystem;

namespace {

std::string g_dir;  // the per-process checkpoint directory

void remove_dir() {
  if (g_dir.empty()) return;
  std::error_code ec;
  fs::remove_all(g_dir, ec);
}

void write_file(const fs::path& p, const uint8_t* data, size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    fprintf(stderr, "fuzz_shard_index: cannot write %s\n", p.c_str());
    std::abort();
  }
}

void make_dir() {
  char tmpl[] = "/tmp/fuzz_shard_index.XXXXXX";
  if (!mkdtemp(tmpl)) {
    perror("fuzz_shard_index: mkdtemp");
    std::abort();
  }
  g_dir = tmpl;
  std::atexit(remove_dir);
  const fs::path src = fs::path(MOE_FIXTURES_DIR) / "qwen2_moe";
  fs::copy_file(src / "config.json", fs::path(g_dir) / "config.json");
  for (int i = 1; i <= 4; ++i) {
    const std::string name = "model-0000" + std::to_string(i) + "-of-00004.safetensors";
    fs::copy_file(src / name, fs::path(g_dir) / name);
  }
}

void exercise(const moe::Checkpoint& ck) {
  const std::vector<std::string> keys = ck.keys();
  for (size_t i = 1; i < keys.size(); ++i) FUZZ_ASSERT(keys[i - 1] < keys[i]);
  FUZZ_ASSERT(!ck.has("fuzz: not a key"));
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& key = keys[i];
    FUZZ_ASSERT(ck.has(key));
    // Every key's file, but only the first few keys' tensors (an index can list thousands).
    const fs::path file = ck.file_of(key);
    FUZZ_ASSERT(file.parent_path() == fs::path(g_dir));
    const std::string name = file.filename().string();
    FUZZ_ASSERT(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos);
    if (i >= 8 && i + 1 != keys.size()) continue;
    try {
      const moe::TensorInfo& ti = ck.info(key);
      FUZZ_ASSERT(ti.name == key);
      const moe::Tensor t = ck.view(key);
      FUZZ_ASSERT(t.shape() == ti.shape && t.dtype() == ti.dtype && t.nbytes() == ti.nbytes);
    } catch (const moe::Error&) {
      // a shard that is not a valid safetensors file, or a key missing from its shard
    }
  }
  if (!keys.empty()) {
    const std::vector<std::string> pre = ck.keys_with_prefix(keys[0].substr(0, keys[0].size() / 2));
    FUZZ_ASSERT(!pre.empty() && pre[0] == keys[0]);
  }
  try {
    FUZZ_ASSERT(ck.open_all_shards() >= 1 || keys.empty());
    (void)ck.total_file_bytes();
  } catch (const moe::Error&) {
  }
  (void)ck.header_bytes_opened();
  (void)ck.bytes_touched();
  (void)ck.shards_opened();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (g_dir.empty()) make_dir();
  write_file(fs::path(g_dir) / "model.safetensors.index.json", data, size);
  std::optional<moe::Checkpoint> ck;
  try {
    ck = moe::Checkpoint::open(g_dir);
  } catch (const moe::Error&) {
    return 0;
  }
  exercise(*ck);
  return 0;
}
