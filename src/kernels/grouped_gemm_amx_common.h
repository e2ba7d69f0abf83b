// Private to the *_amx.cpp kernels (compiled with AMX flags): the tile configuration
// operand and the compiler barrier every tile kernel needs. Internal linkage, as in
// grouped_gemm_avx512_common.h.
#pragma once

#include <cstdint>

namespace moe::gg {
namespace {

// The 64-byte operand of LDTILECFG (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of each tile
  uint8_t rows[16] = {};
};

// The tile loads and stores are asm without a memory clobber: GCC may not keep the stores
// that filled a buffer before a tile load, nor read a buffer only after the tile store
// that fills it, unless told.
inline void compiler_barrier() { __asm__ volatile("" ::: "memory"); }

}  // namespace
}  // namespace moe::gg
