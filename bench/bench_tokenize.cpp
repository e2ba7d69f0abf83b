// Tokenizer throughput on one thread.
//
//   bench_tokenize <tokenizer_dir> <text_file> [--ids <ids.json>] [--repeat N] [--mode whole|lines]
//
// Loads the tokenizer (timed), reads the text, and when --ids is given first checks that
// encode(text, add_special_tokens=false) equals that JSON list of ids (whole mode) or list
// of lists (lines mode: one per '\n'-separated line) -- tools/bench_tokenize.py writes it
// from HF `tokenizers`. Then times encode (best of N): MB/s of input text and tokens/s,
// and decode of the ids. Prints one JSON line per measurement so the Python side can
// parse it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  MOE_CHECK(f.good(), "cannot open {}", p);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) {
      out.push_back(s.substr(pos));
      break;
    }
    out.push_back(s.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <tokenizer_dir> <text_file> [--ids ids.json] [--repeat N] [--mode whole|lines]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1], text_path = argv[2];
  std::string ids_path, mode = "whole";
  int repeat = 5;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--ids") ids_path = argv[i + 1];
    else if (a == "--repeat") repeat = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--mode") mode = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    auto t0 = Clock::now();
    auto tok = moe::text::Tokenizer::from_dir(dir);
    const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::string text = slurp(text_path);
    const std::vector<std::string> lines = mode == "lines" ? split_lines(text) : std::vector<std::string>{text};
    const moe::text::EncodeOptions opt{.add_special_tokens = false};

    std::vector<std::vector<int32_t>> ids(lines.size());
    for (size_t i = 0; i < lines.size(); ++i) ids[i] = tok->encode(lines[i], opt);
    size_t ntok = 0;
    for (const auto& v : ids) ntok += v.size();

    bool checked = false, same = true;
    if (!ids_path.empty()) {
      const auto ref = nlohmann::json::parse(slurp(ids_path));
      std::vector<std::vector<int32_t>> want;
      if (mode == "lines")
        want = ref.get<std::vector<std::vector<int32_t>>>();
      else
        want.push_back(ref.get<std::vector<int32_t>>());
      checked = true;
      same = want == ids;
      if (!same) {
        for (size_t i = 0; i < std::min(want.size(), ids.size()); ++i)
          if (want[i] != ids[i]) {
            size_t k = 0;
            while (k < std::min(want[i].size(), ids[i].size()) && want[i][k] == ids[i][k]) ++k;
            std::fprintf(stderr, "MISMATCH in line %zu at token %zu (ours %zu tokens, reference %zu)\n", i, k,
                         ids[i].size(), want[i].size());
            break;
          }
      }
    }

    double best_enc = 1e30, best_dec = 1e30;
    for (int r = 0; r < repeat; ++r) {
      auto a = Clock::now();
      size_t n = 0;
      for (const auto& l : lines) n += tok->encode(l, opt).size();
      const double e = std::chrono::duration<double>(Clock::now() - a).count();
      if (n != ntok) {
        std::fprintf(stderr, "encode is not deterministic\n");
        return 1;
      }
      best_enc = std::min(best_enc, e);
      a = Clock::now();
      size_t bytes = 0;
      for (const auto& v : ids) bytes += tok->decode(v).size();
      best_dec = std::min(best_dec, std::chrono::duration<double>(Clock::now() - a).count());
      (void)bytes;
    }
    const double mb = static_cast<double>(text.size()) / 1e6;
    nlohmann::json out = {{"impl", "moe::text"},
                          {"mode", mode},
                          {"load_s", load_s},
                          {"bytes", text.size()},
                          {"tokens", ntok},
                          {"encode_s", best_enc},
                          {"encode_MBps", mb / best_enc},
                          {"encode_tokps", static_cast<double>(ntok) / best_enc},
                          {"decode_s", best_dec},
                          {"decode_tokps", static_cast<double>(ntok) / best_dec},
                          {"ids_checked", checked},
                          {"ids_match", same}};
    std::cout << out.dump() << std::endl;
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
