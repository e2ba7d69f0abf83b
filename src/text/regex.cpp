// See regex.h. The iteration mirrors onig::FindMatches: search from the end of the last
// match; an empty match advances the start by one character, and an empty match found
// while `skip_next_empty` is set (set by every non-empty match, cleared by the first empty
// match after it) is dropped, so "a*" on "baab" gives (0,0) (1,3) (4,4).
#include "text/regex.h"

#include <oniguruma.h>

#include <cstring>
#include <mutex>

#include "core/check.h"
#include "text/unicode.h"

namespace moe::text {

namespace {

void onig_init_once() {
  static std::once_flag flag;
  std::call_once(flag, [] {
    OnigEncoding encs[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encs, 1);
  });
}

struct RegionGuard {
  OnigRegion* r = onig_region_new();
  ~RegionGuard() { onig_region_free(r, 1); }
};

}  // namespace

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  onig_init_once();
  OnigErrorInfo einfo{};
  OnigRegex reg = nullptr;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int r = onig_new(&reg, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT,
                         &einfo);
  if (r != ONIG_NORMAL) {
    OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(buf, r, &einfo);
    MOE_FAIL("invalid regex pattern '{}': {}", pattern, reinterpret_cast<const char*>(buf));
  }
  re_ = reg;
}

Regex::~Regex() {
  if (re_) onig_free(static_cast<OnigRegex>(re_));
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  out.clear();
  RegionGuard region;
  const auto* base = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = base + text.size();
  size_t last_end = 0;
  bool skip_next_empty = false;
  while (last_end <= text.size()) {
    onig_region_clear(region.r);
    const int r = onig_search(static_cast<OnigRegex>(re_), base, end, base + last_end, end, region.r,
                                       ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    if (r < 0) {
      OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(buf, static_cast<int>(r));
      MOE_FAIL("regex '{}' failed while matching: {}", pattern_, reinterpret_cast<const char*>(buf));
    }
    const auto s = static_cast<size_t>(region.r->beg[0]);
    const auto e = static_cast<size_t>(region.r->end[0]);
    last_end = e;
    if (e == s) {
      last_end += e < text.size() ? uni::seq_len(static_cast<unsigned char>(text[e])) : 1;
      if (skip_next_empty) {
        skip_next_empty = false;
        continue;
      }
    } else {
      skip_next_empty = true;
    }
    out.emplace_back(s, e);
  }
}

Pattern Pattern::literal(std::string s) {
  Pattern p;
  // tokenizers compiles an escaped literal as a regex: the empty one matches between every
  // character, so keep that behaviour through the regex path.
  if (s.empty())
    p.regex_ = std::make_shared<Regex>("");
  else
    p.literal_ = std::move(s);
  return p;
}

Pattern Pattern::regex(const std::string& re) {
  Pattern p;
  p.regex_ = std::make_shared<Regex>(re);
  return p;
}

void Pattern::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  if (regex_) {
    regex_->find_all(text, out);
    return;
  }
  out.clear();
  size_t pos = 0;
  while (pos + literal_.size() <= text.size()) {
    const size_t f = text.find(literal_, pos);
    if (f == std::string_view::npos) break;
    out.emplace_back(f, f + literal_.size());
    pos = f + literal_.size();
  }
}

void Pattern::find_matches(std::string_view text, std::vector<Piece>& out) const {
  out.clear();
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  thread_local std::vector<std::pair<size_t, size_t>> m;
  find_all(text, m);
  size_t prev = 0;
  for (auto [s, e] : m) {
    if (prev != s) out.push_back({prev, s, false});
    out.push_back({s, e, true});
    prev = e;
  }
  if (prev != text.size()) out.push_back({prev, text.size(), false});
}

}  // namespace moe::text
