#include "loader/weights_cache/weights_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/cpu.h"

namespace moe {

namespace fs = std::filesystem;

namespace {

// Layout of a cache file: a header page, the tensors, then the index (JSON).
constexpr char kMagic[8] = {'M', 'O', 'E', 'E', 'P', 'W', 'C', '\n'};
// Bumped when the file layout or a record's fields change.
constexpr uint64_t kVersion = 2;
constexpr uint64_t kPage = 4096;
struct Header {
  char magic[8];
  uint64_t version;
  uint64_t index_offset, index_bytes, index_checksum;
  uint64_t file_bytes;
};

uint64_t align_up(uint64_t v) { return (v + kPage - 1) / kPage * kPage; }

// Tensor i starts (i * 9 mod 32) x 128 bytes past a page boundary: kTensorAlign-aligned
// as a fresh allocation is, but not all at the same offset in a page. With every tensor
// on a page boundary, the streams a decode step reads together (an expert's codes and
// its scales and zero points) sat at the same page offsets, and decode ran 10-25 %
// slower than from the packer's own allocations (Q4_0, 2-core Zen 4, medians of 3-5
// runs); staggered, it runs as fast. The mapped memory itself streams as fast as
// anonymous memory there (36-43 GB/s both, measured on the same pages; docs/PERF.md).
uint64_t stagger(size_t i) { return (i * 9 % 32) * kTensorAlign; }

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull;
inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t round64(uint64_t acc, uint64_t in) { return rotl(acc + in * kP2, 31) * kP1; }
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// One chunk: four independent lanes of 8 bytes (the multiplies overlap), then the tail.
uint64_t hash_chunk(const unsigned char* p, size_t n, uint64_t seed) {
  uint64_t a = seed + kP1 + kP2, b = seed + kP2, c = seed, d = seed - kP1;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = round64(a, load64(p + i));
    b = round64(b, load64(p + i + 8));
    c = round64(c, load64(p + i + 16));
    d = round64(d, load64(p + i + 24));
  }
  uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18) + n;
  for (; i + 8 <= n; i += 8) h = rotl(h ^ round64(0, load64(p + i)), 27) * kP1 + kP3;
  for (; i < n; ++i) h = rotl(h ^ (p[i] * kP3), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  return h;
}

std::string stat_identity(const std::string& path) {
  struct stat st {};
  MOE_CHECK(::stat(path.c_str(), &st) == 0, "--weights-cache: cannot stat '{}': {}", path, std::strerror(errno));
  return fmt::format("{} size {} mtime {}.{:09} inode {}", path, static_cast<uint64_t>(st.st_size),
                     static_cast<int64_t>(st.st_mtim.tv_sec), static_cast<int64_t>(st.st_mtim.tv_nsec),
                     static_cast<uint64_t>(st.st_ino));
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

}  // namespace

uint64_t cache_checksum(const void* data, size_t bytes) {
  constexpr size_t kChunk = size_t{1} << 20;  // 1 MiB: ~0.1 ms of hashing, many per thread
  const auto* p = static_cast<const unsigned char*>(data);
  const int64_t n_chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
  std::vector<uint64_t> part(static_cast<size_t>(n_chunks));
#pragma omp parallel for schedule(static) if (n_chunks > 4)
  for (int64_t c = 0; c < n_chunks; ++c) {
    const size_t b = static_cast<size_t>(c) * kChunk;
    part[c] = hash_chunk(p + b, std::min(kChunk, bytes - b), static_cast<uint64_t>(c));
  }
  return hash_chunk(reinterpret_cast<const unsigned char*>(part.data()), part.size() * 8, bytes);
}

// ---- CacheRecord ----

void CacheRecord::put(const std::string& name, const Tensor& t) {
  if (!t.defined()) return;
  tensors[name] = t.is_contiguous() ? t : t.clone();
}

Tensor CacheRecord::tensor(const std::string& name) const {
  const auto it = tensors.find(name);
  return it == tensors.end() ? Tensor() : it->second;
}

int64_t CacheRecord::get(const std::string& name) const {
  const auto it = ints.find(name);
  MOE_CHECK(it != ints.end(), "weights cache record: no field '{}'", name);
  return it->second;
}

size_t CacheRecord::nbytes() const {
  size_t b = 0;
  for (const auto& [name, t] : tensors) b += t.nbytes();
  return b;
}

// ---- the mapped file ----

struct WeightsCache::Mapped {
  void* base = MAP_FAILED;
  size_t bytes = 0;
  nlohmann::json records;  // key -> {"ints": {...}, "tensors": {name: {...}}}
  ~Mapped() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
};

namespace {

// Maps and checks `path`. Returns null with *why set when it is absent or invalid.
std::shared_ptr<WeightsCache::Mapped> map_file(const std::string& path, const std::string& identity,
                                               std::string* why);

}  // namespace

std::string WeightsCache::checkpoint_identity(const std::string& model_path) {
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) {
    // Every regular file directly in the directory: config, shards, index, generation
    // config. Subdirectories (a cache kept inside the model directory) are not read.
    for (const auto& e : fs::directory_iterator(model_path, ec))
      if (e.is_regular_file(ec)) files.push_back(e.path().string());
  } else {
    files.push_back(model_path);
    // A split GGUF: every part of it.
    static const std::regex split(R"((.*)-(\d{5})-of-(\d{5})\.gguf)");
    std::smatch m;
    const std::string name = fs::path(model_path).filename().string();
    if (std::regex_match(name, m, split)) {
      const int n = std::stoi(m[3].str());
      const fs::path dir = fs::path(model_path).parent_path();
      for (int i = 1; i <= n; ++i) {
        const fs::path part = dir / fmt::format("{}-{:05}-of-{:05}.gguf", m[1].str(), i, n);
        if (part.string() != model_path && fs::exists(part, ec)) files.push_back(part.string());
      }
    }
  }
  std::sort(files.begin(), files.end());
  std::string id;
  for (const std::string& f : files) id += stat_identity(f) + "\n";
  return id;
}

std::unique_ptr<WeightsCache> WeightsCache::open(const WeightsCacheParams& p) {
  MOE_CHECK(!p.dir.empty(), "--weights-cache: empty directory name");
  std::error_code ec;
  fs::create_directories(p.dir, ec);
  MOE_CHECK(fs::is_directory(p.dir), "--weights-cache {}: not a directory and cannot be created{}", p.dir,
            ec ? ": " + ec.message() : "");
  std::unique_ptr<WeightsCache> c(new WeightsCache());
  c->p_ = p;
  const fs::path model = fs::absolute(p.model_path).lexically_normal();
  std::string name = model.filename().string();
  if (name.empty()) name = model.parent_path().filename().string();
  // The ISA level names the file too: a run under MOE_ISA=avx2 keeps its own file
  // instead of rebuilding the native one's.
  const std::string which = model.string() + "\n" + p.layout + "\n" + isa_name(active_isa());
  c->path_ = (fs::path(p.dir) / fmt::format("{}-{}.r{}.moe-ep-cache", name,
                                            hex64(cache_checksum(which.data(), which.size())), p.rank))
                 .string();
  // The running executable's own inode (stat follows /proc/self/exe even when the file
  // was since replaced or deleted): another build may pack differently.
  c->identity_ = fmt::format("moe-ep weights cache {}\nexecutable {}\nisa {}\nlayout {}\ncheckpoint\n{}", kVersion,
                             stat_identity("/proc/self/exe"), isa_name(active_isa()), p.layout,
                             checkpoint_identity(p.model_path));
  std::string why;
  c->mapped_ = map_file(c->path_, c->identity_, &why);
  if (p.verbose && p.rank == 0) {
    if (c->mapped_)
      fmt::print(stderr, "moe-ep: weights cache: mapping {} ({:.2f} GB)\n", c->path_, c->mapped_->bytes / 1e9);
    else
      fmt::print(stderr, "moe-ep: weights cache: {}: {}; packing the weights and writing it\n", c->path_, why);
  }
  return c;
}

WeightsCache::~WeightsCache() = default;

namespace {

bool parse_shape(const nlohmann::json& j, Shape* s) {
  if (!j.is_array() || j.size() > 8) return false;
  for (const auto& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) return false;
    s->push_back(d.get<int64_t>());
  }
  return true;
}

std::shared_ptr<WeightsCache::Mapped> map_file(const std::string& path, const std::string& identity,
                                               std::string* why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = errno == ENOENT ? "no cache file yet" : fmt::format("cannot open it ({})", std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kPage)) {
    ::close(fd);
    *why = "shorter than its header";
    return nullptr;
  }
  auto m = std::make_shared<WeightsCache::Mapped>();
  m->bytes = static_cast<size_t>(st.st_size);
  // Private and writable: a tensor written in place (EPLB moving expert slots) gets
  // its own pages; the file is never written through this mapping.
  m->base = ::mmap(nullptr, m->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m->base == MAP_FAILED) {
    *why = fmt::format("cannot map it ({})", std::strerror(errno));
    return nullptr;
  }
  Header h;
  std::memcpy(&h, m->base, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    *why = "not a moe-ep weights cache file (bad magic)";
    return nullptr;
  }
  if (h.version != kVersion) {
    *why = fmt::format("written by cache version {}, this build reads {}", h.version, kVersion);
    return nullptr;
  }
  if (h.file_bytes != m->bytes || h.index_offset < kPage || h.index_offset > m->bytes ||
      h.index_bytes > m->bytes - h.index_offset) {
    *why = fmt::format("its header does not fit the file ({} bytes; the header says {}, index at {} + {})", m->bytes,
                       h.file_bytes, h.index_offset, h.index_bytes);
    return nullptr;
  }
  const char* idx = static_cast<const char*>(m->base) + h.index_offset;
  if (cache_checksum(idx, h.index_bytes) != h.index_checksum) {
    *why = "its index fails its checksum";
    return nullptr;
  }
  nlohmann::json j = nlohmann::json::parse(idx, idx + h.index_bytes, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("identity") || !j["identity"].is_string() || !j.contains("records") ||
      !j["records"].is_object()) {
    *why = "its index is not the expected JSON object";
    return nullptr;
  }
  if (const std::string was = j["identity"].get<std::string>(); was != identity) {
    // Name the first line that differs: "executable ...", "checkpoint ..." (a file's
    // size, mtime or inode), "layout ...".
    size_t at = 0;
    while (at < was.size() && at < identity.size() && was[at] == identity[at]) ++at;
    const size_t line = identity.rfind('\n', at == 0 ? 0 : at - 1);
    const std::string now = identity.substr(line == std::string::npos ? 0 : line + 1);
    *why = fmt::format("stale (written for another state of: {})", now.substr(0, now.find('\n')));
    return nullptr;
  }
  // Every tensor entry: a known dtype, a shape whose bytes are the entry's bytes, inside
  // the data area, kTensorAlign-aligned.
  for (const auto& [key, rec] : j["records"].items()) {
    bool ok = rec.is_object() && rec.contains("ints") && rec["ints"].is_object() && rec.contains("tensors") &&
              rec["tensors"].is_object();
    static const nlohmann::json kNone = nlohmann::json::object();  // what a malformed record iterates
    for (const auto& [f, v] : (ok ? rec["ints"] : kNone).items()) ok = ok && v.is_number_integer();
    for (const auto& [name, t] : (ok ? rec["tensors"] : kNone).items()) {
      Shape s;
      ok = ok && t.is_object() && t.contains("dtype") && t["dtype"].is_number_unsigned() &&
           t["dtype"].get<uint64_t>() <= static_cast<uint64_t>(DType::F8E5M2) && t.contains("shape") &&
           parse_shape(t["shape"], &s) && t.contains("offset") && t["offset"].is_number_unsigned() &&
           t.contains("bytes") && t["bytes"].is_number_unsigned() && t.contains("checksum") &&
           t["checksum"].is_number_unsigned();
      if (!ok) break;
      const auto dt = static_cast<DType>(t["dtype"].get<uint64_t>());
      const uint64_t off = t["offset"].get<uint64_t>(), bytes = t["bytes"].get<uint64_t>();
      uint64_t expect = dtype_size(dt);
      for (const int64_t d : s)
        if (d != 0 && expect > (uint64_t{1} << 50) / static_cast<uint64_t>(d)) ok = false;
        else expect *= static_cast<uint64_t>(d);
      ok = ok && expect == bytes && off % kTensorAlign == 0 && off >= kPage && off <= h.index_offset &&
           bytes <= h.index_offset - off;
    }
    if (!ok) {
      *why = fmt::format("record '{}' of its index is malformed", key);
      return nullptr;
    }
  }
  m->records = std::move(j["records"]);
  return m;
}

}  // namespace

std::optional<CacheRecord> WeightsCache::find(const std::string& key) {
  if (mapped_ && mapped_->records.contains(key)) {
    const nlohmann::json& rec = mapped_->records[key];
    CacheRecord r;
    bool ok = true;
    for (const auto& [name, v] : rec["ints"].items()) r.ints[name] = v.get<int64_t>();
    for (const auto& [name, t] : rec["tensors"].items()) {
      Shape s;
      parse_shape(t["shape"], &s);
      char* data = static_cast<char*>(mapped_->base) + t["offset"].get<uint64_t>();
      const uint64_t bytes = t["bytes"].get<uint64_t>();
      if (cache_checksum(data, bytes) != t["checksum"].get<uint64_t>()) {
        ok = false;
        if (p_.verbose)
          fmt::print(stderr, "moe-ep: weights cache: {}: tensor '{}' of '{}' fails its checksum; repacking it\n",
                     path_, name, key);
        break;
      }
      r.tensors[name] = Tensor::wrap(data, s, static_cast<DType>(t["dtype"].get<uint64_t>()), mapped_);
    }
    if (ok) {
      ++hits_;
      mapped_bytes_ += r.nbytes();
      records_[key] = r;
      return r;
    }
  }
  ++misses_;
  return std::nullopt;
}

void WeightsCache::add(const std::string& key, CacheRecord r) { records_[key] = std::move(r); }

void WeightsCache::reject(const std::string& key, const std::string& why) {
  const auto it = records_.find(key);
  if (it != records_.end()) {
    mapped_bytes_ -= it->second.nbytes();
    records_.erase(it);
    --hits_;
  }
  ++misses_;
  if (p_.verbose) fmt::print(stderr, "moe-ep: weights cache: {}: record '{}' refused ({}); repacking it\n", path_, key, why);
}

uint64_t WeightsCache::commit() {
  if (misses_ == 0) {
    records_.clear();
    return 0;
  }
  // Tensors on page boundaries after the header page; the index after them.
  nlohmann::json recs = nlohmann::json::object();
  uint64_t off = kPage;
  std::vector<std::pair<uint64_t, const Tensor*>> order;
  for (const auto& [key, r] : records_) {
    nlohmann::json ints = nlohmann::json::object(), ts = nlohmann::json::object();
    for (const auto& [f, v] : r.ints) ints[f] = v;
    for (const auto& [name, t] : r.tensors) {
      ts[name] = {{"dtype", static_cast<uint64_t>(t.dtype())},
                  {"shape", t.shape()},
                  {"offset", off},
                  {"bytes", static_cast<uint64_t>(t.nbytes())},
                  {"checksum", cache_checksum(t.raw(), t.nbytes())}};
      order.emplace_back(off, &t);
      off = align_up(off + t.nbytes()) + stagger(order.size());
    }
    recs[key] = {{"ints", ints}, {"tensors", ts}};
  }
  const std::string index = nlohmann::json{{"identity", identity_}, {"records", recs}}.dump();
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.index_offset = off;
  h.index_bytes = index.size();
  h.index_checksum = cache_checksum(index.data(), index.size());
  h.file_bytes = off + index.size();

  // Written whole to a temp file of this process, then renamed over the old file. No
  // fsync: it made the first start 7 s slower for a 1.5 GB file here, and a file the
  // crash of the machine left torn fails its checksums at the next start and is rebuilt.
  std::vector<char> page(kPage, 0);
  std::memcpy(page.data(), &h, sizeof h);
  std::vector<FilePiece> pieces{{0, page.data(), kPage}};
  for (const auto& [at, t] : order) pieces.push_back({at, t->raw(), t->nbytes()});
  pieces.push_back({h.index_offset, index.data(), index.size()});
  write_file_atomic(path_, pieces, "--weights-cache", /*sync=*/false);
  const size_t n_records = records_.size();
  records_.clear();  // the model owns its tensors; the cache keeps none alive
  if (p_.verbose && p_.rank == 0)
    fmt::print(stderr, "moe-ep: weights cache: wrote {} ({:.2f} GB, {} records)\n", path_, h.file_bytes / 1e9,
               n_records);
  return h.file_bytes;
}

}  // namespace moe
