#include "loader/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "loader/gguf/gguf_checkpoint.h"

namespace moe {

namespace fs = std::filesystem;

struct Checkpoint::State {
  std::string dir;
  nlohmann::json config;
  std::string index_path;  // empty when there is no index

  struct Shard {
    std::string file;  // name inside dir
    std::string path;  // dir/file
    std::shared_ptr<SafetensorsFile> sf;  // null until opened
  };
  std::vector<Shard> shards;
  std::map<std::string, size_t> key_shard;  // key -> index in shards (sorted)

  mutable std::mutex mu;  // guards Shard::sf

  // The opened shard holding `key`; throws if the key is unknown.
  SafetensorsFile& shard_for(const std::string& key, size_t* shard_idx) {
    auto it = key_shard.find(key);
    MOE_CHECK(it != key_shard.end(), "tensor '{}' not found in checkpoint {}", key, dir);
    *shard_idx = it->second;
    std::lock_guard<std::mutex> lock(mu);
    Shard& sh = shards[it->second];
    if (!sh.sf) sh.sf = SafetensorsFile::open(sh.path);
    return *sh.sf;
  }

  // The opened shard holding `key`, which must really hold it (an index can lie).
  SafetensorsFile& file_with(const std::string& key) {
    size_t si = 0;
    SafetensorsFile& sf = shard_for(key, &si);
    MOE_CHECK(sf.find(key), "tensor '{}' is listed in {} for shard '{}' but is missing from that file", key,
              index_path, shards[si].path);
    return sf;
  }

  const TensorInfo& info(const std::string& key) { return *file_with(key).find(key); }
};

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  MOE_CHECK(in, "cannot read '{}'", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  MOE_CHECK(!in.bad(), "error reading '{}'", p.string());
  return ss.str();
}

bool is_regular(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);  // follows symlinks
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir_in) {
  auto s = std::make_shared<State>();
  s->dir = dir_in;
  if (gguf::is_gguf_file(dir_in)) {
    gguf::CheckpointTables t = gguf::open_checkpoint_tables(dir_in);
    s->config = std::move(t.config);
    for (auto& sf : t.files) {
      const size_t idx = s->shards.size();
      for (const TensorInfo& ti : sf->tensors()) s->key_shard.emplace(ti.name, idx);  // unique: GgufModel checked
      const std::string p = sf->path();
      s->shards.push_back({fs::path(p).filename().string(), p, std::move(sf)});
    }
    return Checkpoint(std::move(s));
  }
  const fs::path dir(dir_in);
  {
    std::error_code ec;
    MOE_CHECK(fs::is_directory(dir, ec), "checkpoint {}: not a directory (or a GGUF file)", dir_in);
  }

  // config.json
  const fs::path cfg = dir / "config.json";
  MOE_CHECK(is_regular(cfg), "checkpoint {}: config.json not found (expected '{}')", dir_in,
            cfg.string());
  {
    // Strict as the index and the headers: a key given twice (one value silently
    // dropped) or values nested deeper than any real config (whose every recursive walk,
    // a dump() to compare ranks' configs for one, would overflow the stack) is an error.
    s->config = parse_json_strict(read_text(cfg), "'" + cfg.string() + "'");
    MOE_CHECK(s->config.is_object(), "'{}': is a JSON {}, expected a JSON object", cfg.string(),
              s->config.type_name());
  }

  const fs::path index = dir / "model.safetensors.index.json";
  const fs::path single = dir / "model.safetensors";
  if (is_regular(index)) {
    s->index_path = index.string();
    const nlohmann::json j = parse_json_strict(read_text(index), "'" + s->index_path + "'");
    MOE_CHECK(j.is_object(), "'{}': is a JSON {}, expected a JSON object", s->index_path,
              j.type_name());
    auto wm = j.find("weight_map");
    MOE_CHECK(wm != j.end(), "'{}': missing key 'weight_map'", s->index_path);
    MOE_CHECK(wm->is_object(), "'{}': weight_map is a JSON {}, expected an object", s->index_path,
              wm->type_name());
    std::map<std::string, size_t> shard_idx;
    for (const auto& [key, v] : wm->items()) {
      MOE_CHECK(v.is_string(), "'{}': weight_map entry '{}' is a JSON {}, expected a file name",
                s->index_path, key, v.type_name());
      const std::string& file = v.get_ref<const std::string&>();
      MOE_CHECK(!file.empty() && file != "." && file != ".." &&
                    file.find('/') == std::string::npos && file.find('\\') == std::string::npos &&
                    file.find('\0') == std::string::npos,
                "'{}': weight_map entry '{}' names shard '{}', expected a plain file name in the "
                "checkpoint directory (no path separators, '.' or '..')",
                s->index_path, key, file);
      auto [it, inserted] = shard_idx.emplace(file, s->shards.size());
      if (inserted) {
        const fs::path p = dir / file;
        MOE_CHECK(is_regular(p), "'{}': shard file '{}' (holding '{}') does not exist",
                  s->index_path, p.string(), key);
        s->shards.push_back({file, p.string(), nullptr});
      }
      s->key_shard.emplace(key, it->second);
    }
  } else {
    std::vector<std::string> files;
    if (is_regular(single)) {
      files.push_back("model.safetensors");
    } else {
      std::error_code ec;
      fs::directory_iterator itd(dir, ec);
      MOE_CHECK(!ec, "checkpoint {}: cannot list the directory: {}", dir_in, ec.message());
      for (const auto& e : itd) {
        const std::string name = e.path().filename().string();
        if (name.size() > 12 && name.ends_with(".safetensors") && is_regular(e.path()))
          files.push_back(name);
      }
      std::sort(files.begin(), files.end());
    }
    MOE_CHECK(!files.empty(),
              "checkpoint {}: no weights found (expected model.safetensors.index.json, "
              "model.safetensors or *.safetensors)",
              dir_in);
    for (const std::string& file : files) {
      State::Shard sh{file, (dir / file).string(), nullptr};
      sh.sf = SafetensorsFile::open(sh.path);
      const size_t idx = s->shards.size();
      for (const TensorInfo& ti : sh.sf->tensors()) {
        auto [it, inserted] = s->key_shard.emplace(ti.name, idx);
        MOE_CHECK(inserted, "checkpoint {}: tensor '{}' is present in both '{}' and '{}'", dir_in,
                  ti.name, s->shards[it->second].path, sh.path);
      }
      s->shards.push_back(std::move(sh));
    }
  }
  return Checkpoint(std::move(s));
}

const nlohmann::json& Checkpoint::config() const { return s_->config; }
const std::string& Checkpoint::dir() const { return s_->dir; }

bool Checkpoint::has(const std::string& key) const { return s_->key_shard.count(key) != 0; }

const TensorInfo& Checkpoint::info(const std::string& key) const { return s_->info(key); }

Tensor Checkpoint::view(const std::string& key) const {
  return s_->file_with(key).view(key);
}

Tensor Checkpoint::view_raw(const std::string& key) const { return s_->file_with(key).view_raw(key); }

Tensor Checkpoint::view_raw(const std::string& key, uint64_t begin, uint64_t end) const {
  return s_->file_with(key).view_raw(key, begin, end);
}

Tensor Checkpoint::view_elems(const std::string& key, int64_t elem_begin, const Shape& shape) const {
  return s_->file_with(key).view_elems(key, elem_begin, shape);
}

void Checkpoint::copy_strided(const std::string& key, int64_t elem_begin, int64_t piece, int64_t stride,
                              int64_t count, void* dst) const {
  s_->file_with(key).copy_strided(key, elem_begin, piece, stride, count, dst);
}

Tensor Checkpoint::view_rows(const std::string& key, int64_t begin, int64_t end) const {
  const TensorInfo& ti = info(key);
  MOE_CHECK(!ti.shape.empty() && 0 <= begin && begin <= end && end <= ti.shape[0],
            "tensor '{}' in {} has shape {}: rows [{}, {}) are outside it", key, file_of(key),
            shape_str(ti.shape), begin, end);
  Shape shape = ti.shape;
  shape[0] = end - begin;
  int64_t row = 1;
  for (size_t d = 1; d < ti.shape.size(); ++d) row *= ti.shape[d];  // fits: validated at open
  return view_elems(key, begin * row, shape);
}

void Checkpoint::prefetch_elems(const std::string& key, int64_t elem_begin, int64_t n) const {
  if (!has(key)) return;
  size_t si = 0;
  s_->shard_for(key, &si).prefetch_elems(key, elem_begin, n);
}

void Checkpoint::release_elems(const std::string& key, int64_t elem_begin, int64_t n) const {
  if (!has(key)) return;
  size_t si = 0;
  s_->shard_for(key, &si).release_elems(key, elem_begin, n);
}

std::vector<std::string> Checkpoint::keys_with_prefix(const std::string& prefix) const {
  std::vector<std::string> out;
  for (auto it = s_->key_shard.lower_bound(prefix); it != s_->key_shard.end() && it->first.starts_with(prefix);
       ++it)
    out.push_back(it->first);
  return out;
}

size_t Checkpoint::open_all_shards() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  for (auto& sh : s_->shards)
    if (!sh.sf) sh.sf = SafetensorsFile::open(sh.path);
  return s_->shards.size();
}

uint64_t Checkpoint::total_file_bytes() const {
  open_all_shards();
  std::lock_guard<std::mutex> lock(s_->mu);
  uint64_t total = 0;
  for (const auto& sh : s_->shards) total += sh.sf->file_size();
  return total;
}

uint64_t Checkpoint::header_bytes_opened() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  uint64_t total = 0;
  for (const auto& sh : s_->shards)
    if (sh.sf) total += sh.sf->data_start();
  return total;
}

std::vector<std::string> Checkpoint::keys() const {
  std::vector<std::string> out;
  out.reserve(s_->key_shard.size());
  for (const auto& [k, v] : s_->key_shard) out.push_back(k);
  return out;
}

std::string Checkpoint::file_of(const std::string& key) const {
  auto it = s_->key_shard.find(key);
  MOE_CHECK(it != s_->key_shard.end(), "tensor '{}' not found in checkpoint {}", key, s_->dir);
  return s_->shards[it->second].path;
}

uint64_t Checkpoint::bytes_touched() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  uint64_t total = 0;
  for (const auto& sh : s_->shards)
    if (sh.sf) total += sh.sf->bytes_touched();
  return total;
}

uint64_t Checkpoint::bytes_released() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  uint64_t total = 0;
  for (const auto& sh : s_->shards)
    if (sh.sf) total += sh.sf->bytes_released();
  return total;
}

size_t Checkpoint::shards_opened() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  size_t n = 0;
  for (const auto& sh : s_->shards) n += sh.sf != nullptr;
  return n;
}

}  // namespace moe
