// The blocked GQA attention and MLA's latent attention (model/attention_mla_impl.h) compiled with AVX2 (model/attention_kernels_impl.h): the
// vector-extension body becomes ymm code; -ffp-contract=off keeps every multiply and add
// separate, so the bits equal the portable and AVX-512 builds'.
#include "model/attention_mla_impl.h"

namespace moe {

void gqa_attend_avx2(const GqaAttendArgs& a) { attn_impl::gqa_attend(a); }
void mla_attend_avx2(const MlaAttendArgs& a) { attn_impl::mla_attend(a); }

}  // namespace moe
