#!/usr/bin/env python3
"""Writes the BF16 GGUF of a Qwen3-MoE safetensors checkpoint for the side-by-side
benchmark (tools/bench_vs_llamacpp.sh), with gguf-py (llama.cpp's own GGUF writer, the
`gguf` package on PyPI) and numpy only.

    python3 tools/gguf_from_checkpoint.py CKPT_DIR OUT.gguf

Why not llama.cpp's convert_hf_to_gguf.py: it imports torch (a multi-GB install here)
and refuses a tokenizer it does not know by hash. The checkpoints this is for
(tools/gen_big_checkpoint.cpp) have random weights and no tokenizer; the benchmark
feeds token ids. So this writes what convert_hf_to_gguf.py writes for the tensors
(its names for `qwen3moe`, the same dtypes: 2-D weights BF16 as stored, norms and the
router F32, experts stacked [E, n, k]) and a synthetic byte-level BPE vocabulary of the
config's vocab_size (256 byte tokens, then merges of earlier tokens) so the file loads.
Then `llama-quantize OUT.gguf OUT-Q4_0.gguf Q4_0` makes the quantised files from it.
"""
import json
import os
import struct
import sys

import numpy as np
import gguf


def read_safetensors(path):
    """name -> (dtype string, shape, memory-mapped uint8 view of the tensor's bytes)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[b:e])
    return out


def byte_tokens():
    """GPT-2's byte-to-unicode table: the 256 byte tokens of a byte-level BPE vocab."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def vocab(size):
    tokens = byte_tokens()
    merges = []
    seen = set(tokens)
    i = 0
    while len(tokens) < size:
        a, b = tokens[i % 200 + 33], tokens[(i * 7) % len(tokens)]
        i += 1
        if a + b in seen:
            continue
        seen.add(a + b)
        tokens.append(a + b)
        merges.append(f"{a} {b}")
    return tokens, merges


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ckpt, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    index = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(read_safetensors(os.path.join(ckpt, shard)))

    L, H, E = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_experts"]
    hd = cfg.get("head_dim", H // cfg["num_attention_heads"])
    w = gguf.GGUFWriter(out, "qwen3moe")
    w.add_block_count(L)
    w.add_context_length(cfg.get("max_position_embeddings", 40960))
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(cfg.get("rope_theta", 1e6))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    tokens, merges = vocab(cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)

    def bf16(name):
        dt, shape, raw = tensors[name]
        assert dt == "BF16", (name, dt)
        return raw.view(np.uint16).reshape(shape)

    def put(gname, hname, f32=False):
        a = bf16(hname)
        if f32:  # norms and the router: F32, as convert_hf_to_gguf.py keeps them
            w.add_tensor(gname, (a.astype(np.uint32) << 16).view(np.float32))
        else:
            w.add_tensor(gname, a, raw_dtype=gguf.GGMLQuantizationType.BF16)

    put("token_embd.weight", "model.embed_tokens.weight")
    put("output_norm.weight", "model.norm.weight", f32=True)
    put("output.weight", "lm_head.weight")
    for l in range(L):
        p, g = f"model.layers.{l}.", f"blk.{l}."
        put(g + "attn_norm.weight", p + "input_layernorm.weight", f32=True)
        put(g + "ffn_norm.weight", p + "post_attention_layernorm.weight", f32=True)
        for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            put(g + gg + ".weight", p + f"self_attn.{hf}.weight")
        put(g + "attn_q_norm.weight", p + "self_attn.q_norm.weight", f32=True)
        put(g + "attn_k_norm.weight", p + "self_attn.k_norm.weight", f32=True)
        put(g + "ffn_gate_inp.weight", p + "mlp.gate.weight", f32=True)
        for hf, gg in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            stacked = np.stack([bf16(p + f"mlp.experts.{e}.{hf}.weight") for e in range(E)])
            w.add_tensor(g + gg + ".weight", stacked, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()


if __name__ == "__main__":
    main()
