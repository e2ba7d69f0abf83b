"""What a GGUF's tensors cost a decode step: each tensor's stored bytes, and the bytes
per weight of moe-ep's group-coded storage of GGUF's integer types. Shared by
tools/bench_vs_llamacpp.sh (the DRAM floor of both engines) and tools/stage_roofline.py
(moe-ep's bytes per stage)."""
import os

from gguf_refill import parse_header

# moe-ep's group-coded storage of GGUF's integer types (loader/gguf/gguf_experts.h), bytes
# per weight: codes (4-bit types half a byte, 5- and 6-bit ones three quarters, Q8_0 one), then for the K-quants per
# group an i8 scale factor (and a u8 min factor), per 256 an f16 d (and dmin); for the
# others per group an f16 d (and -m for Q4_1 / Q5_1). The symmetric types' zero point is
# one code per tensor (CodedFormat::zero), not stored per group. (One rank: no MoE-TP
# slice cuts a K-quant block.)
CODED = {2: 0.5 + 2 / 32,               # Q4_0
         3: 0.5 + 4 / 32,               # Q4_1
         12: 0.5 + 2 / 32 + 4 / 256,    # Q4_K
         6: 0.75 + 2 / 32,              # Q5_0
         8: 1 + 2 / 32,                 # Q8_0
         14: 0.75 + 1 / 16 + 2 / 256,   # Q6_K (groups of 16): the file's 210 bytes per 256
         7: 0.75 + 4 / 32,              # Q5_1
         13: 0.75 + 2 / 32 + 4 / 256}   # Q5_K


def kind_of(name):
    """expert / embed / other, for both naming schemes (Hugging Face and GGUF)."""
    if ".experts." in name or "_exps" in name:
        return "expert"
    if "embed_tokens" in name or name.startswith("token_embd"):
        return "embed"
    return "other"


def gguf_infos(path, meta=None):
    """(name, ggml dims, stored bytes, type) of each tensor of a GGUF: gguf_refill's header
    parser; a tensor's bytes run to the next one's offset (or the file's end). The metadata
    into `meta` when a dict is given."""
    with open(path, "rb") as f:
        start, infos = parse_header(f.read(64 << 20), meta)
    offs = sorted(i[2] for i in infos) + [os.path.getsize(path) - start]
    nxt = {a: b for a, b in zip(offs, offs[1:])}
    return [(name, dims, nxt[off] - off, ty) for name, dims, off, ty in infos]


def moe_step_bytes(name, dims, nb, ty, topk, n_exp):
    """Bytes of one GGUF tensor (gguf_infos' fields) that a one-token decode step of moe-ep
    reads: integer-coded types in their codes (CODED), float ones in bf16, the routed
    experts' top-k of n, one row of token_embd (its blocks when quantised), the router f32."""
    n = 1
    for d in dims:
        n *= d
    kind = kind_of(name)
    if kind == "expert":
        return CODED.get(ty, 2.0) * n * topk / n_exp
    if kind == "embed":
        return nb / dims[-1] if ty in CODED else 2.0 * dims[0]
    if "ffn_gate_inp" in name:
        return 4.0 * n
    return CODED.get(ty, 2.0) * n
