// Private to pack*.cpp: packing one 64-column panel of an expert's weights, per ISA.
//
// Packing is a 32-bit transpose. Seen as uint32 words, a bf16 panel is
// out[s][j] = (lo: W[row_j][2s], hi: W[row_j][2s+1]) for s < ceil(K/2) (an odd K's last
// pair has hi = 0), and an f32 panel is out[s][j] = W[row_j][s] for s < K: in both the
// "steps" s of a row become the panel's rows and the 64 columns j its 64 consecutive
// words (layout: grouped_gemm_impl.h). So one routine serves every dtype pair; it only
// differs in how 16 consecutive words of one source row are produced (loaded as is,
// widened from bf16/f16, or rounded from f32/f16 to bf16 pairs).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {

// One panel to write: the source row of each of its 64 columns and where it goes.
struct PanelPack {
  DType src = DType::F32;  // F32, BF16 or F16: the checkpoint's dtype, read as is
  DType dst = DType::F32;  // F32 or BF16: the packed dtype
  int64_t k = 0;           // elements per source row (the reduction dim K)
  // Column j's source row: k contiguous elements of `src`; nullptr = padding column,
  // written as zeros. No alignment is assumed (mmapped checkpoint data).
  const void* rows[kPanel] = {};
  // The panel: panel_elems(k, dst) elements of dst, 64-byte aligned (every panel
  // starts on a 256-byte boundary of the 128-byte aligned storage). Every word of it
  // is written, padding included, so the storage need not be zeroed first.
  void* out = nullptr;
};

// Words (uint32) per panel row: k pairs for bf16, k for f32.
inline int64_t pack_steps(const PanelPack& pp) { return pp.dst == DType::BF16 ? (pp.k + 1) / 2 : pp.k; }

void pack_panel_portable(const PanelPack& pp);
// Panel rows (steps) [s_begin, s_end) only (the AVX2 packer's tail).
void pack_panel_portable_steps(const PanelPack& pp, int64_t s_begin, int64_t s_end);
void pack_panel_avx2(const PanelPack& pp);  // pack_avx2.cpp; needs Isa::Avx2
void pack_fence_avx2();                     // as pack_fence_avx512, for pack_panel_avx2
void pack_panel_avx512(const PanelPack& pp);  // pack_avx512.cpp; needs Isa::Avx512
// Orders the AVX-512 packer's streaming (non-temporal) stores before later loads and
// stores of this thread; call once after a batch of pack_panel_avx512 calls.
void pack_fence_avx512();

}  // namespace moe::gg
