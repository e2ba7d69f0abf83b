// libFuzzer: arbitrary bytes as a safetensors file. SafetensorsFile::from_bytes (the
// validation open() runs on its mapping) gets a heap copy of exactly the input's size,
// so a read past the end is an AddressSanitizer report (an mmap would hide it in the
// last page). It must either throw moe::Error or hand out a file whose tensors keep
// the promises of safetensors.h:
//   - every tensor lies inside the data area, which starts after the 8 + N header bytes;
//   - its byte count is numel(shape) x the dtype's size;
//   - tensors are in offset order and do not overlap; names are unique and find() works;
//   - view() of each gives that shape and dtype, and bytes_touched() is then the sum of
//     their sizes (the ranges are disjoint).
// Sub-range views and strided copies with in- and out-of-range arguments must either
// work or throw moe::Error. Anything else (a crash, a sanitizer report, another
// exception, a broken promise) is a bug in the loader.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "fuzz_assert.h"
#include "loader/safetensors.h"

namespace {

// A read of every byte of a view, so ASan checks the whole range is inside the buffer.
uint8_t read_all(const moe::Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw());
  uint8_t x = 0;
  for (size_t i = 0; i < t.nbytes(); ++i) x ^= p[i];
  return x;
}

void check_file(moe::SafetensorsFile& f, uint64_t size) {
  const uint64_t data_start = f.data_start();
  FUZZ_ASSERT(f.file_size() == size);
  FUZZ_ASSERT(f.header_bytes() <= size - 8 && data_start == 8 + f.header_bytes());
  std::set<std::string> names;
  uint64_t prev_end = data_start, total = 0;
  for (const moe::TensorInfo& ti : f.tensors()) {
    FUZZ_ASSERT(ti.name != "__metadata__");
    FUZZ_ASSERT(names.insert(ti.name).second);
    FUZZ_ASSERT(f.find(ti.name) == &ti);
    FUZZ_ASSERT(ti.offset >= prev_end);  // offset order, no overlap
    FUZZ_ASSERT(ti.offset <= size && ti.nbytes <= size - ti.offset);
    uint64_t numel = 1;
    for (int64_t d : ti.shape) {
      FUZZ_ASSERT(d >= 0);
      FUZZ_ASSERT(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel));
    }
    FUZZ_ASSERT(numel * moe::dtype_size(ti.dtype) == ti.nbytes);
    prev_end = ti.offset + ti.nbytes;
    total += ti.nbytes;
  }
  FUZZ_ASSERT(f.find("__metadata__") == nullptr);

  uint8_t sink = 0;
  for (const moe::TensorInfo& ti : f.tensors()) {
    const moe::Tensor t = f.view(ti.name);
    FUZZ_ASSERT(t.shape() == ti.shape && t.dtype() == ti.dtype && t.nbytes() == ti.nbytes);
    sink ^= read_all(t);
  }
  FUZZ_ASSERT(f.bytes_touched() == total);

  // Sub-ranges and strided copies of the first and the last tensors, some in range and
  // some not: each works exactly when in range, or throws moe::Error. (Only a few: an
  // exception costs tens of microseconds under the sanitizers, the whole parse less.)
  const size_t nt = f.tensors().size();
  std::vector<size_t> picks;
  for (size_t i : {size_t{0}, size_t{1}, nt - 1})
    if (i < nt && (picks.empty() || picks.back() < i)) picks.push_back(i);
  for (size_t i : picks) {
    const moe::TensorInfo& ti = f.tensors()[i];
    const int64_t n = static_cast<int64_t>(ti.nbytes / moe::dtype_size(ti.dtype));
    const int64_t ranges[][2] = {{0, n}, {n / 2, n - n / 2}, {n, 0}, {n, 1}, {-1, 1}, {1, n}};
    for (const auto& [begin, len] : ranges) {
      try {
        const moe::Tensor t = f.view_elems(ti.name, begin, {len});
        FUZZ_ASSERT(begin >= 0 && len >= 0 && begin + len <= n);
        sink ^= read_all(t);
      } catch (const moe::Error&) {
        FUZZ_ASSERT(!(begin >= 0 && len >= 0 && begin + len <= n));
      }
    }
    // At most 64 KiB of copies per tensor keeps an execution fast on a large shape.
    const int64_t piece = n < 4 ? n : n / 4, count = 3, stride = piece + 1;
    if (piece * count * static_cast<int64_t>(moe::dtype_size(ti.dtype)) <= (64 << 10)) {
      std::vector<uint8_t> dst(static_cast<size_t>(piece * count) * moe::dtype_size(ti.dtype) + 1);
      try {
        f.copy_strided(ti.name, 0, piece, stride, count, dst.data());
        FUZZ_ASSERT((count - 1) * stride + piece <= n);
      } catch (const moe::Error&) {
        FUZZ_ASSERT((count - 1) * stride + piece > n);
      }
    }
    f.prefetch_elems(ti.name, 0, n);
    f.prefetch_elems(ti.name, n, -1);
  }
  (void)sink;
  (void)f.metadata();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size heap copy (malloc(0) may be null; from_bytes rejects size < 8 first).
  std::shared_ptr<void> buf(std::malloc(size == 0 ? 1 : size), std::free);
  if (size) std::memcpy(buf.get(), data, size);
  std::shared_ptr<moe::SafetensorsFile> f;
  try {
    f = moe::SafetensorsFile::from_bytes(buf, size, "fuzz.safetensors");
  } catch (const moe::Error&) {
    return 0;
  }
  check_file(*f, size);
  return 0;
}
