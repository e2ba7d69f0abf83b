#include "cli/compare_cmd.h"

#include "cli/verbs.h"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <cmath>
#include <memory>

#include "core/check.h"
#include "loader/safetensors.h"

namespace moe {

int run_compare_cmd(const CompareOptions& o) {
  auto fa = SafetensorsFile::open(o.a);
  auto fb = SafetensorsFile::open(o.b);
  MOE_CHECK(fa->find(o.tensor), "{} has no tensor '{}'", o.a, o.tensor);
  MOE_CHECK(fb->find(o.tensor), "{} has no tensor '{}'", o.b, o.tensor);
  const Tensor a = fa->view(o.tensor).to(DType::F32), b = fb->view(o.tensor).to(DType::F32);
  MOE_CHECK(a.shape() == b.shape(), "'{}' has shape {} in {} but {} in {}", o.tensor, shape_str(a.shape()), o.a,
            shape_str(b.shape()), o.b);
  double max_abs = 0, max_ref = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    const double d = std::fabs(x - y);
    max_abs = std::max(max_abs, d);
    max_ref = std::max(max_ref, std::fabs(y));
    if (!(d <= o.atol + o.rtol * std::fabs(y))) ++bad;
  }
  fmt::print("{}{}: {} elements, max |a-b| = {:.3e} (max |b| = {:.3e}, relative {:.2e}); {} outside atol {} + rtol {}"
             " -> {}\n",
             o.label.empty() ? "" : o.label + ": ", o.tensor, a.numel(), max_abs, max_ref,
             max_ref > 0 ? max_abs / max_ref : 0.0, bad, o.atol, o.rtol, bad == 0 ? "OK" : "MISMATCH");
  return bad == 0 ? 0 : 3;
}

Verb add_compare_verb(CLI::App& app) {
  auto cmp = std::make_shared<CompareOptions>();
  CLI::App* cc = app.add_subcommand(
      "compare", "Compare one tensor of two safetensors files; exit 3 if any element is outside atol + rtol * |b|");
  cc->add_option("a", cmp->a, "First file (e.g. moe-ep's output)")->required()->check(CLI::ExistingFile);
  cc->add_option("b", cmp->b, "Second file, the reference")->required()->check(CLI::ExistingFile);
  cc->add_option("--tensor", cmp->tensor, "Tensor name to compare")->capture_default_str();
  cc->add_option("--atol", cmp->atol, "Absolute tolerance")->capture_default_str();
  cc->add_option("--rtol", cmp->rtol, "Relative tolerance (times |b|)")->capture_default_str();
  cc->add_option("--label", cmp->label, "Text printed before the result");
  return {cc, [cmp] { return run_compare_cmd(*cmp); }};
}

}  // namespace moe
