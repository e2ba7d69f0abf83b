#!/usr/bin/env python3
"""The model of `moe-ep bench-model` in PyTorch/transformers on the CPU, for comparison.

Same shape (Qwen3-30B-A3B layers: hidden 2048, 32 q / 4 kv heads of 128, 128 experts,
top-8, expert intermediate 768), same number of layers and vocabulary, random bf16
weights (transformers' own init), eager attention, the same prompt ids (the formula of
src/cli/bench_model.cpp), the same threads. Measures:
  prefill: tokens/s of one prompt of --prefill tokens (logits of the last position only);
  decode:  tokens/s at each --decode-batch, greedy with the KV cache (DynamicCache), after
           prefilling --decode-context tokens per sequence; --decode-steps steps per pass.
Each number is the median of --repeats timed passes (after one warm-up). Prints JSON.

--experts-impl auto times decode at batch 1 with every experts implementation the
installed transformers offers ("eager", "grouped_mm", "batched_mm") and uses the
fastest for the whole run (all the trial numbers are in the JSON).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time


def prompt_ids(b, n, vocab):
    return [(17 + 7919 * b + 104729 * j) % vocab for j in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode-batch", default="1,16")
    ap.add_argument("--decode-context", type=int, default=128)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--experts-impl", default="auto", help="auto, eager, grouped_mm or batched_mm")
    ap.add_argument("--json", default="", help="also write the JSON here")
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(
        vocab_size=a.vocab,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=a.layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )
    cfg._attn_implementation = "eager"
    t0 = time.perf_counter()
    # Built straight in bf16 (no f32 copy of 5 GB), without transformers' init; then every
    # matrix uniform in [-s, s) with s = sqrt(3 / fan_in) (embedding s = 1, norms 1), as
    # moe-ep bench-model draws its weights, so activations and routing behave alike.
    from transformers.initialization import no_init_weights

    torch.set_default_dtype(torch.bfloat16)
    with no_init_weights():
        model = Qwen3MoeForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            elif "embed_tokens" in name:
                p.uniform_(-1.0, 1.0)
            elif name.endswith("mlp.gate.weight"):
                p.uniform_(-4.0 / p.shape[-1] ** 0.5, 4.0 / p.shape[-1] ** 0.5)  # the router, as bench::random_layer
            else:
                s = (3.0 / p.shape[-1]) ** 0.5  # [out, in] or experts' [E, out, in]: fan_in is the last dim
                p.uniform_(-s, s)
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())

    def set_impl(name):
        model.set_experts_implementation(name)

    impls = ["eager", "grouped_mm", "batched_mm"]

    def decode(batch, steps, repeats):
        ids = torch.tensor([prompt_ids(b, a.decode_context, a.vocab) for b in range(batch)])
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache = out.cache
            first = out.logits[:, -1].argmax(-1, keepdim=True)
            runs, tokens = [], None
            for rep in range(repeats + 1):  # the first pass is a warm-up
                extra = cache.get_seq_length() - a.decode_context  # back to the prefilled prompts
                if extra > 0:
                    cache.crop(-extra)
                nxt, gen = first, []
                t = time.perf_counter()
                for _ in range(steps):
                    o = model(input_ids=nxt, cache=cache, use_cache=True)
                    nxt = o.logits[:, -1].argmax(-1, keepdim=True)
                    gen.append(nxt)
                dt = time.perf_counter() - t
                g = torch.cat(gen, 1)
                if tokens is None:
                    tokens = g
                elif not torch.equal(tokens, g):
                    print("warning: decode passes generated different tokens", file=sys.stderr)
                if rep > 0:
                    runs.append(batch * steps / dt)
        return statistics.median(runs), runs

    trials = {}
    if a.experts_impl == "auto":
        for name in impls:
            try:
                set_impl(name)
                trials[name] = decode(1, 4, 1)[0]
            except Exception as e:  # not offered by this version / on the CPU
                trials[name] = f"unavailable: {type(e).__name__}: {e}"
        usable = {k: v for k, v in trials.items() if isinstance(v, float)}
        chosen = max(usable, key=usable.get)
    else:
        chosen = a.experts_impl
    set_impl(chosen)

    res = {
        "engine": "transformers",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "layers": a.layers,
        "vocab": a.vocab,
        "dtype": "bf16",
        "attention": "eager",
        "experts_implementation": chosen,
        "experts_impl_trials_decode_b1_tokens_per_s": trials,
        "params": n_params,
        "build_s": build_s,
    }

    ids = torch.tensor([prompt_ids(0, a.prefill, a.vocab)])
    runs = []
    with torch.inference_mode():
        for rep in range(a.repeats + 1):
            t = time.perf_counter()
            model(input_ids=ids, use_cache=True, logits_to_keep=1)
            dt = time.perf_counter() - t
            if rep > 0:
                runs.append(a.prefill / dt)
    res["prefill"] = {"tokens": a.prefill, "tokens_per_s": statistics.median(runs), "runs_tokens_per_s": runs}

    res["decode"] = []
    for b in [int(x) for x in a.decode_batch.split(",")]:
        tps, runs = decode(b, a.decode_steps, a.repeats)
        res["decode"].append({"batch": b, "context": a.decode_context, "steps": a.decode_steps, "tokens_per_s": tps,
                              "runs_tokens_per_s": runs})
    text = json.dumps(res, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
