#include "comm/consistency.h"

#include <cstdint>
#include <cstring>

#include "core/check.h"

namespace moe {
namespace {

uint64_t fnv1a(const std::string& name, const std::string& value) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ull;
    }
  };
  mix(name);
  h ^= 0xff;  // separator, so ("ab","c") and ("a","bc") differ
  h *= 0x100000001b3ull;
  mix(value);
  return h;
}

// Every rank's string, gathered in rank order (collective).
std::vector<std::string> gather_strings(Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  const uint64_t len = mine.size();
  std::vector<uint64_t> lens(n);
  comm.all_gather(&len, sizeof(len), lens.data());
  std::vector<size_t> bytes(lens.begin(), lens.end());
  size_t total = 0;
  for (size_t b : bytes) total += b;
  std::string all(total, '\0');
  comm.all_gather_v(mine.data(), mine.size(), all.data(), bytes);
  std::vector<std::string> out(n);
  size_t off = 0;
  for (int r = 0; r < n; ++r) {
    out[r] = all.substr(off, bytes[r]);
    off += bytes[r];
  }
  return out;
}

// "0", "0,2", "1-3,5"
std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += j >= i + 2 ? fmt::format("{}-{}", ranks[i], ranks[j]) : std::to_string(ranks[i]);
    if (j == i + 1) s += fmt::format(",{}", ranks[j]);
    i = j + 1;
  }
  return s;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    else out += c;
  }
  return out;
}

// The value quoted; a long one is cut to a window around its first difference from `ref`.
std::string excerpt(const std::string& v, const std::string& ref) {
  constexpr size_t kMax = 120;
  if (v.size() <= kMax) return fmt::format("'{}'", escape(v));
  size_t pos = 0;
  while (pos < v.size() && pos < ref.size() && v[pos] == ref[pos]) ++pos;
  const size_t start = pos > 40 ? pos - 40 : 0;
  const size_t len = std::min(kMax, v.size() - start);
  return fmt::format("'{}{}{}' ({} chars, differs from rank 0's at char {})", start > 0 ? "..." : "",
                     escape(v.substr(start, len)), start + len < v.size() ? "..." : "", v.size(), pos);
}

}  // namespace

void check_same_on_all_ranks(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& fields) {
  const int n = comm.size();
  if (n == 1) return;

  // 1. The same number of fields everywhere (else the hash exchange would not match up).
  const uint64_t count = fields.size();
  std::vector<uint64_t> counts(n);
  comm.all_gather(&count, sizeof(count), counts.data());
  bool same_count = true;
  for (int r = 0; r < n; ++r) same_count = same_count && counts[r] == counts[0];
  if (!same_count) {
    std::string names;
    for (const auto& f : fields) {
      if (!names.empty()) names += ", ";
      names += f.first;
    }
    const auto all = gather_strings(comm, names);
    std::string msg = "ranks disagree on the fields to check:";
    for (int r = 0; r < n; ++r) msg += fmt::format("{} rank {} has {} ({})", r ? "," : "", r, counts[r], all[r]);
    MOE_FAIL("{}", msg);
  }

  // 2. All hashes, compared with rank 0's.
  std::vector<uint64_t> mine(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) mine[i] = fnv1a(fields[i].first, fields[i].second);
  std::vector<uint64_t> hashes(fields.size() * n);
  comm.all_gather(mine.data(), mine.size() * sizeof(uint64_t), hashes.data());
  size_t bad = fields.size();
  for (size_t i = 0; i < fields.size() && bad == fields.size(); ++i)
    for (int r = 1; r < n; ++r)
      if (hashes[r * fields.size() + i] != hashes[i]) {
        bad = i;
        break;
      }
  if (bad == fields.size()) return;

  // 3. The first differing field: gather every rank's name and value to print them.
  const auto names = gather_strings(comm, fields[bad].first);
  const auto values = gather_strings(comm, fields[bad].second);
  std::string label = fmt::format("'{}'", escape(names[0]));
  for (int r = 1; r < n; ++r)
    if (names[r] != names[0]) {
      label = fmt::format("field #{} (called '{}' on rank 0, '{}' on rank {})", bad, escape(names[0]),
                          escape(names[r]), r);
      break;
    }
  // Ranks grouped by hash, in order of their first rank.
  std::vector<uint64_t> seen;
  std::string msg = fmt::format("ranks disagree on {}:", label);
  for (int r = 0; r < n; ++r) {
    const uint64_t h = hashes[r * fields.size() + bad];
    bool done = false;
    for (uint64_t s : seen) done = done || s == h;
    if (done) continue;
    seen.push_back(h);
    std::vector<int> group;
    for (int q = r; q < n; ++q)
      if (hashes[q * fields.size() + bad] == h) group.push_back(q);
    msg += fmt::format("{} {} {} {} {} (hash {:#018x})", seen.size() > 1 ? "," : "",
                       group.size() > 1 ? "ranks" : "rank", rank_list(group), group.size() > 1 ? "have" : "has",
                       excerpt(values[r], values[0]), h);
  }
  MOE_FAIL("{}", msg);
}

}  // namespace moe
