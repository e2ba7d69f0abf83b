// The blocked GQA attention and MLA's latent attention (model/attention_mla_impl.h) compiled with AVX-512 (model/attention_kernels_impl.h).
#include "model/attention_mla_impl.h"

namespace moe {

void gqa_attend_avx512(const GqaAttendArgs& a) { attn_impl::gqa_attend(a); }
void mla_attend_avx512(const MlaAttendArgs& a) { attn_impl::mla_attend(a); }

}  // namespace moe
