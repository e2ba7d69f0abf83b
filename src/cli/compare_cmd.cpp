#include "cli/compare_cmd.h"

#include <fmt/core.h>

#include <cmath>

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

}  // namespace moe
