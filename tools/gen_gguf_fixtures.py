#!/usr/bin/env python3
"""Writes the GGUF fixtures of tests/test_gguf*.cpp with gguf-py, llama.cpp's own Python
GGUF library (the reference we did not write), and the seed corpus of fuzz/fuzz_gguf.

    python3 -m venv /tmp/gguf-venv
    /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy==2.4.6
    /tmp/gguf-venv/bin/python tools/gen_gguf_fixtures.py

Writes (deterministic: fixed seeds; two runs give the same bytes):
  tests/fixtures/gguf/all_types.gguf        metadata of every value type (nested arrays
                                            too) and a tensor of every supported ggml type,
                                            plus two unsupported ones (Q2_K, I32)
  tests/fixtures/gguf/aligned64.gguf        general.alignment = 64
  tests/fixtures/gguf/split/model-0000{1,2}-of-00002.gguf   one model in two parts
  tests/fixtures/gguf/golden.json           what the script wrote (metadata with types,
                                            tensor names, ggml shapes, offsets as
                                            gguf-py's reader sees them) and, per tensor,
                                            gguf-py's dequantised values as f32 bits
  fuzz/corpus/fuzz_gguf/*.gguf              tiny valid files (< 4 KB each)

Quantised tensors: gguf.quants.quantize for the types gguf-py can quantise (Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, BF16); it cannot quantise K-quants, so Q4_K, Q5_K and Q6_K blocks are
built byte-wise: random codes and 6-bit scales (every bit of those bytes random), random
finite f16 d / dmin, with edge blocks (subnormal d, zero d, large d, negative d).

The values are gguf.quants.dequantize's. gguf-py computes them with numpy in f32 with
the operations of ggml's reference dequantisers in the same order (e.g. Q4_K:
(d * sc) * q - dmin * m; Q6_K: (d * sc) * q). Every product there is exact in f32 (an
11-bit f16 significand times small integers), so each weight rounds at most once (the
final add or subtract), whether or not a compiler fuses it into an FMA: gguf-py's bits
are ggml's (ggml is the authority), and the C++ test compares bits with no tolerance.
"""
import json
import shutil
import sys
from pathlib import Path

import numpy as np

GGUF_VERSION = "0.19.0"
NUMPY_VERSION = "2.4.6"

try:
    import gguf
    from gguf import GGMLQuantizationType as Q, GGUFValueType as V
    from gguf.quants import dequantize, quantize
except ImportError:
    sys.exit(__doc__)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf"
CORPUS = ROOT / "fuzz" / "corpus" / "fuzz_gguf"

# gguf-py lists no __version__; the installed distribution's metadata has it.
from importlib.metadata import version as dist_version  # noqa: E402

if dist_version("gguf") != GGUF_VERSION or np.__version__ != NUMPY_VERSION:
    sys.exit(f"need gguf=={GGUF_VERSION} numpy=={NUMPY_VERSION}, have gguf {dist_version('gguf')} numpy "
             f"{np.__version__}\n{__doc__}")

F32 = np.float32

# (key, value type, value, array element type). f32 values are written rounded to f32;
# the golden holds the rounded value so the C++ side compares exactly.
METADATA = [
    ("test.u8", V.UINT8, 200, None),
    ("test.i8", V.INT8, -100, None),
    ("test.u16", V.UINT16, 60000, None),
    ("test.i16", V.INT16, -30000, None),
    ("test.u32", V.UINT32, 4000000000, None),
    ("test.i32", V.INT32, -2000000000, None),
    ("test.u64", V.UINT64, 2**64 - 1, None),
    ("test.i64", V.INT64, -(2**63), None),
    ("test.f32", V.FLOAT32, float(F32(3.14159)), None),
    ("test.f64", V.FLOAT64, 2.718281828459045, None),
    ("test.bool_true", V.BOOL, True, None),
    ("test.bool_false", V.BOOL, False, None),
    ("test.str", V.STRING, "h\u00e9llo \u2713 w\u00f6rld", None),
    ("test.str_empty", V.STRING, "", None),
    ("test.arr_u8", V.ARRAY, [0, 1, 255], V.UINT8),
    ("test.arr_i8", V.ARRAY, [-128, 0, 127], V.INT8),
    ("test.arr_u16", V.ARRAY, [0, 65535], V.UINT16),
    ("test.arr_i16", V.ARRAY, [-32768, 32767], V.INT16),
    ("test.arr_u32", V.ARRAY, [0, 7, 4000000000], V.UINT32),
    ("test.arr_i32", V.ARRAY, [-1, 2, 2147483647, -2147483648], V.INT32),
    ("test.arr_u64", V.ARRAY, [0, 2**64 - 1], V.UINT64),
    ("test.arr_i64", V.ARRAY, [-(2**63), 2**63 - 1], V.INT64),
    ("test.arr_f32", V.ARRAY, [float(F32(x)) for x in (0.5, -1.25, 1e-8, 3.4e38)], V.FLOAT32),
    ("test.arr_f64", V.ARRAY, [0.1, -1e300], V.FLOAT64),
    ("test.arr_bool", V.ARRAY, [True, False, True], V.BOOL),
    ("test.arr_str", V.ARRAY, ["a", "", "\u00df\u2713", "merge x"], V.STRING),
    ("test.nested_str", V.ARRAY, [["a", "b"], ["c"]], V.ARRAY),
    ("test.nested_i32", V.ARRAY, [[1, 2, 3], [-4]], V.ARRAY),
    ("test.nested_f32", V.ARRAY, [[0.5], [1.5, 2.5]], V.ARRAY),
    ("test.nested_deep", V.ARRAY, [[[1], [2, 3]], [[4]]], V.ARRAY),
]


def add_metadata(w, items):
    for key, vtype, value, sub in items:
        w.add_key_value(key, value, vtype, sub_type=sub)


def meta_golden(items):
    out = {}
    for key, vtype, value, sub in items:
        e = {"type": vtype.name, "value": value}
        if sub is not None:
            e["elem_type"] = sub.name
        out[key] = e
    return out


def f16_finite(rng, n, lo=-4.0, hi=4.0):
    return rng.uniform(lo, hi, n).astype(np.float16)


def k_blocks(rng, qtype, n_blocks):
    """Valid random K-quant super-blocks as raw bytes, [n_blocks, block_bytes]."""
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    n_halves = 1 if qtype == Q.Q6_K else 2  # Q6_K has d only (at the end); Q4_K/Q5_K d and dmin first
    halves = f16_finite(rng, n_blocks * n_halves).reshape(n_blocks, n_halves)
    # Edge blocks: a subnormal d, a zero d (dmin still random), a large d, a negative d.
    edges = [np.float16(6e-8), np.float16(0.0), np.float16(60000.0), np.float16(-0.75)]
    for i, e in enumerate(edges[: n_blocks]):
        halves[i, 0] = e
    hb = halves.view(np.uint8).reshape(n_blocks, 2 * n_halves)
    if qtype == Q.Q6_K:
        raw[:, -2:] = hb
    else:
        raw[:, :4] = hb
    return raw


def quantized(rng, qtype, shape):
    """(raw bytes [.., row_bytes], ggml type) for a tensor of torch shape `shape`."""
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        bs, bb = gguf.GGML_QUANT_SIZES[qtype]
        n_blocks = int(np.prod(shape)) // bs
        raw = k_blocks(rng, qtype, n_blocks)
        return raw.reshape(*shape[:-1], shape[-1] // bs * bb)
    data = rng.standard_normal(shape).astype(F32)
    if qtype in (Q.Q4_0, Q.Q5_0, Q.Q8_0):
        data.reshape(-1)[0] = 0.0  # a zero weight: code = zero point, -0.0 when d < 0
    return quantize(data, qtype)


def special_f32(rng, shape):
    x = rng.standard_normal(shape).astype(F32).reshape(-1)
    specials = [np.inf, -np.inf, -0.0, np.float32(1e-45), np.nan, F32(3.4e38)]
    x[: min(len(x), 6)] = specials[: len(x)]
    return x.reshape(shape)


def special_f16(rng, shape):
    x = rng.standard_normal(shape).astype(np.float16).reshape(-1)
    specials = [np.inf, -0.0, np.float16(6e-8), np.float16(65504), np.float16(-1e-5)]
    x[: min(len(x), 5)] = specials[: len(x)]
    return x.reshape(shape)


def all_type_tensors(rng):
    """[(name, torch shape, ggml type, raw array, writer dtype arg)]."""
    t = []
    t.append(("f32.weight", Q.F32, special_f32(rng, (3, 40))))
    t.append(("f16.weight", Q.F16, special_f16(rng, (2, 3, 8))))
    bf = special_f32(rng, (4, 16))
    t.append(("bf16.weight", Q.BF16, quantize(bf, Q.BF16)))
    t.append(("q8_0.weight", Q.Q8_0, quantized(rng, Q.Q8_0, (2, 3, 64))))
    t.append(("q4_0.weight", Q.Q4_0, quantized(rng, Q.Q4_0, (4, 64))))
    t.append(("q4_1.weight", Q.Q4_1, quantized(rng, Q.Q4_1, (3, 96))))
    t.append(("q5_0.weight", Q.Q5_0, quantized(rng, Q.Q5_0, (2, 64))))
    t.append(("q5_1.weight", Q.Q5_1, quantized(rng, Q.Q5_1, (2, 2, 2, 32))))
    t.append(("q4_k.weight", Q.Q4_K, quantized(rng, Q.Q4_K, (3, 512))))
    t.append(("q5_k.weight", Q.Q5_K, quantized(rng, Q.Q5_K, (2, 256))))
    t.append(("q6_k.weight", Q.Q6_K, quantized(rng, Q.Q6_K, (2, 2, 256))))
    # Unsupported: the loader must list them and refuse to dequantise them by name.
    t.append(("q2_k.weight", Q.Q2_K, rng.integers(0, 256, (1, 84), dtype=np.uint8)))
    t.append(("i32.ids", Q.I32, np.arange(5, dtype=np.int32) - 2))
    return t


def add_tensors(w, tensors):
    for name, qtype, arr in tensors:
        if qtype in (Q.F32, Q.F16, Q.I32):
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=qtype)


def write(path, tensors, meta=(), alignment=None, split_max_tensors=0, arch="llama"):
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    add_metadata(w, meta)
    add_tensors(w, tensors)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tensor_golden(path, tensors):
    """Per tensor: what the script wrote, and gguf-py's reader's view and dequantisation."""
    reader = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}
    out = []
    for name, qtype, arr in tensors:
        rt = by_name[name]
        supported = qtype in SUPPORTED
        e = {
            "name": name,
            "type": qtype.name,
            "type_id": int(qtype),
            "ne": [int(x) for x in rt.shape],  # gguf-py's reader gives ggml order
            "offset": int(rt.data_offset),
            "nbytes": int(rt.n_bytes),
            "supported": supported,
        }
        if supported:
            raw = np.ascontiguousarray(arr).view(np.uint8)
            raw = raw.reshape(*arr.shape[:-1], -1)
            vals = dequantize(raw, qtype).astype(F32, copy=False)
            e["torch_shape"] = list(vals.shape)
            e["f32_bits"] = vals.view(np.uint32).reshape(-1).tolist()
        out.append(e)
    return out


SUPPORTED = {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K}


def main():
    rng = np.random.default_rng(20240611)
    # Only this script's files: tokenizer/ and models/ beside them belong to
    # gen_gguf_tokenizer_fixtures.py and gen_gguf_model_fixtures.py, and README.md
    # (which describes all three) is kept by hand.
    if (OUT / "split").exists():
        shutil.rmtree(OUT / "split")
    OUT.mkdir(parents=True, exist_ok=True)
    golden = {"gguf_py_version": GGUF_VERSION, "numpy_version": NUMPY_VERSION, "files": {},
              # gguf-py's copy of ggml's type table, to check ours against.
              "ggml_types": [{"name": q.name, "id": int(q), "block_size": bs, "block_bytes": bb}
                             for q, (bs, bb) in sorted(gguf.GGML_QUANT_SIZES.items())]}

    tensors = all_type_tensors(rng)
    write(OUT / "all_types.gguf", tensors, METADATA)
    golden["files"]["all_types.gguf"] = {
        "alignment": 32, "metadata": meta_golden(METADATA), "tensors": tensor_golden(OUT / "all_types.gguf", tensors)}

    a64 = [("a.weight", Q.Q8_0, quantized(rng, Q.Q8_0, (1, 32))), ("b.weight", Q.F32, special_f32(rng, (3,)))]
    write(OUT / "aligned64.gguf", a64, alignment=64)
    golden["files"]["aligned64.gguf"] = {"alignment": 64, "tensors": tensor_golden(OUT / "aligned64.gguf", a64)}

    split = [("blk.0.ffn_up.weight", Q.Q4_K, quantized(rng, Q.Q4_K, (2, 256))),
             ("blk.0.ffn_down.weight", Q.Q6_K, quantized(rng, Q.Q6_K, (1, 256))),
             ("output_norm.weight", Q.F32, rng.standard_normal(8).astype(F32))]
    split_meta = [("general.name", V.STRING, "split fixture", None), ("test.u32", V.UINT32, 7, None)]
    write(OUT / "split" / "model.gguf", split, split_meta, split_max_tensors=2)
    parts = ["split/model-00001-of-00002.gguf", "split/model-00002-of-00002.gguf"]
    golden["split"] = {"first": parts[0], "parts": parts, "count": 2, "metadata": meta_golden(split_meta),
                       "tensors": tensor_golden(OUT / parts[0], split[:2]) + tensor_golden(OUT / parts[1], split[2:]),
                       "part_of": {"blk.0.ffn_up.weight": 0, "blk.0.ffn_down.weight": 0, "output_norm.weight": 1}}

    (OUT / "golden.json").write_text(json.dumps(golden, indent=None, separators=(",", ":")) + "\n")

    # Fuzz seeds: small valid files, one feature each.
    if CORPUS.exists():
        shutil.rmtree(CORPUS)
    CORPUS.mkdir(parents=True)
    write(CORPUS / "metadata_only.gguf", [], METADATA)
    write(CORPUS / "legacy_quants.gguf", [(n, q, quantized(rng, q, (1, 32))) for n, q in
                                          [("a", Q.Q4_0), ("b", Q.Q4_1), ("c", Q.Q5_0), ("d", Q.Q5_1), ("e", Q.Q8_0)]]
          + [("f", Q.F16, special_f16(rng, (2, 4))), ("g", Q.BF16, quantize(special_f32(rng, (4,)), Q.BF16)),
             ("h", Q.F32, special_f32(rng, (2, 3)))])
    write(CORPUS / "k_quants.gguf", [(n, q, quantized(rng, q, (1, 256))) for n, q in
                                     [("k4", Q.Q4_K), ("k5", Q.Q5_K), ("k6", Q.Q6_K)]])
    # What fuzz_gguf hands on to the model's config and tensor map and to the tokenizer
    # converter: a tiny qwen3moe model and a tiny byte-level BPE tokenizer.
    S, U32, F = V.STRING, V.UINT32, V.FLOAT32
    hp = [("qwen3moe.block_count", U32, 1), ("qwen3moe.embedding_length", U32, 8), ("qwen3moe.context_length", U32, 16),
          ("qwen3moe.attention.head_count", U32, 1), ("qwen3moe.attention.head_count_kv", U32, 1),
          ("qwen3moe.attention.key_length", U32, 8), ("qwen3moe.attention.layer_norm_rms_epsilon", F, 1e-6),
          ("qwen3moe.expert_count", U32, 2), ("qwen3moe.expert_used_count", U32, 1),
          ("qwen3moe.expert_feed_forward_length", U32, 8)]
    write(CORPUS / "qwen3moe_tiny.gguf",
          [("token_embd.weight", Q.F32, rng.standard_normal((4, 8)).astype(F32)),
           ("blk.0.attn_q.weight", Q.F16, rng.standard_normal((8, 8)).astype(np.float16)),
           ("blk.0.ffn_gate_exps.weight", Q.F32, rng.standard_normal((2, 8, 8)).astype(F32))],
          [(k, t, v, None) for k, t, v in hp], arch="qwen3moe")
    tok = [("tokenizer.ggml.model", S, "gpt2", None), ("tokenizer.ggml.pre", S, "qwen2", None),
           ("tokenizer.ggml.tokens", V.ARRAY, ["a", "b", "ab", "<|x|>"], S),
           ("tokenizer.ggml.token_type", V.ARRAY, [1, 1, 1, 3], V.INT32),
           ("tokenizer.ggml.merges", V.ARRAY, ["a b"], S), ("tokenizer.ggml.eos_token_id", U32, 3, None),
           ("tokenizer.chat_template", S, "{{ messages[0].content }}", None)]
    write(CORPUS / "tokenizer_tiny.gguf", [], tok)
    # A tiny deepseek2 (MLA with the converter's attn_k_b / attn_v_b, which the loader
    # composes back into kv_b_proj; sigmoid gating with its exp_probs_b bias).
    d = "deepseek2."
    ds = [(d + "block_count", U32, 1), (d + "embedding_length", U32, 8), (d + "context_length", U32, 16),
          (d + "attention.head_count", U32, 2), (d + "attention.head_count_kv", U32, 1),
          (d + "attention.kv_lora_rank", U32, 4), (d + "attention.key_length_mla", U32, 4),
          (d + "attention.value_length_mla", U32, 2), (d + "rope.dimension_count", U32, 2),
          (d + "attention.layer_norm_rms_epsilon", F, 1e-6), (d + "expert_count", U32, 2),
          (d + "expert_used_count", U32, 1), (d + "expert_feed_forward_length", U32, 4),
          (d + "expert_gating_func", U32, 2)]
    r32 = lambda *shape: rng.standard_normal(shape).astype(F32)  # noqa: E731
    write(CORPUS / "deepseek2_tiny.gguf",
          [("token_embd.weight", Q.F32, r32(4, 8)), ("blk.0.attn_q.weight", Q.F32, r32(8, 8)),
           ("blk.0.attn_kv_a_mqa.weight", Q.F32, r32(6, 8)), ("blk.0.attn_k_b.weight", Q.F32, r32(2, 4, 2)),
           ("blk.0.attn_v_b.weight", Q.F16, r32(2, 2, 4).astype(np.float16)),
           ("blk.0.exp_probs_b.bias", Q.F32, r32(2)), ("blk.0.ffn_gate_exps.weight", Q.F32, r32(2, 4, 8))],
          [(k, t, v, None) for k, t, v in ds], arch="deepseek2")
    shutil.copy(OUT / "aligned64.gguf", CORPUS / "aligned64.gguf")
    for p in parts:
        shutil.copy(OUT / p, CORPUS / Path(p).name)
    for f in sorted(CORPUS.iterdir()):
        assert f.stat().st_size < 4096, f"{f} is {f.stat().st_size} bytes, the corpus wants < 4 KB"
    total = sum(f.stat().st_size for f in OUT.rglob("*")
                if f.is_file() and f.relative_to(OUT).parts[0] not in ("tokenizer", "models"))
    assert total < 300_000, f"fixtures are {total} bytes"
    print(f"wrote {OUT} ({total} bytes) and {CORPUS}")


if __name__ == "__main__":
    main()
