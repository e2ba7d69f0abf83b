// bf16 and FP8 experts on AMX-BF16 tiles, decode and prefill alike. Layout:
// grouped_gemm_impl.h; contract: grouped_gemm.h.
//
// TDPBF16PS C[rows x 16] (f32) += A[rows x 32 bf16] . B[16 k pairs x 16 columns x 2 bf16].
// The packed bf16 panel already is B's layout: its k pair p holds 64 columns x 2 bf16 at
// byte 256 p, so columns 16q..16q+15 of 16 consecutive pairs are a tile with a row stride of
// 256 bytes, read in place. A is read in place too: 32 k of an activation row are 64
// contiguous bytes (row stride lda). Tiles 0-3 hold a row block's 64 columns of sums over
// the whole K (no flush: f32 sums, unlike the int8 tiles' per-group ones); tile 4 holds
// its A; tiles 5, 6 and 7 take turns as B, so the next loads need not wait for the product
// that reads a tile (tiles are not renamed): 2-3 % faster decode than two B tiles.
//
// Numbers: TDPBF16PS does not round like vdpbf16ps. On Sapphire Rapids vdpbf16ps equals two
// FMAs per pair, odd k first; TDPBF16PS equals neither FMA order nor one rounding per pair
// (2000 random 16x16x32 products, measured while writing this). A row's sums may not depend
// on how many rows its expert has (batch invariance, which bitwise EP rests on), so decode
// (<= kDecodeMaxRows rows) runs on tiles too: every row is the same chain of tile products,
// k steps of 32 in order, whatever the row block around it
// (GroupedGemmIsa.RowResultsDoNotDependOnTheBatch). Where K is not a multiple of 32 a tile
// would read past a row; such weights run vdpbf16ps for every row (amx_bf16_fits), so they
// are batch invariant too.
//
// Streams: decode reads each panel from DRAM once, prefetched into L1 one k step
// (kPrefetchBytes) ahead; prefill's first row block streams the panel the same way and the
// later ones re-read it from L2 (K = 2048: 256 KiB a panel). Measured on the AMX Xeon of
// docs/PERF.md (qwen3-30b-a3b, bf16, T = 1, 2 threads): into L1 4 KiB ahead 2.38-2.46 ms a
// call; 6 or 8 KiB ahead 2.41-2.47; into L2 (the vdpbf16ps decode's choice) 2.48-2.61;
// none 2.62; vdpbf16ps 2.34-2.37. The remaining 2-4 % is the price of tiles at decode. FP8 decode converts 16 pairs of
// a panel at a time into an L1 buffer (the values dequant_pairs_f8_avx512bf16 writes) and
// multiplies from there; FP8 prefill dequantises the whole panel once for all row blocks.
//
// The tile registers are configured at the start of each task (again when a row block's
// height changes) and released at its end, as in grouped_gemm_int4_amx.cpp.
//
// GCC 12 warns about its own intrinsics' uninitialised __Y (as in grouped_gemm_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/grouped_gemm_amx_common.h"
#include "kernels/grouped_gemm_avx512_common.h"
#include "kernels/grouped_gemm_impl.h"

namespace moe::gg {
namespace {

constexpr int kTile = 16;                                  // rows of an A or C tile; k pairs of a B tile
constexpr int64_t kStepBytes = int64_t(kTile) * kPanel * 4;  // one k step of a bf16 panel: 16 pairs x 256 B
static_assert(kStepBytes == kPrefetchBytes, "the decode prefetch runs exactly one k step ahead");

// Tiles 0-3: C, rows x 16 f32; tile 4: A, rows x 32 bf16; tiles 5, 6: B, 16 pairs x 64 bytes.
void configure_tiles(int rows) {
  TileConfig c;
  for (int t = 0; t < 5; ++t) {
    c.rows[t] = static_cast<uint8_t>(rows);
    c.colsb[t] = 64;
  }
  for (int t : {5, 6, 7}) {
    c.rows[t] = kTile;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// The k steps of a bf16 panel in memory; Prefetch: the stream kPrefetchBytes ahead into
// cache level H.
template <bool Prefetch, _mm_hint H = _MM_HINT_T0>
struct PanelSteps {
  const char* panel;
  const char* operator()(int64_t s) {
    const char* p = panel + s * kStepBytes;
    if constexpr (Prefetch)
      for (int64_t i = 0; i < kStepBytes; i += 64) _mm_prefetch(p + kPrefetchBytes + i, H);
    return p;
  }
};

// The k steps of an FP8 panel, each converted to bf16 pairs in buf (kStepBytes, L1).
struct F8Steps {
  const Job& j;
  const char* src;  // the panel's e4m3 codes: pair p at src + 128 p
  const float* sc;  // its block scales (f8_block_scales)
  char* buf;
  int64_t kb = -1;  // the FP8 k block whose scales s holds
  __m512 s[8] = {};
  const char* operator()(int64_t step) {
    for (int64_t i = 0; i < kTile; ++i) {
      const int64_t p = step * kTile + i;
      if (p / j.f8_kb_pairs != kb) {
        kb = p / j.f8_kb_pairs;
        f8_block_scales(sc, kb, s);
      }
      const char* in = src + p * 2 * kPanel;
      _mm_prefetch(in + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(in + kPrefetchBytes + 64, _MM_HINT_T0);
      for (int h = 0; h < 4; ++h)
        _mm512_store_si512(buf + i * 4 * kPanel + 64 * h, f8x32_to_bf16(in + 32 * h, s[2 * h], s[2 * h + 1]));
    }
    compiler_barrier();
    return buf;
  }
};

// rows (<= 16, the configured height) at a0 x one panel over the whole K, then the epilogue.
template <class Steps>
void tile_block(const Job& j, Steps& b, const char* a0, int rows, char* c0, int64_t col0, int nv) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t steps = j.k / (2 * kTile);
  for (int64_t s = 0; s < steps; ++s) {
    const char* bs = b(s);
    _tile_loadd(4, a0 + s * 64, j.lda_bytes);
    _tile_loadd(5, bs, 4 * kPanel);
    _tile_loadd(6, bs + 64, 4 * kPanel);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(7, bs + 128, 4 * kPanel);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(5, bs + 192, 4 * kPanel);
    _tile_dpbf16ps(2, 4, 7);
    _tile_dpbf16ps(3, 4, 5);
  }
  alignas(64) float sums[kTile][kPanel];
  _tile_stored(0, &sums[0][0], sizeof(sums[0]));
  _tile_stored(1, &sums[0][16], sizeof(sums[0]));
  _tile_stored(2, &sums[0][32], sizeof(sums[0]));
  _tile_stored(3, &sums[0][48], sizeof(sums[0]));
  compiler_barrier();
  for (int r = 0; r < rows; ++r) {
    __m512 acc[1][4];
    for (int q = 0; q < 4; ++q) acc[0][q] = _mm512_load_ps(&sums[r][16 * q]);
    f32_epilogue<1>(j, acc, c0 + r * j.ldc_bytes, col0, nv);
  }
}

// A task's tile state: configured for `rows` rows, released when the task ends.
struct Tiles {
  int rows = 0;
  void height(int r) {
    if (r != rows) configure_tiles(r);
    rows = r;
  }
  ~Tiles() {
    if (rows) _tile_release();
  }
};

// Every row of the task's expert x panel P (a bf16 panel at `panel`), in row blocks of
// near-equal height <= 16 (more than kDecodeMaxRows rows: the first block streams the panel).
void prefill_panel(const Job& j, Tiles& tiles, int64_t expert, int64_t P, const char* panel) {
  const int64_t r0 = j.offsets[expert], rows = j.offsets[expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel;
  const int nv = valid_cols(j, P);
  const int64_t nb = (rows + kTile - 1) / kTile;
  int64_t row = r0;
  for (int64_t b = 0; b < nb; ++b) {
    const int mr = static_cast<int>(rows / nb + (b < rows % nb ? 1 : 0));
    tiles.height(mr);
    const char* a = j.a + row * j.lda_bytes;
    char* c = j.c + row * j.ldc_bytes;
    if (b == 0) {
      PanelSteps<true> st{panel};
      tile_block(j, st, a, mr, c, P * per, nv);
    } else {
      PanelSteps<false> st{panel};
      tile_block(j, st, a, mr, c, P * per, nv);
    }
    row += mr;
  }
}

}  // namespace

void run_task_amx_bf16(const Job& j, const Task& t) {
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel;
  Tiles tiles;
  for (int64_t P = t.p0; P < t.p1; ++P) {
    const char* panel = j.w + t.expert * j.expert_stride + P * j.panel_stride;
    if (rows > kDecodeMaxRows) {
      prefill_panel(j, tiles, t.expert, P, panel);
      continue;
    }
    tiles.height(static_cast<int>(rows));
    PanelSteps<true> st{panel};
    tile_block(j, st, j.a + r0 * j.lda_bytes, static_cast<int>(rows), j.c + r0 * j.ldc_bytes, P * per,
               valid_cols(j, P));
  }
}

void run_task_f8_amx(const Job& j, const Task& t, char* buf) {
  const int64_t r0 = j.offsets[t.expert], rows = j.offsets[t.expert + 1] - r0;
  const int64_t per = j.gated ? kGateCols : kPanel;
  Tiles tiles;
  for (int64_t P = t.p0; P < t.p1; ++P) {
    if (rows > kDecodeMaxRows) {  // prefill: dequantise the whole panel once for all row blocks
      dequant_pairs_f8_avx512bf16(j, t.expert, P, 0, j.k / 2, reinterpret_cast<uint16_t*>(buf));
      compiler_barrier();
      prefill_panel(j, tiles, t.expert, P, buf);
      continue;
    }
    alignas(64) char step_buf[kStepBytes];
    F8Steps st{j, j.w + t.expert * j.expert_stride + P * j.panel_stride,
               j.f8_scale + t.expert * j.f8_scale_stride + P * j.f8_n_kb * 2 * kPanel, step_buf};
    tiles.height(static_cast<int>(rows));
    tile_block(j, st, j.a + r0 * j.lda_bytes, static_cast<int>(rows), j.c + r0 * j.ldc_bytes, P * per,
               valid_cols(j, P));
  }
}

}  // namespace moe::gg
