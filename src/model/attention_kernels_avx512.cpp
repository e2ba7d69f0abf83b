// The blocked GQA attention compiled with AVX-512 (model/attention_kernels_impl.h).
#include "model/attention_kernels_impl.h"

namespace moe {

void gqa_attend_avx512(const GqaAttendArgs& a) { attn_impl::gqa_attend(a); }
void mla_latent_attend_avx512(const MlaAttendArgs& a) { attn_impl::mla_latent_attend(a); }

}  // namespace moe
