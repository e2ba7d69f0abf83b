#!/usr/bin/env python3
"""Where a `moe-ep generate --profile` run on a GGUF stands against the machine, stage by
stage: for the prefill each stage's multiply-adds and rate (against a compute peak when
one is given), for a decode step each stage's bytes and read rate against the probed
bandwidth. What issue #21 asks of a goal that is not met: a roofline of each stage.

    moe-ep generate --model M.gguf --warmup --prompt-ids @IDS --max-new-tokens 65 \\
        --ignore-eos --quiet --profile --output-json RUN.json
    tools/stage_roofline.py M.gguf RUN.json BANDWIDTH_GBS [PEAK_GMACS]

BANDWIDTH_GBS: the read-bandwidth probe of the same minute (`moe-ep bench ... | grep
limits`, as tools/bench_vs_llamacpp.sh takes it). PEAK_GMACS: multiply-adds a second the
machine's int8 (or f32) instructions can do on the run's threads, if known.

Bytes a decode step reads: each tensor as gguf_sizes.moe_step_bytes counts it (moe-ep's
storage; the routed experts' top-k of n per layer, since a one-token step reads exactly k
experts of each layer; one embedding row), the KV cache (the run's --kv-cache-dtype) at the mean decode context. Prefill
multiply-adds: every prompt token through every linear (experts: k of n), the lm_head for
the last token only, causal attention T(T+1)/2 query-key pairs a head for scores and as
many for the V sum. Stages not listed (norms, RoPE, residuals) are under "other".
Needs only the standard library.
"""
import json
import sys

from gguf_sizes import gguf_infos, moe_step_bytes


def stage_of(name):
    """The `--profile` stage that reads GGUF tensor `name`, or None (norms, biases)."""
    if name.startswith("token_embd"):
        return "embed"
    if name == "output.weight":
        return "lm_head"
    if not name.startswith("blk."):
        return None
    t = name.split(".")[2]
    if t == "attn_output":
        return "attn_out"
    if t.startswith("attn_") and "norm" not in t:
        return "attn_qkv"  # q, k, v; MLA's q_a, q_b, kv_a_mqa, k_b, v_b
    if t == "ffn_gate_inp":
        return "route"
    if t.endswith("_shexp"):
        return "shared"
    if t in ("ffn_gate_exps", "ffn_up_exps", "ffn_gate", "ffn_up"):
        return "gemm1"  # dense MLPs are timed there too (core/stage_profile.h)
    if t in ("ffn_down_exps", "ffn_down"):
        return "gemm2"
    return None


def main(argv):
    if len(argv) not in (4, 5):
        raise SystemExit(__doc__)
    gguf, run_json, bw = argv[1], argv[2], float(argv[3])
    peak = float(argv[4]) if len(argv) == 5 else 0.0
    meta = {}
    infos = gguf_infos(gguf, meta)
    arch = meta["general.architecture"]
    topk, n_exp = meta[f"{arch}.expert_used_count"], meta[f"{arch}.expert_count"]
    layers = meta[f"{arch}.block_count"]
    heads, kv_heads = meta[f"{arch}.attention.head_count"], meta[f"{arch}.attention.head_count_kv"]
    head_dim = meta.get(f"{arch}.attention.key_length", meta[f"{arch}.embedding_length"] // heads)
    run = json.load(open(run_json))
    if "profile_s" not in run:
        raise SystemExit(f"stage_roofline: {run_json} has no profile_s (run generate with --profile)")
    tm = run["timings"]
    T, steps = tm["prefill_tokens"], tm["decode_steps"]
    ctx = T + steps / 2  # the decode steps' mean context

    bytes_, macs = {}, {}
    for name, dims, nb, ty in infos:
        st = stage_of(name)
        if st is None:
            continue
        bytes_[st] = bytes_.get(st, 0) + moe_step_bytes(name, dims, nb, ty, topk, n_exp)
        if st == "embed":
            continue
        n = 1
        for d in dims:
            n *= d
        share = topk / n_exp if "_exps" in name else 1.0
        macs[st] = macs.get(st, 0) + n * share * (1 if st == "lm_head" else T)
    kv_bytes = 4.0 if run.get("kv_cache", {}).get("dtype") == "f32" else 2.0
    bytes_["attn_core"] = layers * 2 * kv_heads * head_dim * ctx * kv_bytes
    macs["attn_core"] = layers * heads * head_dim * 2 * T * (T + 1) / 2

    pre, dec = run["profile_s"]["prefill"], run["profile_s"]["decode"]

    print(f"{gguf}: {arch}, {layers} layers, {topk} of {n_exp} experts; prefill {T} tokens, "
          f"decode {steps} steps at a mean context of {ctx:.0f}; bandwidth {bw:.1f} GB/s"
          + (f", peak {peak:.0f} G multiply-adds/s" if peak else ""))
    print("| stage | prefill ms | G multiply-adds | G/s" + (" | of peak" if peak else "")
          + " | decode ms a step | MB a step | GB/s | of bandwidth |")
    print("|---|---|---|---|" + ("---|" if peak else "") + "---|---|---|---|")
    order = ["embed", "attn_qkv", "attn_core", "attn_out", "route", "gemm1", "gemm2", "shared", "lm_head"]
    for st in order + ["other"]:
        sp, sd = pre.get(st, 0.0), dec.get(st, 0.0) / max(steps, 1)
        if not sp and not sd and st not in macs:
            continue
        m, b = macs.get(st, 0.0), bytes_.get(st, 0.0)
        rate = m / sp / 1e9 if sp and m else 0.0
        gbs = b / sd / 1e9 if sd and b else 0.0
        cells = [st, f"{sp * 1e3:.1f}", f"{m / 1e9:.2f}" if m else "-", f"{rate:.1f}" if rate else "-"]
        if peak:
            cells.append(f"{rate / peak:.2f}" if rate else "-")
        cells += [f"{sd * 1e3:.3f}", f"{b / 1e6:.1f}" if b else "-", f"{gbs:.1f}" if gbs else "-",
                  f"{gbs / bw:.2f}" if gbs else "-"]
        print("| " + " | ".join(cells) + " |")
    b_all = sum(bytes_.values())
    sd_all = tm["decode_s"] / max(steps, 1)
    m_all = sum(macs.values())
    print(f"prefill: {tm['prefill_s'] * 1e3:.0f} ms, {m_all / 1e9:.1f} G multiply-adds, "
          f"{m_all / tm['prefill_s'] / 1e9:.1f} G/s; decode step: {sd_all * 1e3:.2f} ms, {b_all / 1e6:.1f} MB, "
          f"{b_all / sd_all / 1e9:.1f} GB/s = {b_all / sd_all / 1e9 / bw:.2f} of the bandwidth")


if __name__ == "__main__":
    main(sys.argv)
