// AMX loops of the machine-limit probes (see probes.h). Compiled with AMX flags; called
// only when the CPU has the features and the OS granted the tile state (core/cpu.h).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/grouped_gemm_amx_common.h"
#include "kernels/probes_impl.h"

namespace moe::probes {
namespace {

using gg::TileConfig;

// Tiles 0-3: C, 16 rows x 64 bytes; 4: A, 16 x 64 bytes; 5-7: B, 16 x 64 bytes. Four C
// chains: a chain's next product waits for its last (latency), the other three fill the
// pipe meanwhile, the order grouped_gemm_amx.cpp runs them in.
void configure_full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// iters rounds of product() (four tile products into C tiles 0-3 from A tile 4 and B
// tiles 5-7, loaded from a and b: 16 rows x 64 bytes each); then tile 0's bits summed, so
// the work is not dead, and the tiles released.
template <class Product>
double tile_chain(int64_t iters, const void* a, const void* b, Product product) {
  gg::compiler_barrier();  // a and b are filled before the tile loads read them
  configure_full_tiles();
  _tile_loadd(4, a, 64);
  _tile_loadd(5, b, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  for (int64_t it = 0; it < iters; ++it) product();
  alignas(64) int32_t out[16][16];
  _tile_stored(0, out, 64);
  gg::compiler_barrier();
  _tile_release();
  double s = 0;
  for (const auto& row : out)
    for (int32_t v : row) s += v;
  return s;
}

}  // namespace

double bf16_tile_chain(int64_t iters) {
  alignas(64) uint16_t ones[16][32], tiny[16][32];
  for (auto& row : ones) std::fill(row, row + 32, uint16_t{0x3f80});  // 1.0
  for (auto& row : tiny) std::fill(row, row + 32, uint16_t{0x3380});  // 2^-24: no overflow
  return tile_chain(iters, ones, tiny, [] {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 4, 5);
  });
}

double int8_tile_chain(int64_t iters) {
  alignas(64) int8_t a[16][64], b[16][64];
  std::memset(a, 1, sizeof a);
  std::memset(b, 2, sizeof b);  // 64 x 2 a product: int32 sums wrap only after 2^24 rounds
  return tile_chain(iters, a, b, [] {
    _tile_dpbssd(0, 4, 5);
    _tile_dpbssd(1, 4, 6);
    _tile_dpbssd(2, 4, 7);
    _tile_dpbssd(3, 4, 5);
  });
}

}  // namespace moe::probes
