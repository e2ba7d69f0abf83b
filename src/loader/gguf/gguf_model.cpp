// GgufModel: one model over the parts of a split GGUF (or a single file).
#include <sys/stat.h>

#include <cctype>

#include "core/check.h"
#include "loader/gguf/gguf_file.h"

namespace moe::gguf {

namespace {

// "-NNNNN-of-NNNNN.gguf", the suffix llama.cpp's gguf-split and gguf-py give each part.
constexpr size_t kSuffixLen = 20;

bool digits(const std::string& s, size_t at, size_t n) {
  for (size_t i = at; i < at + n; ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

// Splits "<prefix>-00002-of-00005.gguf" into its prefix, part number and count.
bool parse_split_name(const std::string& path, std::string* prefix, int* no, int* count) {
  if (path.size() < kSuffixLen) return false;
  const size_t at = path.size() - kSuffixLen;
  if (path[at] != '-' || !digits(path, at + 1, 5) || path.compare(at + 6, 4, "-of-") != 0 ||
      !digits(path, at + 10, 5) || path.compare(at + 15, 5, ".gguf") != 0)
    return false;
  *prefix = path.substr(0, at);
  *no = std::stoi(path.substr(at + 1, 5));
  *count = std::stoi(path.substr(at + 10, 5));
  return true;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::string split_path(const std::string& path, int no, int count) {
  std::string prefix;
  int n = 0, c = 0;
  MOE_CHECK(parse_split_name(path, &prefix, &n, &c), "gguf model '{}': the name of a split model's part must end in "
            "-NNNNN-of-NNNNN.gguf", path);
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, no, count);
}

GgufModel GgufModel::open(const std::string& first_path) {
  GgufModel m;
  m.parts_.push_back(GgufFile::open(first_path));
  const Metadata& md = m.parts_[0]->metadata();
  const uint32_t count = md.opt_u32("split.count").value_or(1);
  MOE_CHECK(count >= 1, "gguf model '{}': split.count is 0, expected at least 1", first_path);
  if (count > 1) {
    std::string prefix;
    int no = 0, name_count = 0;
    MOE_CHECK(parse_split_name(first_path, &prefix, &no, &name_count), "gguf model '{}': split.count is {} but the "
              "name does not end in -00001-of-{:05d}.gguf, so the other parts cannot be found", first_path, count,
              count);
    MOE_CHECK(no == 1, "gguf model '{}': this is part {} of {}; open the first part '{}'", first_path, no, name_count,
              split_path(first_path, 1, name_count));
    MOE_CHECK(static_cast<uint32_t>(name_count) == count, "gguf model '{}': the name says {} parts, split.count says "
              "{}", first_path, name_count, count);
    for (uint32_t i = 2; i <= count; ++i) {
      const std::string p = split_path(first_path, static_cast<int>(i), static_cast<int>(count));
      MOE_CHECK(is_file(p), "gguf model '{}': part {} of {} '{}' is missing", first_path, i, count, p);
      m.parts_.push_back(GgufFile::open(p));
    }
    for (uint32_t i = 0; i < count; ++i) {
      const GgufFile& part = *m.parts_[i];
      const uint32_t c = part.metadata().get_u32("split.count");
      const uint32_t n = part.metadata().get_u32("split.no");
      MOE_CHECK(c == count && n == i, "gguf model '{}': part '{}' says it is split.no {} of split.count {}, expected "
                "{} of {} (split.no counts from 0)", first_path, part.path(), n, c, i, count);
    }
  }
  m.index(first_path);
  if (const auto want = md.opt_u64("split.tensors.count"); want && count > 1)
    MOE_CHECK(*want == m.by_name_.size(), "gguf model '{}': split.tensors.count is {}, but the {} parts hold {} "
              "tensors", first_path, *want, count, m.by_name_.size());
  return m;
}

void GgufModel::index(const std::string& first_path) {
  for (const auto& part : parts_)
    for (const GgufTensor& t : part->tensors()) {
      auto [it, fresh] = by_name_.emplace(t.name, &t);
      MOE_CHECK(fresh, "gguf model '{}': tensor '{}' is in both '{}' and '{}'", first_path, t.name,
                it->second->file->path(), part->path());
    }
}

GgufModel GgufModel::from_file(std::shared_ptr<GgufFile> file) {
  GgufModel m;
  const std::string path = file->path();
  const uint32_t count = file->metadata().opt_u32("split.count").value_or(1);
  MOE_CHECK(count == 1, "gguf model '{}': split.count is {}; open the model by its first part's path", path, count);
  m.parts_.push_back(std::move(file));
  m.index(path);
  return m;
}

const GgufTensor* GgufModel::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const GgufTensor& GgufModel::tensor(const std::string& name) const {
  const GgufTensor* t = find(name);
  MOE_CHECK(t, "gguf model '{}': no tensor named '{}' ({} tensors in {} file(s))", parts_.front()->path(), name,
            by_name_.size(), parts_.size());
  return *t;
}

std::vector<const GgufTensor*> GgufModel::tensors() const {
  std::vector<const GgufTensor*> out;
  out.reserve(by_name_.size());
  for (const auto& part : parts_)
    for (const GgufTensor& t : part->tensors()) out.push_back(&t);
  return out;
}

}  // namespace moe::gguf
