#!/usr/bin/env python3
"""FP8 block-quantised copies of the fixture models, with goldens from transformers.

tools/gen_fixtures.sh runs it (in the pinned venv) right after tools/gen_fixtures.py:
it reads the float fixtures in tests/fixtures/ and writes, for each entry of FP8 below,

  tests/fixtures/<name>/model.safetensors   every linear layer of attention and of the
      MLP blocks (routed experts, shared experts, dense MLPs; lm_head where the entry
      says so) as F8_E4M3 codes plus "<key>_scale_inv" (one scale per weight_block_size
      block, edge blocks partial), the quantisation DeepSeek-V3 and Qwen3-*-FP8 ship:
      scale = amax(|block|) / 448, code = e4m3(w / scale) (round to nearest even,
      clamped to +-448); router gates, norms and embeddings stay float, as in those
      releases
  tests/fixtures/<name>/config.json         the source config + quantization_config
      {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic, weight_block_size}
  tests/fixtures/<name>/golden/             MLP-block goldens, whole-model logits and
      greedy tokens from transformers run (fp32, eager) on the exactly dequantised
      weights: code * scale as an f32 product, loaded through a float checkpoint with
      the same keys, so transformers' own key conversion applies

and appends a manifest.json record per fixture (marked "quantized_from").  The C++ side
then runs every model / MLP / multi-rank suite on them unchanged.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_fixtures as gf  # noqa: E402

E4M3_MAX = 448.0

# name, source fixture, block [rows, cols], scale dtype, extra options.
#  - deepseek_v3_fp8: DeepSeek-V3's format (f32 scales) with 16 x 16 blocks, so the
#    tiny matrices hold several blocks and partial edges (q_lora 24, kv_a 20 rows).
#  - qwen3_moe_fp8: Qwen3-FP8's config as released (128 x 128, bf16 scales, lm_head and
#    the routers listed in modules_to_not_convert): every matrix is one partial block.
#  - deepseek_v2_fp8: DeepSeek-V2's layout (no q-LoRA), lm_head quantised as well.
#  - mixtral_fused_fp8: the stacked expert layout (experts.gate_up_proj [E, 2I, H] with
#    gate_up_proj_scale_inv [E, ceil(2I/16), ceil(H/16)]; I = 24, so one block holds
#    the last gate rows and the first up rows).
FP8 = [
    dict(name="deepseek_v3_fp8", source="deepseek_v3", block=[16, 16], scale_dtype=torch.float32),
    dict(name="qwen3_moe_fp8", source="qwen3_moe", block=[128, 128], scale_dtype=torch.bfloat16,
         not_convert=["lm_head", "mlp.gate"]),
    dict(name="deepseek_v2_fp8", source="deepseek_v2", block=[16, 16], scale_dtype=torch.float32,
         lm_head=True),
    dict(name="mixtral_fused_fp8", source="mixtral_fused", spec_of="mixtral", block=[16, 16],
         scale_dtype=torch.float32),
    # For `moe-ep serve` end to end (tests/serve/serve_e2e.sh): the chat fixture with its
    # tokenizer and template; no goldens (the script checks the server against `generate`).
    dict(name="chat_deepseek_v3_fp8", source="chat_deepseek_v3", block=[16, 16], scale_dtype=torch.float32,
         chat=True),
]


def quantize(w: torch.Tensor, bn: int, bk: int, scale_dtype):
    """w f32 [..., n, k] -> (codes e4m3, scale_inv [..., ceil(n/bn), ceil(k/bk)], dequantised f32)."""
    n, k = w.shape[-2:]
    sn, sk = math.ceil(n / bn), math.ceil(k / bk)
    lead = w.shape[:-2]
    wp = torch.zeros(*lead, sn * bn, sk * bk, dtype=torch.float32)
    wp[..., :n, :k] = w
    blocks = wp.reshape(*lead, sn, bn, sk, bk)
    amax = blocks.abs().amax(dim=(-3, -1))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).to(scale_dtype)
    s = scale.float()[..., :, None, :, None]
    codes = (blocks / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    deq = (codes.float() * s).reshape(*lead, sn * bn, sk * bk)[..., :n, :k].contiguous()
    codes = codes.reshape(*lead, sn * bn, sk * bk)[..., :n, :k].contiguous()
    return codes, scale.contiguous(), deq


def quantized(key: str, t: torch.Tensor, lm_head: bool) -> bool:
    if t.dim() < 2 or "norm" in key or "embed_tokens" in key:
        return False
    if key == "lm_head.weight":
        return lm_head
    # Routers (mlp.gate / block_sparse_moe.gate) and Qwen2's shared_expert_gate stay float.
    if key.endswith(".gate.weight") or key.endswith("shared_expert_gate.weight"):
        return False
    return ".self_attn." in key or ".mlp." in key or ".block_sparse_moe." in key


def make_one(entry, by_name) -> dict:
    name, src = entry["name"], gf.OUT / entry["source"]
    bn, bk = entry["block"]
    d = gf.OUT / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    out, deq, n_quant = {}, {}, 0
    for k, t in tensors.items():
        if quantized(k, t, entry.get("lm_head", False)):
            codes, scale, dq = quantize(t.float(), bn, bk, entry["scale_dtype"])
            out[k] = codes
            out[k + "_scale_inv"] = scale  # "<module>.weight_scale_inv"; fused: "<key>_scale_inv"
            deq[k] = dq
            n_quant += 1
        else:
            out[k] = t
            deq[k] = t.float() if t.is_floating_point() else t
    gf.write_st(d / "model.safetensors", out)
    cfg = json.loads((src / "config.json").read_text())
    qc = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic", weight_block_size=[bn, bk])
    if entry.get("not_convert"):
        qc["modules_to_not_convert"] = entry["not_convert"]
    cfg["quantization_config"] = qc
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.copy(src / "generation_config.json", d / "generation_config.json")
    if entry.get("chat"):
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(src / f, d / f)
        return None

    # transformers on the exactly dequantised weights: a float checkpoint with the same keys.
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src_cfg = json.loads((src / "config.json").read_text())
        src_cfg["dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(src_cfg))
        shutil.copy(src / "generation_config.json", tmp / "generation_config.json")
        gf.write_st(tmp / "model.safetensors", deq)
        model = gf.load_saved(tmp)
    spec = dict(by_name[entry.get("spec_of", entry["source"])])
    spec["name"] = name
    gold = d / "golden"
    gold.mkdir()
    cfg_obj = model.config
    cases, notes = gf.mlp_goldens(name, spec, cfg_obj, model, gold)
    min_margin = gf.logits_and_greedy(name, spec, cfg_obj, model, gold)
    src_rec = next(r for r in json.loads((gf.OUT / "manifest.json").read_text()) if r["name"] == entry["source"])
    rec = dict(src_rec)
    for k in ("twin",):
        rec.pop(k, None)
    rec.update(
        name=name,
        weights_dtype="float8_e4m3fn",
        sharded=False,
        files=["model.safetensors"],
        quantized_from=entry["source"],
        cases=cases,
        logits=f"{name}/golden/logits.safetensors",
        greedy=f"{name}/golden/greedy.json",
        transformers_version=transformers.__version__,
        torch_version=torch.__version__,
        notes=[
            f"FP8 copy of '{entry['source']}': {n_quant} tensors as F8_E4M3 with "
            f"{'bf16' if entry['scale_dtype'] == torch.bfloat16 else 'f32'} weight_scale_inv per "
            f"[{bn}, {bk}] block (edge blocks partial); scale = amax/448, code = e4m3(w/scale)"
            + ("; lm_head quantised too" if entry.get("lm_head") else "")
            + (f"; modules_to_not_convert {entry['not_convert']}" if entry.get("not_convert") else ""),
            "goldens: transformers fp32 eager on the exactly dequantised weights (code * scale, f32 product)",
            f"greedy: smallest top-1/top-2 logit gap over all steps = {min_margin:.3g}",
        ] + notes,
    )
    return rec


def main() -> int:
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    by_name = {s["name"]: s for s in gf.SPECS}
    manifest_path = gf.OUT / "manifest.json"
    records = [r for r in json.loads(manifest_path.read_text()) if "quantized_from" not in r]
    for entry in FP8:
        print(f"== {entry['name']} (fp8 of {entry['source']})", flush=True)
        rec = make_one(entry, by_name)
        if rec is not None:
            records.append(rec)
    gf.write_json(manifest_path, records)
    for path in gf.OUT.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    print(f"wrote {len(FP8)} FP8 fixtures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
