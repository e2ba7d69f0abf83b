#!/usr/bin/env python3
"""Writes the GGUF model fixtures of tests/test_gguf_checkpoint.cpp with gguf-py
(llama.cpp's own GGUF library: its writer, its tensor names, its quantisers and
dequantisers) and numpy only.

    python3 -m venv /tmp/gguf-venv
    /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy==2.4.6 tokenizers==0.23.3
    /tmp/gguf-venv/bin/python tools/gen_gguf_model_fixtures.py

Into tests/fixtures/gguf/models/:
  qwen3_moe-BF16.gguf   tests/fixtures/qwen3_moe (bf16) as convert_hf_to_gguf.py writes it:
                        2-D weights BF16 as stored, norms and the router F32, experts
                        stacked [E, n, k], the dense layer's MLP as ffn_{gate,up,down}
  qwen2_moe-F32-0000{1,2}-of-00002.gguf
                        tests/fixtures/qwen2_moe (f32; attention biases, shared expert and
                        its gate) in F32 (convert_hf_to_gguf.py --outtype f32), split in two
                        parts as gguf-split writes them
  mixtral-F32.gguf      tests/fixtures/mixtral as the `llama` architecture with experts, q and k
                        rows permuted for ggml's interleaved RoPE as the converter does
  ernie4_5_moe-F32.gguf tests/fixtures/ernie4_5_moe as `ernie4_5-moe` (a dense first layer,
                        a shared expert, the selection bias exp_probs_b, tied embeddings)
  ernie4_5_moe-Q8_0-embd.gguf, ernie4_5_moe-Q8_0-embd-ref.gguf
                        the same with its tied token_embd in Q8_0, and with those blocks'
                        dequantised F32 values (the twin it must equal)
  deepseek_v{3,2}-F32.gguf
                        tests/fixtures/deepseek_v3 (q_lora, sigmoid noaux_tc, exp_probs_b) and
                        deepseek_v2 (no q_lora: attn_q; softmax, group-limited) as `deepseek2`,
                        kv_b_proj split into attn_k_b / attn_v_b as the converter does
  deepseek_v3-BF16.gguf the same with its 2-D weights but the router rounded to BF16 (round to
                        nearest even, as --outtype bf16)
  chat_qwen3-BF16.gguf  tests/fixtures/chat_qwen3 with its tokenizer and chat template in the
                        tokenizer.* metadata (tools/gen_gguf_tokenizer_fixtures.py's writer)
  qwen3moe-quant.gguf   a random Qwen3-MoE-shaped model whose tensors use every supported
                        quantised type (gguf.quants.quantize where gguf-py can quantise;
                        random valid blocks for the K-quants, which it cannot): token_embd
                        Q8_0, attn_q Q4_K, attn_k Q5_K, attn_v and output Q6_K, attn_output
                        and the routed experts Q4_0, the dense layer Q4_1 / Q5_0 / Q5_1
  qwen3moe-quant-ref/   the same model as a Hugging Face directory: config.json and f32
                        weights that are gguf.quants.dequantize's values of each tensor
                        (the reference the engine's reading of the GGUF must equal)
  deepseek-quant.gguf, deepseek-quant-ref/
                        a random DeepSeek-V3 (deepseek2) whose attn_k_b / attn_v_b are
                        quantised (layer 0 Q8_0 / Q4_0, layer 1 Q5_0 / Q4_1), all else F32,
                        and its Hugging Face directory with kv_b_proj put together from
                        gguf.quants.dequantize's values of those halves
  qwen3moe-kquant.gguf  the same kind of model with K-quant routed experts: layer 0 as
                        llama.cpp's Q4_K_M makes them (gate, up Q4_K; down Q6_K), layer 1
                        gate Q5_K, up Q8_0, down Q5_1; k = 256 (whole K-quant blocks). No
                        twin directory (7 MB): the tests compare with the file's own
                        dequantised values, which the quant pair above ties to gguf-py.
Deterministic (seeded); rerunning rewrites the same bytes.
"""
import json
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_from_checkpoint import read_safetensors, vocab  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIX, "gguf", "models")

ATTN = (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output"))
MLP = (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down"))


def load_dir(d):
    tensors = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            tensors.update(read_safetensors(os.path.join(d, f)))
    return json.load(open(os.path.join(d, "config.json"))), tensors


def as_f32(entry):
    dt, shape, raw = entry
    if dt == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    assert dt == "F32", dt
    return raw.view(np.float32).reshape(shape)


def header(w, arch, cfg, tokenizer=None):
    """The hparams convert_hf_to_gguf.py writes for Qwen2-MoE / Qwen3-MoE."""
    H, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or H // heads
    rope = cfg.get("rope_parameters") or {}
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    if arch == "qwen3moe":
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if cfg.get("shared_expert_intermediate_size"):
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if tokenizer:  # a fixture's real tokenizer, as convert_hf_to_gguf.py writes it
        from gen_gguf_tokenizer_fixtures import add_tokenizer
        add_tokenizer(w, f"{tokenizer}/tokenizer.json", f"{tokenizer}/tokenizer_config.json", f"{tokenizer}/config.json",
                      "gpt2", "qwen2")
        return
    # A placeholder byte-level vocabulary of vocab_size tokens (these models have no
    # tokenizer; the loader tests feed ids): the first byte tokens, no merges.
    tokens, _ = vocab(256)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens[: cfg["vocab_size"]])
    w.add_token_types([gguf.TokenType.NORMAL] * cfg["vocab_size"])
    w.add_token_merges([])


def convert(src, arch, out, f32, split=False, tokenizer=None):
    """A fixture checkpoint directory -> GGUF with llama.cpp's names (gguf.TENSOR_NAMES)."""
    cfg, tensors = load_dir(os.path.join(FIX, src))
    L = cfg["num_hidden_layers"]
    E = cfg.get("num_experts") or cfg["num_local_experts"]
    dense = set(cfg.get("mlp_only_layers") or [])
    kw = {"split_max_tensors": 20} if split else {}
    w = gguf.GGUFWriter(out, arch, **kw)
    header(w, arch, cfg, tokenizer)

    def put(gname, hname, keep_f32=False):
        dt, shape, raw = tensors[hname]
        if f32 or keep_f32 or dt == "F32":
            w.add_tensor(gname, as_f32(tensors[hname]))
        else:
            w.add_tensor(gname, raw.view(np.uint16).reshape(shape), raw_dtype=T.BF16)

    put("token_embd.weight", "model.embed_tokens.weight")
    put("output_norm.weight", "model.norm.weight", True)
    put("output.weight", "lm_head.weight")
    for l in range(L):
        p, g = f"model.layers.{l}.", f"blk.{l}."
        put(g + "attn_norm.weight", p + "input_layernorm.weight", True)
        put(g + "ffn_norm.weight", p + "post_attention_layernorm.weight", True)
        for hf, gg in ATTN:
            put(f"{g}{gg}.weight", f"{p}self_attn.{hf}.weight")
            if p + f"self_attn.{hf}.bias" in tensors:
                put(f"{g}{gg}.bias", f"{p}self_attn.{hf}.bias", True)
        if p + "self_attn.q_norm.weight" in tensors:
            put(g + "attn_q_norm.weight", p + "self_attn.q_norm.weight", True)
            put(g + "attn_k_norm.weight", p + "self_attn.k_norm.weight", True)
        if l in dense:
            for hf, gg in MLP:
                put(f"{g}ffn_{gg}.weight", f"{p}mlp.{hf}.weight")
            continue
        put(g + "ffn_gate_inp.weight", p + "mlp.gate.weight", True)
        for hf, gg in MLP:
            stacked = np.stack([as_f32(tensors[f"{p}mlp.experts.{e}.{hf}.weight"]) for e in range(E)])
            if f32 or tensors[f"{p}mlp.experts.0.{hf}.weight"][0] == "F32":
                w.add_tensor(f"{g}ffn_{gg}_exps.weight", stacked)
            else:
                bits = (stacked.view(np.uint32) >> 16).astype(np.uint16)  # exact: the values are bf16
                w.add_tensor(f"{g}ffn_{gg}_exps.weight", bits, raw_dtype=T.BF16)
        if p + "mlp.shared_expert_gate.weight" in tensors:
            put(g + "ffn_gate_inp_shexp.weight", p + "mlp.shared_expert_gate.weight", True)
            for hf, gg in MLP:
                put(f"{g}ffn_{gg}_shexp.weight", f"{p}mlp.shared_expert.{hf}.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows from rotate_half order
    (i, i + d/2) to ggml's interleaved pairs (2i, 2i + 1)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert_mixtral(src, out):
    """A Mixtral fixture -> GGUF as convert_hf_to_gguf.py's LlamaModel writes it (F32)."""
    cfg, tensors = load_dir(os.path.join(FIX, src))
    L, E = cfg["num_hidden_layers"], cfg["num_local_experts"]
    H, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // heads
    rope = cfg.get("rope_parameters") or {}
    w = gguf.GGUFWriter(out, "llama")
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    tokens, _ = vocab(256)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens[: cfg["vocab_size"]])
    w.add_token_types([gguf.TokenType.NORMAL] * cfg["vocab_size"])
    f = lambda n: as_f32(tensors[n])
    w.add_tensor("token_embd.weight", f("model.embed_tokens.weight"))
    w.add_tensor("output_norm.weight", f("model.norm.weight"))
    w.add_tensor("output.weight", f("lm_head.weight"))
    for l in range(L):
        p, g = f"model.layers.{l}.", f"blk.{l}."
        w.add_tensor(g + "attn_norm.weight", f(p + "input_layernorm.weight"))
        w.add_tensor(g + "ffn_norm.weight", f(p + "post_attention_layernorm.weight"))
        w.add_tensor(g + "attn_q.weight", permute(f(p + "self_attn.q_proj.weight"), heads))
        w.add_tensor(g + "attn_k.weight", permute(f(p + "self_attn.k_proj.weight"), kv))
        w.add_tensor(g + "attn_v.weight", f(p + "self_attn.v_proj.weight"))
        w.add_tensor(g + "attn_output.weight", f(p + "self_attn.o_proj.weight"))
        w.add_tensor(g + "ffn_gate_inp.weight", f(p + "block_sparse_moe.gate.weight"))
        for hf, gg in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
            w.add_tensor(f"{g}ffn_{gg}_exps.weight",
                         np.stack([f(f"{p}block_sparse_moe.experts.{e}.{hf}.weight") for e in range(E)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def text_model_header(w, cfg, head_count_kv):
    """TextModel.set_gguf_parameters' common keys (convert_hf_to_gguf.py)."""
    rope = cfg.get("rope_parameters") or {}
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(head_count_kv)
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])


def placeholder_vocab(w, cfg, pre):
    """A byte-level vocabulary of vocab_size tokens (the fixture has no tokenizer)."""
    tokens, _ = vocab(256)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens[: cfg["vocab_size"]])
    w.add_token_types([gguf.TokenType.NORMAL] * cfg["vocab_size"])


def convert_ernie(src, out, embd=None):
    """An ERNIE-4.5-MoE fixture -> GGUF as convert_hf_to_gguf.py's Ernie4_5MoeModel writes
    it (F32): TextModel's hparams plus its expert keys (expert_shared_feed_forward_length
    as intermediate_size // num_key_value_heads, as it computes it), q and k not permuted
    (ERNIE's RoPE already rotates interleaved pairs), experts stacked, the router bias
    renamed e_score_correction.bias as its filter_tensors does, tied embeddings without an
    output tensor, and every name from gguf-py's own TensorNameMap for the architecture.
    embd "q8_0": token_embd quantised to Q8_0 by gguf.quants (the tied output quantised,
    as llama-quantize leaves a tied token_embd); "q8_0-ref": token_embd as those Q8_0
    blocks' dequantised f32 values, the twin the quantised file must equal."""
    cfg, tensors = load_dir(os.path.join(FIX, src))
    L, E = cfg["num_hidden_layers"], cfg["moe_num_experts"]
    arch = gguf.MODEL_ARCH.ERNIE4_5_MOE
    names = gguf.get_tensor_name_map(arch, L)
    w = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[arch])
    text_model_header(w, cfg, cfg["num_key_value_heads"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["moe_k"])
    w.add_interleave_moe_layer_step(cfg["moe_layer_interval"])
    w.add_leading_dense_block_count(cfg["moe_layer_start_index"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["moe_num_shared_experts"])
    w.add_expert_shared_feed_forward_length(cfg["intermediate_size"] // cfg["num_key_value_heads"])
    placeholder_vocab(w, cfg, "default")
    experts = {}
    for name in sorted(tensors):
        hf = name.replace("e_score_correction_bias", "e_score_correction.bias")
        m = hf.split(".")
        if ".mlp.experts." in hf:  # stacked per (layer, projection), in expert order
            experts.setdefault((int(m[2]), m[6]), {})[int(m[5])] = as_f32(tensors[name])
            continue
        a = as_f32(tensors[name])
        if hf == "model.embed_tokens.weight" and embd is not None:
            raw = gguf.quants.quantize(a, T.Q8_0)
            if embd == "q8_0":
                w.add_tensor("token_embd.weight", raw, raw_dtype=T.Q8_0)
                continue
            a = gguf.quants.dequantize(raw, T.Q8_0).astype(np.float32).reshape(a.shape)
        w.add_tensor(names.get_name(hf, try_suffixes=(".weight", ".bias")), a)
    for (l, proj), per in sorted(experts.items()):
        assert sorted(per) == list(range(E))
        gname = names.get_name(f"model.layers.{l}.mlp.experts.{proj}.weight", try_suffixes=(".weight",))
        w.add_tensor(gname, np.stack([per[e] for e in range(E)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def convert_deepseek(src, out, outtype, kv_b_raw=None):
    """A DeepSeek-V2/V3 fixture -> GGUF as convert_hf_to_gguf.py's DeepseekV2Model writes it:
    TextModel's hparams (the MQA view: head_count_kv 1) plus MLA's (q_lora_rank when there
    is one, kv_lora_rank, key_length = kv_lora + rope, value_length = kv_lora, the per-head
    key_length_mla / value_length_mla, rope.dimension_count) and the router's; kv_b_proj
    split into attn_k_b [heads, kv_lora, nope] (transposed) and attn_v_b [heads, v, kv_lora];
    experts stacked; the router bias renamed e_score_correction.bias; names from gguf-py's
    TensorNameMap. outtype: T.F32, or T.BF16 for the 2-D weights (norms, router and bias F32).
    kv_b_raw: {layer: ((k_b raw blocks, type), (v_b raw blocks, type))} written in place of
    that layer's halves (whose values kv_b_proj of src must be)."""
    cfg, tensors = load_dir(os.path.join(FIX, src))
    L, E, H = cfg["num_hidden_layers"], cfg["n_routed_experts"], cfg["num_attention_heads"]
    nope, rope_d, v, R = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    arch = gguf.MODEL_ARCH.DEEPSEEK2
    names = gguf.get_tensor_name_map(arch, L)
    w = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[arch])
    text_model_header(w, cfg, 1)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("n_group") is not None:
        w.add_expert_group_count(cfg["n_group"])
    if cfg.get("topk_group") is not None:
        w.add_expert_group_used_count(cfg["topk_group"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if cfg["scoring_func"] == "sigmoid"
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("q_lora_rank") is not None:
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(R)
    w.add_key_length(R + rope_d)
    w.add_value_length(R)
    w.add_key_length_mla(nope + rope_d)
    w.add_value_length_mla(v)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_count(E)
    w.add_expert_shared_count(cfg.get("n_shared_experts", 0))
    if cfg.get("routed_scaling_factor") is not None:
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope_d)
    placeholder_vocab(w, cfg, "deepseek-v3")

    def add(gname, a):
        a = np.ascontiguousarray(a, dtype=np.float32)
        if outtype == T.BF16 and a.ndim >= 2 and "ffn_gate_inp" not in gname:
            w.add_tensor(gname, (a.view(np.uint32) >> 16).astype(np.uint16), raw_dtype=T.BF16)  # values are bf16
        else:
            w.add_tensor(gname, a)

    def gname(hf):
        return names.get_name(hf, try_suffixes=(".weight", ".bias"))

    experts = {}
    for name in sorted(tensors):
        a = as_f32(tensors[name])
        if outtype == T.BF16:  # the BF16 file holds bf16 values; the reference directory is this rounding
            a = ((a.view(np.uint32) + 0x7FFF + ((a.view(np.uint32) >> 16) & 1)) & 0xFFFF0000).view(np.float32) \
                if a.ndim >= 2 and ".mlp.gate." not in name else a
        hf = name.replace("e_score_correction_bias", "e_score_correction.bias")
        m = hf.split(".")
        if ".mlp.experts." in hf:
            experts.setdefault((int(m[2]), m[6]), {})[int(m[5])] = a
        elif hf.endswith("kv_b_proj.weight") and int(m[2]) in (kv_b_raw or {}):
            for half, (raw, qt) in zip(("k_b_proj", "v_b_proj"), kv_b_raw[int(m[2])]):
                w.add_tensor(gname(hf.replace("kv_b_proj", half)), raw, raw_dtype=qt)
        elif hf.endswith("kv_b_proj.weight"):
            kv_b = a.reshape(H, nope + v, R)
            add(gname(hf.replace("kv_b_proj", "k_b_proj")), kv_b[:, :nope, :].transpose(0, 2, 1))
            add(gname(hf.replace("kv_b_proj", "v_b_proj")), kv_b[:, nope:, :])
        else:
            add(gname(hf), a)
    for (l, proj), per in sorted(experts.items()):
        assert sorted(per) == list(range(E))
        add(gname(f"model.layers.{l}.mlp.experts.{proj}.weight"), np.stack([per[e] for e in range(E)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- the quantised model -------------------------------------------------------------

QCFG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
    "intermediate_size": 64, "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [1], "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 64, "tie_word_embeddings": False,
    "hidden_act": "silu", "attention_bias": False, "torch_dtype": "float32",
}


def kquant_blocks(rng, qtype, n_rows, row_len):
    """Random valid K-quant blocks: small finite f16 d / dmin, random scales and codes."""
    bs, bb = gguf.GGML_QUANT_SIZES[qtype]
    nblk = n_rows * row_len // bs
    raw = rng.integers(0, 256, size=(nblk, bb), dtype=np.uint8)
    def f16(lo, hi, n):
        return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    if qtype in (T.Q4_K, T.Q5_K):  # d, dmin first
        raw[:, 0:2] = f16(0.002, 0.02, nblk)
        raw[:, 2:4] = f16(0.0, 0.02, nblk)
    elif qtype == T.Q6_K:  # ql, qh, scales (int8), then d last
        raw[:, bb - 2:bb] = f16(0.0005, 0.004, nblk)
    return raw.reshape(n_rows, row_len // bs * bb)


def quant_tensor(rng, qtype, shape):
    """(raw bytes shaped as gguf-py stores them, f32 dequantised values of the same shape)."""
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        rows = int(np.prod(shape[:-1]))
        raw = kquant_blocks(rng, qtype, rows, shape[-1])
        raw = raw.reshape(*shape[:-1], raw.shape[-1])
    else:
        vals = rng.normal(0, 0.06, size=shape).astype(np.float32)
        raw = gguf.quants.quantize(vals, qtype)
    return raw, gguf.quants.dequantize(raw, qtype).astype(np.float32).reshape(shape)


def write_safetensors(path, tensors):
    hdr, off, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        hdr[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_ref_dir(name, cfg, tensors):
    """OUT/NAME-ref/: a Hugging Face directory of f32 tensors and cfg; its path."""
    d = os.path.join(OUT, name + "-ref")
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return d


# The K-quant model: llama.cpp's Q4_K_M recipe for the routed experts of layer 0 (gate and
# up Q4_K, down Q6_K) and, in layer 1, gate and up of two forms (Q5_K has a min, Q8_0 a
# zero point) with down Q5_1; k of 256 so every row holds whole K-quant blocks.
KCFG = dict(QCFG, moe_intermediate_size=256, intermediate_size=256, mlp_only_layers=[])
KQUANT_EXPERTS = {0: (T.Q4_K, T.Q4_K, T.Q6_K), 1: (T.Q5_K, T.Q8_0, T.Q5_1)}


def quantised(name="qwen3moe-quant", cfg=QCFG, experts=None, seed=2026, ref_dir=True):
    """experts: {layer: (gate, up, down) types}; default Q4_0 for every MoE layer.
    ref_dir: also write the dequantised twin directory NAME-ref/."""
    rng = np.random.default_rng(seed)
    H, L, E, I, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_experts"], cfg["moe_intermediate_size"], cfg["vocab_size"]
    q_dim, kv_dim = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    w = gguf.GGUFWriter(os.path.join(OUT, name + ".gguf"), "qwen3moe")
    header(w, "qwen3moe", cfg)
    ref = {}

    def qput(gname, hname, qtype, shape):
        raw, deq = quant_tensor(rng, qtype, shape)
        w.add_tensor(gname, raw, raw_dtype=qtype)
        ref[hname] = deq

    def fput(gname, hname, shape, scale=0.3, offset=1.0):
        a = (offset + scale * rng.standard_normal(shape)).astype(np.float32)
        w.add_tensor(gname, a)
        ref[hname] = a

    qput("token_embd.weight", "model.embed_tokens.weight", T.Q8_0, (V, H))
    fput("output_norm.weight", "model.norm.weight", (H,))
    qput("output.weight", "lm_head.weight", T.Q6_K, (V, H))
    types = {"attn_q": T.Q4_K, "attn_k": T.Q5_K, "attn_v": T.Q6_K, "attn_output": T.Q4_0}
    shapes = {"attn_q": (q_dim, H), "attn_k": (kv_dim, H), "attn_v": (kv_dim, H), "attn_output": (H, q_dim)}
    for l in range(L):
        p, g = f"model.layers.{l}.", f"blk.{l}."
        fput(g + "attn_norm.weight", p + "input_layernorm.weight", (H,))
        fput(g + "ffn_norm.weight", p + "post_attention_layernorm.weight", (H,))
        for hf, gg in ATTN:
            qput(f"{g}{gg}.weight", f"{p}self_attn.{hf}.weight", types[gg], shapes[gg])
        fput(g + "attn_q_norm.weight", p + "self_attn.q_norm.weight", (cfg["head_dim"],))
        fput(g + "attn_k_norm.weight", p + "self_attn.k_norm.weight", (cfg["head_dim"],))
        if l in cfg["mlp_only_layers"]:
            for (hf, gg), qt in zip(MLP, (T.Q4_1, T.Q5_0, T.Q5_1)):
                shape = (cfg["intermediate_size"], H) if gg != "down" else (H, cfg["intermediate_size"])
                qput(f"{g}ffn_{gg}.weight", f"{p}mlp.{hf}.weight", qt, shape)
            continue
        fput(g + "ffn_gate_inp.weight", p + "mlp.gate.weight", (E, H), 0.1, 0.0)
        # Q4_0 as in llama.cpp's Q4_0 files, unless `experts` says otherwise
        for (hf, gg), qt in zip(MLP, (experts or {}).get(l, (T.Q4_0, T.Q4_0, T.Q4_0))):
            shape = (E, I, H) if gg != "down" else (E, H, I)
            raw, deq = quant_tensor(rng, qt, shape)
            w.add_tensor(f"{g}ffn_{gg}_exps.weight", raw, raw_dtype=qt)
            for e in range(E):
                ref[f"{p}mlp.experts.{e}.{hf}.weight"] = deq[e]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if ref_dir:
        write_ref_dir(name, cfg, ref)


# The quantised DeepSeek-V3: kv_b_proj's halves in legacy quantised types (attn_k_b's rows
# are qk_nope_head_dim long, 128 in DeepSeek-V3, too short for a 256-weight K-quant block,
# so llama.cpp's quantiser falls back to such a type for it), every other weight F32: the
# coded halves are the only int8-input GEMMs of the model. Rows of 32 (k_b) and 64 (v_b)
# weights, whole blocks; kv_lora, nope and v all differ, so a transposition shows.
DSCFG_CHANGES = {"kv_lora_rank": 64, "qk_nope_head_dim": 32, "v_head_dim": 48, "qk_rope_head_dim": 8,
                 "qk_head_dim": 40, "head_dim": 8, "num_attention_heads": 2, "num_key_value_heads": 2,
                 "num_hidden_layers": 2, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 1,
                 "topk_group": 1, "vocab_size": 64}
DS_KV_B_TYPES = {0: (T.Q8_0, T.Q4_0), 1: (T.Q5_0, T.Q4_1)}


def quantised_deepseek(name="deepseek-quant", seed=2028):
    """NAME-ref/: a random DeepSeek-V3 directory whose kv_b_proj holds gguf-py's dequantised
    values of random quantised halves; NAME.gguf: that directory as convert_deepseek writes
    it, with the halves' own blocks (DS_KV_B_TYPES: k_b, v_b per layer)."""
    rng = np.random.default_rng(seed)
    cfg = dict(json.load(open(os.path.join(FIX, "deepseek_v3", "config.json"))), **DSCFG_CHANGES)
    Hd, V, Ls, E = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"], cfg["n_routed_experts"]
    nh, R, nope, v, rd = (cfg[k] for k in ("num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim",
                                           "qk_rope_head_dim"))
    qa, I, Im = cfg["q_lora_rank"], cfg["intermediate_size"], cfg["moe_intermediate_size"]
    t, raws = {}, {}

    def mat(name, shape, scale=0.15):
        t[name] = (scale * rng.standard_normal(shape)).astype(np.float32)

    def norm(name, n):
        t[name] = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    mat("model.embed_tokens.weight", (V, Hd), 0.5)
    mat("lm_head.weight", (V, Hd))
    norm("model.norm.weight", Hd)
    for l in range(Ls):
        p = f"model.layers.{l}."
        norm(p + "input_layernorm.weight", Hd)
        norm(p + "post_attention_layernorm.weight", Hd)
        a = p + "self_attn."
        mat(a + "q_a_proj.weight", (qa, Hd))
        norm(a + "q_a_layernorm.weight", qa)
        mat(a + "q_b_proj.weight", (nh * (nope + rd), qa))
        mat(a + "kv_a_proj_with_mqa.weight", (R + rd, Hd))
        norm(a + "kv_a_layernorm.weight", R)
        mat(a + "o_proj.weight", (Hd, nh * v))
        (kt, vt) = DS_KV_B_TYPES[l]
        kraw, kb = quant_tensor(rng, kt, (nh, R, nope))
        vraw, vb = quant_tensor(rng, vt, (nh, v, R))
        raws[l] = ((kraw, kt), (vraw, vt))
        t[a + "kv_b_proj.weight"] = np.concatenate([kb.transpose(0, 2, 1), vb], axis=1).reshape(nh * (nope + v), R)
        if l < cfg["first_k_dense_replace"]:
            for proj, shape in (("gate_proj", (I, Hd)), ("up_proj", (I, Hd)), ("down_proj", (Hd, I))):
                mat(f"{p}mlp.{proj}.weight", shape)
            continue
        mat(p + "mlp.gate.weight", (E, Hd), 0.3)
        t[p + "mlp.gate.e_score_correction_bias"] = (0.05 * rng.standard_normal(E)).astype(np.float32)
        shapes = (("gate_proj", (Im, Hd)), ("up_proj", (Im, Hd)), ("down_proj", (Hd, Im)))
        for e in range(E):
            for proj, shape in shapes:
                mat(f"{p}mlp.experts.{e}.{proj}.weight", shape)
        for proj, (n, k) in shapes:
            n, k = (n * cfg["n_shared_experts"], k) if proj != "down_proj" else (n, k * cfg["n_shared_experts"])
            mat(f"{p}mlp.shared_experts.{proj}.weight", (n, k))
    d = write_ref_dir(name, cfg, t)
    convert_deepseek(d, os.path.join(OUT, name + ".gguf"), T.F32, kv_b_raw=raws)


def main():
    os.makedirs(OUT, exist_ok=True)
    convert("qwen3_moe", "qwen3moe", os.path.join(OUT, "qwen3_moe-BF16.gguf"), f32=False)
    convert("qwen2_moe", "qwen2moe", os.path.join(OUT, "qwen2_moe-F32.gguf"), f32=True, split=True)
    convert("chat_qwen3", "qwen3moe", os.path.join(OUT, "chat_qwen3-BF16.gguf"), f32=False, tokenizer="chat_qwen3")
    convert_mixtral("mixtral", os.path.join(OUT, "mixtral-F32.gguf"))
    convert_ernie("ernie4_5_moe", os.path.join(OUT, "ernie4_5_moe-F32.gguf"))
    convert_ernie("ernie4_5_moe", os.path.join(OUT, "ernie4_5_moe-Q8_0-embd.gguf"), embd="q8_0")
    convert_ernie("ernie4_5_moe", os.path.join(OUT, "ernie4_5_moe-Q8_0-embd-ref.gguf"), embd="q8_0-ref")
    convert_deepseek("deepseek_v3", os.path.join(OUT, "deepseek_v3-F32.gguf"), T.F32)
    convert_deepseek("deepseek_v2", os.path.join(OUT, "deepseek_v2-F32.gguf"), T.F32)
    convert_deepseek("deepseek_v3", os.path.join(OUT, "deepseek_v3-BF16.gguf"), T.BF16)
    quantised()
    quantised("qwen3moe-kquant", KCFG, KQUANT_EXPERTS, seed=2027, ref_dir=False)
    quantised_deepseek()


if __name__ == "__main__":
    main()
