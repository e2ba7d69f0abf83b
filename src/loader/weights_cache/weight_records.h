// Loaded weights as weights-cache records (loader/weights_cache/weights_cache.h) and
// back. Decoding checks a record before any kernel may read it: every packed tensor has
// exactly the dtype and shape the packer allocates for the record's format and sizes
// (the format's empty layout is built and compared), and the sizes are the ones the
// caller expects; a record that fails throws, and the caller repacks it.
#pragma once

#include <string>

#include "loader/weights_cache/weights_cache.h"
#include "moe/fused_moe.h"

namespace moe {

void encode_packed(CacheRecord& r, const std::string& prefix, const PackedExperts& p);
PackedExperts decode_packed(const CacheRecord& r, const std::string& prefix);

void encode_gated(CacheRecord& r, const std::string& prefix, const GatedMlpWeights& w);
// `hidden`: the model's hidden size, which w13's k and w2's n must equal.
GatedMlpWeights decode_gated(const CacheRecord& r, const std::string& prefix, int64_t hidden);

CacheRecord encode_moe_layer(const MoeLayerWeights& w);
// Checked against the layer's sizes: cfg's experts and hidden size, and this rank's
// experts [expert_begin, expert_end).
MoeLayerWeights decode_moe_layer(const CacheRecord& r, const MoeConfig& cfg, int64_t expert_begin,
                                 int64_t expert_end);

}  // namespace moe
