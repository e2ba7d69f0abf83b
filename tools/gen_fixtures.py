#!/usr/bin/env python3
"""Generate the golden MoE fixtures in tests/fixtures/ from Hugging Face transformers.

Run through tools/gen_fixtures.sh (which pins the versions).  The C++ engine never
imports Python; this script only (re)creates the committed reference data.

For every fixture it:
  1. builds a tiny random-weight model from a transformers config class
     (AutoModelForCausalLM.from_config, fp32, eval mode, eager attention and eager
     experts), re-initialises every weight with a deterministic O(1) init and rounds
     every parameter to a bfloat16-representable value;
  2. saves it with save_pretrained(safe_serialization=True) (per-expert Hub layout,
     or the fused in-memory layout with save_original_format=False);
  3. reloads the saved directory with from_pretrained and checks that the weights
     round-trip bit-exactly and nothing is missing or unexpected;
  4. writes per-layer MLP goldens, routing dumps, whole-model logits and greedy
     generations computed with the reloaded model;
  5. checks each MoE block against an independent float64 re-implementation of the
     routing rules documented in tests/fixtures/README.md;
  6. reruns the MLP cases in bfloat16 and checks that routing does not change (MoE
     inputs are drawn so that every top-k decision has a clear margin).

Fused fixtures (FUSED) reuse a twin's weights; their goldens are recomputed from the
fused checkpoint, compared with the twin's, and the manifest points at the twin's files.

Everything is seeded; the output does not depend on the wall clock or on hashing.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy
import safetensors
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures"

TOKEN_COUNTS = [0, 1, 7, 33]
PROMPT_LENGTHS = [1, 5, 9]
NEW_TOKENS = 16
# Bias std relative to the std of the selection scores it is added to.
BIAS_REL_STD = 0.75
ROUTER_GAIN = 2.0  # router logits get std ~2 for unit-variance inputs
SHARED_GATE_GAIN = 2.0  # Qwen2-MoE shared_expert_gate logit std ~2
LM_HEAD_GAIN = 2.0

COMMON = dict(max_position_embeddings=64, initializer_range=0.02)

# ---------------------------------------------------------------------------
# Fixture specifications
# ---------------------------------------------------------------------------
SPECS = [
    dict(
        name="qwen3_moe",
        seed=101,
        save_dtype=torch.bfloat16,  # like real Qwen3 checkpoints; halves the largest fixture
        config=dict(
            model_type="qwen3_moe", vocab_size=112, hidden_size=40, intermediate_size=56,
            moe_intermediate_size=24, num_experts=60, num_experts_per_tok=4, norm_topk_prob=True,
            num_hidden_layers=3, mlp_only_layers=[1], decoder_sparse_step=1, hidden_act="silu",
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=False,
        ),
        notes=["weights stored as bfloat16 (bf16-exact values; load as float32 to reproduce the goldens)",
               "layer 1 is a dense MLP (mlp_only_layers=[1], intermediate_size 56)",
               "head_dim 8 is set explicitly: num_attention_heads*head_dim (32) != hidden_size (40)",
               "Qwen3 attention has per-head RMSNorm on q and k (q_norm/k_norm)"],
    ),
    dict(
        name="qwen2_moe",
        seed=102,
        shard_bytes=48 * 1024,
        config=dict(
            model_type="qwen2_moe", vocab_size=100, hidden_size=32, intermediate_size=48,
            moe_intermediate_size=20, num_experts=6, num_experts_per_tok=2, norm_topk_prob=False,
            shared_expert_intermediate_size=40, num_hidden_layers=2, decoder_sparse_step=1,
            hidden_act="silu", num_attention_heads=4, num_key_value_heads=2, qkv_bias=True,
            tie_word_embeddings=False,
        ),
        notes=["saved sharded (model-0000N-of-0000M.safetensors + model.safetensors.index.json)",
               "shared expert output is multiplied by sigmoid(shared_expert_gate(x)) (a [1, H] linear)",
               "attention q/k/v projections have biases (qkv_bias=True)"],
    ),
    dict(
        name="mixtral",
        seed=103,
        config=dict(
            model_type="mixtral", vocab_size=128, hidden_size=32, intermediate_size=24,
            num_local_experts=8, num_experts_per_tok=2, hidden_act="silu", num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        ),
        notes=["Hub key names: block_sparse_moe.gate / block_sparse_moe.experts.N.w1 (gate), "
               "w3 (up), w2 (down); transformers renames block_sparse_moe -> mlp in memory"],
    ),
    dict(
        name="mixtral_gelu",
        seed=104,
        save_dtype=torch.bfloat16,
        config=dict(
            model_type="mixtral", vocab_size=96, hidden_size=32, intermediate_size=24,
            num_local_experts=5, num_experts_per_tok=1, hidden_act="gelu", num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        ),
        notes=["weights stored as bfloat16 (every value is bf16-exact, so the fp32 goldens are exact "
               "for these weights); load with dtype float32 to reproduce them",
               "hidden_act 'gelu' is the exact erf GELU",
               "top_k 1: Mixtral still renormalises, so every routing weight is exactly 1.0"],
    ),
    dict(
        name="deepseek_v3",
        seed=105,
        bias="deepseek_v3",
        config=dict(
            model_type="deepseek_v3", vocab_size=128, hidden_size=32, intermediate_size=48,
            moe_intermediate_size=16, n_routed_experts=32, num_experts_per_tok=8, n_group=4,
            topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1,
            first_k_dense_replace=1, num_hidden_layers=3, hidden_act="silu",
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
            qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, num_nextn_predict_layers=0,
            tie_word_embeddings=False,
            # Hub DeepSeek-V3 configs carry these; transformers ignores them (its V3 router is
            # always sigmoid + noaux_tc) but an engine reading config.json should see them.
            topk_method="noaux_tc", scoring_func="sigmoid",
        ),
        notes=["layer 0 is dense (first_k_dense_replace=1, intermediate_size 48)",
               "mlp.gate.e_score_correction_bias is random (not the zero default)",
               "MLA attention with q_lora_rank 24; rope_interleave=true (config default)"],
    ),
    dict(
        name="deepseek_v2",
        seed=106,
        config=dict(
            model_type="deepseek_v2", vocab_size=120, hidden_size=32, intermediate_size=48,
            moe_intermediate_size=16, n_routed_experts=12, num_experts_per_tok=3, n_group=3,
            topk_group=2, topk_method="group_limited_greedy", norm_topk_prob=False,
            routed_scaling_factor=1.5, n_shared_experts=2, first_k_dense_replace=1,
            num_hidden_layers=3, hidden_act="gelu_pytorch_tanh", num_attention_heads=4,
            num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8,
            qk_rope_head_dim=4, v_head_dim=8, tie_word_embeddings=False,
            scoring_func="softmax",  # Hub DeepSeek-V2 configs carry it; transformers ignores it
        ),
        notes=["layer 0 is dense (first_k_dense_replace=1, intermediate_size 48)",
               "hidden_act gelu_pytorch_tanh (tanh-approximated GELU) in every MLP",
               "MLA attention without q LoRA (q_lora_rank=None -> plain q_proj)"],
    ),
    dict(
        name="ernie4_5_moe",
        seed=107,
        bias="ernie4_5_moe",
        config=dict(
            model_type="ernie4_5_moe", vocab_size=96, hidden_size=32, intermediate_size=48,
            moe_intermediate_size=16, moe_num_experts=12, moe_k=3, moe_num_shared_experts=1,
            moe_layer_start_index=1, moe_layer_interval=1, num_hidden_layers=3, hidden_act="silu",
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        ),
        notes=["layer 0 is dense (moe_layer_start_index=1)",
               "mlp.moe_statics.e_score_correction_bias [1, E] is random (not the zero default)",
               "tie_word_embeddings=true: there is no lm_head.weight, logits use embed_tokens.weight",
               "ERNIE attention uses interleaved (even/odd pair) RoPE"],
    ),
]

# Extra fixtures with the same weights as a twin, saved in transformers' fused in-memory
# layout (save_pretrained(..., save_original_format=False)).
FUSED = [
    dict(name="mixtral_fused", twin="mixtral"),
    # qwen3_moe (60 experts) would double the largest fixture; qwen2_moe's fused keys have the
    # same naming (mlp.experts.gate_up_proj / down_proj) plus shared expert + sharding.
    dict(name="qwen2_moe_fused", twin="qwen2_moe"),
]


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
def bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def is_bf16_exact(t: torch.Tensor) -> bool:
    t = t.to(torch.float32)
    return bool(torch.equal(t, bf16(t)))


def randn(gen: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def model_type_of(spec) -> str:
    return spec["config"]["model_type"]


def make_config(spec):
    kw = dict(COMMON)
    kw.update(spec["config"])
    model_type = kw.pop("model_type")
    return AutoConfig.for_model(model_type, **kw)


def init_weights(model, gen: torch.Generator) -> None:
    """Deterministic O(1) init; every value is bf16-exact."""
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            module_name = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
            if name.endswith("e_score_correction_bias"):
                new = torch.zeros(p.shape)  # set later from measured score statistics
            elif "norm" in module_name and name.endswith(".weight"):
                new = 1.0 + 0.1 * randn(gen, *p.shape)
            elif name.endswith(".bias"):
                new = 0.1 * randn(gen, *p.shape)
            elif "embed_tokens" in name:
                new = randn(gen, *p.shape)
            elif name.endswith("mlp.gate.weight"):  # router [E, H]
                new = ROUTER_GAIN * randn(gen, *p.shape) / math.sqrt(p.shape[-1])
            elif name.endswith("shared_expert_gate.weight"):
                new = SHARED_GATE_GAIN * randn(gen, *p.shape) / math.sqrt(p.shape[-1])
            elif name == "lm_head.weight":
                new = LM_HEAD_GAIN * randn(gen, *p.shape) / math.sqrt(p.shape[-1])
            elif p.dim() >= 2:  # nn.Linear [out, in] and fused experts [E, out, in]: fan_in last
                new = randn(gen, *p.shape) / math.sqrt(p.shape[-1])
            else:
                raise RuntimeError(f"no init rule for {name} {tuple(p.shape)}")
            p.copy_(bf16(new))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()


def moe_layers(model):
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts")]


def bias_tensor(mlp):
    gate = mlp.gate
    if hasattr(gate, "moe_statics"):
        return gate.moe_statics.e_score_correction_bias
    return gate.e_score_correction_bias


def set_random_bias(model, family: str, gen: torch.Generator) -> list[str]:
    """Random e_score_correction_bias with std = BIAS_REL_STD * std(selection scores)."""
    notes = []
    with torch.no_grad():
        for L in moe_layers(model):
            mlp = model.model.layers[L].mlp
            W = mlp.gate.weight.float()
            x = bf16(randn(gen, 256, W.shape[1]))
            logits = x @ W.T
            scores = logits.sigmoid() if family == "deepseek_v3" else logits.softmax(-1)
            std = float(scores.std())
            b = bias_tensor(mlp)
            b.copy_(bf16(BIAS_REL_STD * std * randn(gen, *b.shape)))
            notes.append(f"layer {L}: score std {std:.3f}, bias std {float(b.std()):.3f}")
    return notes


def load_dir_tensors(d: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def saved_dtypes(d: Path) -> set[str]:
    dts = set()
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():
                dts.add(str(fh.get_slice(k).get_dtype()))
    return dts


# ---------------------------------------------------------------------------
# Independent float64 reference of the MoE blocks (checks the README's rules)
# ---------------------------------------------------------------------------
def act64(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "silu":
        return x * torch.sigmoid(x)
    if name == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    if name == "gelu_pytorch_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    raise ValueError(name)


def dense64(mlp, x, act):
    g = x @ mlp.gate_proj.weight.double().T
    u = x @ mlp.up_proj.weight.double().T
    return (act64(act, g) * u) @ mlp.down_proj.weight.double().T


def kth_gap(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Per row: k-th largest minus (k+1)-th largest (inf where undefined / masked)."""
    T, n = scores.shape
    if k >= n:
        return torch.full((T,), math.inf, dtype=torch.float64)
    s = scores.sort(dim=-1, descending=True).values
    gap = s[:, k - 1] - s[:, k]
    return torch.where(torch.isfinite(gap), gap, torch.full_like(gap, math.inf))


# Routing-decision margins (see README "Routing margins").  A token is only used as an
# MLP-golden input if every top-k decision it takes (expert choice and group choice) has at
# least this gap, so that bf16 rounding in an engine's router cannot flip the selection.
#   "logit": softmax routers; the gap is measured between router logits (same order as probs)
#   "score": biased routers (sigmoid+bias, softmax+bias); gap between selection scores
MARGIN_UNIT = {"qwen2_moe": "logit", "qwen3_moe": "logit", "mixtral": "logit",
               "deepseek_v2": "logit", "deepseek_v3": "score", "ernie4_5_moe": "score"}
MARGIN_MIN = {"logit": 0.05, "score": 0.01}


def ref_moe(family: str, cfg, mlp, x32: torch.Tensor):
    """Float64 re-implementation of the transformers MoE block.

    Returns (output [T,H], ids [T,k] sorted ascending, weights [T,k] in the same order,
    per-token routing margin [T] in the family's MARGIN_UNIT).
    """
    x = x32.double()
    T = x.shape[0]
    act = cfg.hidden_act
    logits = x @ mlp.gate.weight.double().T
    E = logits.shape[1]
    k = cfg.num_experts_per_tok
    if family in ("qwen2_moe", "qwen3_moe", "mixtral"):
        p = logits.softmax(-1)
        ids = p.topk(k, dim=-1).indices
        w = p.gather(1, ids)
        if family == "mixtral" or cfg.norm_topk_prob:
            w = w / w.sum(-1, keepdim=True)
        margin = kth_gap(logits, k)
    elif family == "ernie4_5_moe":
        p = logits.softmax(-1)
        choice = p + bias_tensor(mlp).double().reshape(1, E)
        ids = choice.topk(k, dim=-1).indices
        w = p.gather(1, ids)
        w = w / w.sum(-1, keepdim=True).clamp(min=cfg.moe_norm_min)
        margin = kth_gap(choice, k)
    elif family == "deepseek_v3":
        s = logits.sigmoid()
        choice = s + bias_tensor(mlp).double().reshape(1, E)
        G = cfg.n_group
        gscore = choice.view(T, G, E // G).topk(2, dim=-1).values.sum(-1)
        gsel = gscore.topk(cfg.topk_group, dim=-1).indices
        gmask = torch.zeros(T, G, dtype=torch.bool)
        gmask.scatter_(1, gsel, True)
        emask = gmask.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
        choice = choice.masked_fill(~emask, -math.inf)
        ids = choice.topk(k, dim=-1).indices
        w = s.gather(1, ids)
        if cfg.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * cfg.routed_scaling_factor
        margin = torch.minimum(kth_gap(choice, k), kth_gap(gscore, cfg.topk_group))
    elif family == "deepseek_v2":
        p = logits.softmax(-1)
        choice, lchoice = p, logits
        margin = torch.full((T,), math.inf, dtype=torch.float64)
        if cfg.topk_method == "group_limited_greedy":
            G = cfg.n_group
            gscore = p.view(T, G, E // G).max(dim=-1).values
            gsel = gscore.topk(cfg.topk_group, dim=-1).indices
            gmask = torch.zeros(T, G, dtype=torch.bool)
            gmask.scatter_(1, gsel, True)
            emask = gmask.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
            choice = p.masked_fill(~emask, 0.0)
            lchoice = logits.masked_fill(~emask, -math.inf)
            margin = kth_gap(logits.view(T, G, E // G).max(dim=-1).values, cfg.topk_group)
        ids = choice.topk(k, dim=-1).indices
        w = p.gather(1, ids) * cfg.routed_scaling_factor  # norm_topk_prob is never applied
        margin = torch.minimum(margin, kth_gap(lchoice, k))
    else:
        raise ValueError(family)

    gu = mlp.experts.gate_up_proj.double()  # [E, 2I, H]: rows [0, I) gate, [I, 2I) up
    I = gu.shape[1] // 2
    down = mlp.experts.down_proj.double()  # [E, H, I]
    out = torch.zeros_like(x)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            h = act64(act, gu[e, :I] @ x[t]) * (gu[e, I:] @ x[t])
            out[t] += w[t, j] * (down[e] @ h)

    if family == "qwen2_moe":
        sg = torch.sigmoid(x @ mlp.shared_expert_gate.weight.double().T)  # [T, 1]
        out = out + sg * dense64(mlp.shared_expert, x, act)
    elif family in ("deepseek_v3", "deepseek_v2", "ernie4_5_moe"):
        if getattr(mlp, "shared_experts", None) is not None:
            out = out + dense64(mlp.shared_experts, x, act)

    order = ids.sort(dim=-1)
    return out, order.values, w.gather(1, order.indices), margin


# ---------------------------------------------------------------------------
# Golden computation
# ---------------------------------------------------------------------------
def run_mlp(mlp, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = mlp(x.unsqueeze(0))  # the model calls it with [B, S, H]
    if isinstance(out, tuple):
        out = out[0]
    return out.reshape(x.shape[0], x.shape[1]).float().contiguous()


def run_gate(mlp, x: torch.Tensor):
    with torch.no_grad():
        logits, weights, ids = mlp.gate(x)
    order = ids.sort(dim=-1)
    return logits.float(), order.values.long(), weights.float().gather(1, order.indices)


def mlp_input(seed: int, L: int, T: int, H: int, family=None, cfg=None, mlp=None):
    """Random bf16-exact [T, H] input (std 1).  For MoE blocks, tokens whose routing margin
    is below MARGIN_MIN are redrawn (deterministically) until all pass."""
    gen = torch.Generator().manual_seed(seed * 10007 + L * 101 + T)
    x = bf16(randn(gen, T, H))
    if mlp is None or not hasattr(mlp, "experts") or T == 0:
        return x
    thr = MARGIN_MIN[MARGIN_UNIT[family]]
    for _ in range(1000):
        bad = ref_moe(family, cfg, mlp, x)[3] < thr
        if not bad.any():
            return x
        x[bad] = bf16(randn(gen, int(bad.sum()), H))
    raise RuntimeError(f"could not draw well-separated routing inputs for layer {L}")


def _is_flat(v) -> bool:
    if isinstance(v, list):
        return all(not isinstance(e, (list, dict)) for e in v)
    if isinstance(v, dict):
        return all(not isinstance(e, (list, dict)) or (isinstance(e, list) and _is_flat(e)) for e in v.values())
    return True


def _fmt(v, indent: int) -> str:
    """JSON with one line per flat list / flat object (readable diffs, compact files)."""
    if _is_flat(v) and not (isinstance(v, dict) and len(v) > 12):
        return json.dumps(v)
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(v, list):
        return "[\n" + ",\n".join(inner + _fmt(e, indent + 1) for e in v) + "\n" + pad + "]"
    items = [f"{inner}{json.dumps(k)}: {_fmt(e, indent + 1)}" for k, e in v.items()]
    return "{\n" + ",\n".join(items) + "\n" + pad + "}"


def write_json(path: Path, obj) -> None:
    text = _fmt(obj, 0) + "\n"
    assert json.loads(text) == obj
    path.write_text(text)


def write_st(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def mlp_goldens(name, spec, cfg, model, gold: Path):
    family = model_type_of(spec)
    H = cfg.hidden_size
    cases, notes = [], []
    skipped_t0 = []
    routing = {}
    for L, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        kind = "moe" if hasattr(mlp, "experts") else "dense"
        for T in TOKEN_COUNTS:
            x = mlp_input(spec["seed"], L, T, H, family, cfg, mlp)
            try:
                y = run_mlp(mlp, x)
            except Exception as exc:  # noqa: BLE001 - T=0 may be unsupported by a family
                if T == 0:
                    skipped_t0.append(f"L{L}: {type(exc).__name__}: {exc}")
                    continue
                raise
            stem = f"L{L}_T{T}"
            write_st(gold / f"{stem}_in.safetensors", {"hidden_states": x})
            write_st(gold / f"{stem}_out.safetensors", {"hidden_states": y})
            case = dict(layer=L, tokens=T, kind=kind,
                        input=f"{name}/golden/{stem}_in.safetensors",
                        output=f"{name}/golden/{stem}_out.safetensors")
            if kind == "moe":
                logits, ids, w = run_gate(mlp, x)
                ref_out, ref_ids, ref_w, margin = ref_moe(family, cfg, mlp, x)
                margin = float(margin.min()) if T else math.inf
                if not torch.equal(ids, ref_ids):
                    raise AssertionError(f"{name} L{L} T{T}: routing differs from the reference")
                if T and not torch.allclose(y.double(), ref_out, atol=2e-5, rtol=1e-4):
                    err = float((y.double() - ref_out).abs().max())
                    raise AssertionError(f"{name} L{L} T{T}: output differs from reference by {err}")
                if T and not torch.allclose(w.double(), ref_w, atol=1e-6, rtol=1e-5):
                    raise AssertionError(f"{name} L{L} T{T}: routing weights differ from reference")
                routing[f"{stem}.router_logits"] = logits
                routing[f"{stem}.topk_ids"] = ids
                routing[f"{stem}.topk_weights"] = w
                case["routing"] = f"{name}/golden/routing.safetensors"
                case["routing_prefix"] = f"{stem}."
                case["experts_hit"] = int(ids.unique().numel())
                case["route_margin"] = None if math.isinf(margin) else float(f"{margin:.4g}")
                case["route_margin_unit"] = MARGIN_UNIT[family]
            else:
                if T:
                    ref = dense64(mlp, x.double(), cfg.hidden_act)
                    assert torch.allclose(y.double(), ref, atol=2e-5, rtol=1e-4), f"{name} L{L} dense"
            cases.append(case)
    if routing:
        write_st(gold / "routing.safetensors", routing)
    if skipped_t0:
        notes.append("T=0 skipped (transformers fails): " + "; ".join(skipped_t0))
    return cases, notes


def prompts_for(spec, vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(spec["seed"] * 7919 + 1)
    ids = torch.zeros(len(PROMPT_LENGTHS), max(PROMPT_LENGTHS), dtype=torch.int64)
    for i, n in enumerate(PROMPT_LENGTHS):
        ids[i, :n] = torch.randint(1, vocab, (n,), generator=gen)
    return ids


def logits_and_greedy(name, spec, cfg, model, gold: Path):
    V = cfg.vocab_size
    ids = prompts_for(spec, V)
    lengths = torch.tensor(PROMPT_LENGTHS, dtype=torch.int64)
    logits = torch.zeros(ids.shape[0], ids.shape[1], V, dtype=torch.float32)
    greedy = []
    gcfg = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=0,
                            eos_token_id=None, bos_token_id=None, pad_token_id=0,
                            num_beams=1, use_cache=True)
    model.generation_config = gcfg
    min_margin = math.inf
    for i, n in enumerate(PROMPT_LENGTHS):
        prompt = ids[i:i + 1, :n]
        with torch.no_grad():
            logits[i, :n] = model(prompt).logits[0].float()
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                 generation_config=gcfg)
        gen = out[0, n:].tolist()
        assert len(gen) == NEW_TOKENS, (name, len(gen))
        # Cross-check the cached generation with full recomputation (no cache).
        margins = []
        seq = prompt
        with torch.no_grad():
            for tok in gen:
                last = model(seq, use_cache=False).logits[0, -1].double()
                top2 = last.topk(2).values
                assert int(last.argmax()) == tok, f"{name}: cached/uncached greedy mismatch"
                margins.append(float(f"{float(top2[0] - top2[1]):.4g}"))
                seq = torch.cat([seq, torch.tensor([[tok]])], dim=1)
        min_margin = min(min_margin, min(margins))
        greedy.append(dict(input_ids=prompt[0].tolist(), generated=gen, top2_margin=margins))
    write_st(gold / "logits.safetensors", {"input_ids": ids, "lengths": lengths, "logits": logits})
    write_json(gold / "greedy.json", dict(max_new_tokens=NEW_TOKENS, do_sample=False,
                                          eos_token_id=None, prompts=greedy))
    return min_margin


# ---------------------------------------------------------------------------
# Build / save / reload
# ---------------------------------------------------------------------------
def build_model(spec):
    torch.manual_seed(spec["seed"])
    cfg = make_config(spec)
    model = AutoModelForCausalLM.from_config(
        cfg, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    model.eval()
    gen = torch.Generator().manual_seed(spec["seed"])
    init_weights(model, gen)
    bias_notes = set_random_bias(model, model_type_of(spec), gen) if spec.get("bias") else []
    return cfg, model, bias_notes


def load_saved(d: Path):
    model, info = AutoModelForCausalLM.from_pretrained(
        str(d), dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"} if isinstance(info, dict) else {}
    if bad or (isinstance(info, dict) and info.get("error_msgs")):
        raise AssertionError(f"{d.name}: loading info not clean: {info}")
    model.eval()
    return model


def bf16_check(name: str, d: Path, cases) -> str:
    """Run the MLP cases through transformers in bfloat16: routing must not change."""
    model = AutoModelForCausalLM.from_pretrained(
        str(d), dtype=torch.bfloat16, attn_implementation="eager", experts_implementation="eager")
    model.eval()
    worst_abs, worst_rel = 0.0, 0.0
    for c in cases:
        if c["tokens"] == 0:
            continue
        x = load_file(str(OUT / c["input"]))["hidden_states"]
        y = load_file(str(OUT / c["output"]))["hidden_states"]
        mlp = model.model.layers[c["layer"]].mlp
        yb = run_mlp(mlp, x.to(torch.bfloat16))
        if c["kind"] == "moe":
            _, ids, _ = run_gate(mlp, x.to(torch.bfloat16))
            ref_ids = load_file(str(OUT / c["routing"]))[c["routing_prefix"] + "topk_ids"]
            assert torch.equal(ids, ref_ids), f"{name} L{c['layer']} T{c['tokens']}: bf16 routing flipped"
        err = float((yb - y).abs().max())
        worst_abs = max(worst_abs, err)
        worst_rel = max(worst_rel, err / float(y.abs().max()))
    return ("transformers run in bfloat16 on the MLP cases selects the same experts; "
            f"max |bf16 - fp32 golden| = {worst_abs:.3g} (max relative to the case's max |out|: {worst_rel:.3g})")


def check_layout(name: str, family: str, layout: str, keys: list[str]) -> None:
    fused = [k for k in keys if "gate_up_proj" in k]
    if layout == "fused":
        assert fused, f"{name}: expected fused keys"
        assert not any(".experts.0." in k for k in keys), f"{name}: unexpected per-expert keys"
    else:
        assert not fused, f"{name}: unexpected fused keys {fused[:2]}"
        probe = ".block_sparse_moe.experts.0.w1.weight" if family == "mixtral" else ".mlp.experts.0.gate_proj.weight"
        assert any(k.endswith(probe) for k in keys), f"{name}: no {probe} key"


def check_fused_against_twin(name: str, fused_dir: Path, twin_dir: Path) -> None:
    """gate_up_proj[e] == cat(gate_e, up_e) along rows; down_proj[e] == down_e."""
    a = load_dir_tensors(twin_dir)
    b = load_dir_tensors(fused_dir)
    n = 0
    for k, gu in b.items():
        if not k.endswith("mlp.experts.gate_up_proj"):
            continue
        prefix = k[: -len("mlp.experts.gate_up_proj")]
        down = b[prefix + "mlp.experts.down_proj"]
        for e in range(gu.shape[0]):
            if f"{prefix}mlp.experts.{e}.gate_proj.weight" in a:
                g = a[f"{prefix}mlp.experts.{e}.gate_proj.weight"]
                u = a[f"{prefix}mlp.experts.{e}.up_proj.weight"]
                d = a[f"{prefix}mlp.experts.{e}.down_proj.weight"]
            else:
                base = f"{prefix}block_sparse_moe.experts.{e}."
                g, u, d = a[base + "w1.weight"], a[base + "w3.weight"], a[base + "w2.weight"]
            assert torch.equal(gu[e], torch.cat([g, u], dim=0)), f"{name}: gate_up_proj[{e}] order"
            assert torch.equal(down[e], d), f"{name}: down_proj[{e}]"
            n += 1
    assert n > 0, name


def compare_golden_dirs(a: Path, b: Path, name: str) -> None:
    for f in sorted(a.glob("*.safetensors")):
        ta, tb = load_file(str(f)), load_file(str(b / f.name))
        for k in ta:
            if ta[k].is_floating_point():
                ok = torch.allclose(ta[k], tb[k], atol=1e-5, rtol=1e-5)
            else:
                ok = torch.equal(ta[k], tb[k])
            assert ok, f"{name}: {f.name}:{k} differs from twin"
    ga = json.loads((a / "greedy.json").read_text())["prompts"]
    gb = json.loads((b / "greedy.json").read_text())["prompts"]
    assert [p["generated"] for p in ga] == [p["generated"] for p in gb], f"{name}: greedy differs from twin"


def generate_one(spec, layout: str, twin: str | None):
    name = spec["name"]
    family = model_type_of(spec)
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    cfg, model, bias_notes = build_model(spec)

    save_dtype = spec.get("save_dtype", torch.float32)
    kwargs = dict(safe_serialization=True, save_original_format=(layout == "per_expert"))
    if spec.get("shard_bytes"):
        kwargs["max_shard_size"] = spec["shard_bytes"]
    if save_dtype != torch.float32:
        model.to(save_dtype)
        model.save_pretrained(str(d), **kwargs)
        model.to(torch.float32)
    else:
        model.save_pretrained(str(d), **kwargs)

    # Round trip: the saved directory must load cleanly and reproduce the weights bit-exactly.
    reloaded = load_saved(d)
    sd_a, sd_b = model.state_dict(), reloaded.state_dict()
    assert sd_a.keys() == sd_b.keys(), name
    for k in sd_a:
        assert torch.equal(sd_a[k].float(), sd_b[k].float()), f"{name}: {k} did not round-trip"
        assert is_bf16_exact(sd_a[k]), f"{name}: {k} not bf16-exact"

    files = sorted(p.name for p in d.glob("*.safetensors"))
    index = d / "model.safetensors.index.json"
    sharded = index.exists()
    if spec.get("shard_bytes"):
        assert sharded and len(files) >= 3, f"{name}: expected >= 3 shards, got {files}"
    keys = sorted(load_dir_tensors(d).keys())
    check_layout(name, family, layout, keys)
    dts = saved_dtypes(d)
    want = {"BF16"} if save_dtype == torch.bfloat16 else {"F32"}
    assert dts == want, f"{name}: saved dtypes {dts}"

    gold = d / "golden"
    gold.mkdir()
    cases, notes = mlp_goldens(name, spec, cfg, reloaded, gold)
    # The in-memory model must give bit-identical MLP outputs.
    for c in cases:
        x = load_file(str(OUT / c["input"]))["hidden_states"]
        y = load_file(str(OUT / c["output"]))["hidden_states"]
        y2 = run_mlp(model.model.layers[c["layer"]].mlp, x)
        # Not bit-exact: CPU gemv kernels may round differently depending on weight alignment.
        assert torch.allclose(y2, y, atol=1e-6, rtol=1e-6), f"{name}: reload changed output"
        assert is_bf16_exact(x)
    min_margin = logits_and_greedy(name, spec, cfg, reloaded, gold)
    bf16_note = bf16_check(name, d, cases)

    if twin is not None:
        # Same weights as the twin: its goldens were recomputed from the fused checkpoint
        # above and must agree; the manifest then points at the twin's golden files (one
        # copy on disk) and this fixture keeps only its weights and config.
        check_fused_against_twin(name, d, OUT / twin)
        compare_golden_dirs(OUT / twin / "golden", gold, name)
        shutil.rmtree(gold)
        swap = lambda v: v.replace(f"{name}/golden/", f"{twin}/golden/") if isinstance(v, str) else v
        cases = [{k: swap(v) for k, v in c.items()} for c in cases]

    n_experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    all_notes = list(spec.get("notes", []))
    if twin is not None:
        all_notes.insert(0, f"same weights as '{twin}', saved in transformers' fused in-memory layout via "
                            "save_pretrained(save_original_format=False); its golden paths point at "
                            f"'{twin}/golden/' (recomputed from this checkpoint, they agree to <1e-5)")
    all_notes += notes
    all_notes += [f"e_score_correction_bias {n}" for n in bias_notes]
    if not any(n.startswith("T=0 skipped") for n in notes):
        all_notes.append("T=0 cases run fine in transformers (empty [0, H] tensors)")
    all_notes.append(bf16_note)
    all_notes.append(f"greedy: smallest top-1/top-2 logit gap over all steps = {min_margin:.3g}")
    record = dict(
        name=name,
        model_type=family,
        layout=layout,
        weights_dtype="bfloat16" if save_dtype == torch.bfloat16 else "float32",
        sharded=sharded,
        files=files + (["model.safetensors.index.json"] if sharded else []),
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_hidden_layers,
        vocab_size=cfg.vocab_size,
        n_experts=n_experts,
        top_k=cfg.num_experts_per_tok,
        moe_layers=moe_layers(reloaded),
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        cases=cases,
        logits=f"{twin or name}/golden/logits.safetensors",
        greedy=f"{twin or name}/golden/greedy.json",
        notes=all_notes,
    )
    if twin is not None:
        record["twin"] = twin
    return record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="fixture names to (re)generate (manifest is still rewritten "
                                               "from all fixtures, so use only while iterating)")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"safetensors {safetensors.__version__}, numpy {numpy.__version__}")
    OUT.mkdir(parents=True, exist_ok=True)
    by_name = {s["name"]: s for s in SPECS}
    jobs = [(s, "per_expert", None) for s in SPECS]
    for f in FUSED:
        spec = dict(by_name[f["twin"]])
        spec["name"] = f["name"]
        jobs.append((spec, "fused", f["twin"]))
    records = []
    for spec, layout, twin in jobs:
        if args.only and spec["name"] not in args.only:
            continue
        print(f"== {spec['name']} ({layout})", flush=True)
        records.append(generate_one(spec, layout, twin))
    if args.only:
        print("--only given: manifest.json not rewritten")
        return 0
    write_json(OUT / "manifest.json", records)
    for path in OUT.rglob("*"):  # save_pretrained / save_file create 0600 files
        path.chmod(0o755 if path.is_dir() else 0o644)
    print(f"wrote {len(records)} fixtures to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
