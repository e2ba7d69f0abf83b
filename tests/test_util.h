// Helpers shared by the tests: random data, tolerances, temp dirs, the fixture manifest.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "core/tensor.h"

namespace moe::test {

inline Tensor random_f32(const Shape& shape, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

// Values that bf16 represents exactly, so a bf16 path sees the same inputs as f32.
inline Tensor random_bf16_exact(const Shape& shape, float scale, uint64_t seed) {
  Tensor t = random_f32(shape, scale, seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = round_bf16(t.data<float>()[i]);
  return t;
}

struct Tolerance {
  double atol, rtol;
};
inline constexpr Tolerance kF32Tol{1e-5, 1e-5};
// vLLM's CPU MoE test bounds for bf16.
inline constexpr Tolerance kBf16Tol{1e-3, 1.6e-2};

// Every element within atol + rtol * |ref|; reports the worst element.
inline ::testing::AssertionResult all_close(const Tensor& got, const Tensor& ref, Tolerance tol) {
  if (got.shape() != ref.shape())
    return ::testing::AssertionFailure() << "shape " << got.describe() << " vs " << ref.describe();
  const Tensor a = got.to(DType::F32), b = ref.to(DType::F32);
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    const double lim = tol.atol + tol.rtol * std::fabs(y);
    const double d = std::fabs(x - y);
    if (!(d <= lim)) {
      ++bad;
      if (worst < 0 || d - lim > worst_excess || std::isnan(d)) {
        worst = i;
        worst_excess = d - lim;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << a.numel() << " elements out of tolerance (atol "
                                       << tol.atol << ", rtol " << tol.rtol << "); worst at " << worst << ": got "
                                       << a.data<float>()[worst] << ", expected " << b.data<float>()[worst];
}

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "moe_test_XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string fixtures_dir() { return MOE_FIXTURES_DIR; }

inline nlohmann::json manifest() {
  std::ifstream in(fixtures_dir() + "/manifest.json");
  return nlohmann::json::parse(in);
}

// Runs a shell command, capturing stdout+stderr; returns the exit status.
inline int run_command(const std::string& cmd, std::string* output) {
  const std::string full = cmd + " 2>&1";
  FILE* f = popen(full.c_str(), "r");
  if (!f) return -1;
  char buf[4096];
  output->clear();
  while (size_t n = fread(buf, 1, sizeof buf, f)) output->append(buf, n);
  const int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Runs the scope's OpenMP regions on a team of `threads` (the kernels split their work by
// the team size), restoring the previous size on exit, an early ASSERT return included.
class TeamScope {
 public:
  explicit TeamScope(int threads) : prev_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~TeamScope() { omp_set_num_threads(prev_); }
  TeamScope(const TeamScope&) = delete;
  TeamScope& operator=(const TeamScope&) = delete;

 private:
  int prev_;
};

}  // namespace moe::test
