#!/usr/bin/env python3
"""Writes tests/fixtures/hf_int4/: a tiny Qwen3-MoE in each Hugging Face int4 format moe-ep
reads (loader/hf_int4/hf_int4.h), each beside a "<name>-ref" directory holding the same model
with every int4 weight dequantised, in f32, by the format's own package.

The references (run in a venv outside the repository, e.g.
  python3 -m venv /tmp/int4-venv && /tmp/int4-venv/bin/pip install torch numpy safetensors \
      compressed-tensors accelerate
  pip download --no-deps autoawq==0.2.9 && tar xzf autoawq-0.2.9.tar.gz     (sdist only: its
      CUDA kernels are a separate package; we import two pure-torch modules from it)
  pip download --no-deps --no-binary :all: gptqmodel==7.7.0 && tar xzf gptqmodel-7.7.0.tar.gz
      (sdist only, for its GPTQ packer and dequantiser; see import_gptqmodel)
  /tmp/int4-venv/bin/python tools/gen_hf_int4_fixtures.py --autoawq-src autoawq-0.2.9 \
      --gptqmodel-src gptqmodel-7.7.0)
  * compressed-tensors (0.20.1): pack_to_int32 packs weight_packed and weight_zero_point,
    PackedQuantizationCompressor.decompress dequantises (scales given in f32, so the
    products are exact).
  * AutoAWQ (0.2.9): WQLinear_GEMM.from_linear packs qweight / qzeros (its GEMM order),
    awq.utils.packing_utils.dequantize_gemm dequantises (f32 scales).
  * GPTQ with desc_act (act order): GPTQModel (7.7.0) packs it, TorchLinear.pack_original
    with a scattered g_idx, and dequantises it, TorchLinear.dequantize_weight (f32 scales);
    its v2 qzeros are written as v1 (its convert_gptq_v2_to_v1_format: the word - 0x11111111).
  * GPTQ without act order: the GPTQ tensors come from AutoAWQ's own GPTQ (ExLlama v1) packer,
    awq.utils.packing_utils.unpack_reorder_pack (AWQ -> qweight [K/8, N] packed along k,
    qzeros of zero - 1 packed along n), and the reference is dequantize_gemm of the AWQ
    tensors it came from. This script also packs GPTQ with numpy following GPTQModel's
    documented layout (pack along k; v1 qzeros = v2 word - 0x11111111, the word-wide
    subtraction of its convert_gptq_v2_to_v1_format) and asserts both agree bit for bit;
    gptq_v2 files are the v1 words + 0x11111111 (convert_gptq_v1_to_v2_format).
Codes, zero points and scales are random (seeded), zero points over all of [0, 15] so the
v1 borrows occur; scales are f16 (GPTQ, AWQ) or bf16 (compressed-tensors) values.
"""
import argparse
import contextlib
import json
import os
import shutil
import sys
import types

import numpy as np
import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf_int4")

H, I, E, L, V, NH, NKV, HD = 64, 32, 4, 2, 64, 4, 2, 16


def base_config():
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
        "hidden_act": "silu", "hidden_size": H, "intermediate_size": 2 * H, "moe_intermediate_size": I,
        "num_experts": E, "num_experts_per_tok": 2, "norm_topk_prob": True, "num_hidden_layers": L,
        "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "vocab_size": V,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "torch_dtype": "float16",
    }


def linears(i_size=I):
    """(module, out N, in K) of every linear the formats quantise (experts' intermediate i_size)."""
    out = []
    for l in range(L):
        a = f"model.layers.{l}.self_attn."
        out += [(a + "q_proj", NH * HD, H), (a + "k_proj", NKV * HD, H), (a + "v_proj", NKV * HD, H),
                (a + "o_proj", H, NH * HD)]
        for e in range(E):
            p = f"model.layers.{l}.mlp.experts.{e}."
            out += [(p + "gate_proj", i_size, H), (p + "up_proj", i_size, H), (p + "down_proj", H, i_size)]
    return out


def float_tensors(rng):
    t = {"model.embed_tokens.weight": rng.normal(0, 0.5, (V, H)), "model.norm.weight": 1 + rng.normal(0, 0.1, H),
         "lm_head.weight": rng.normal(0, 0.2, (V, H))}
    for l in range(L):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, H)
        t[p + "post_attention_layernorm.weight"] = 1 + rng.normal(0, 0.1, H)
        t[p + "self_attn.q_norm.weight"] = 1 + rng.normal(0, 0.1, HD)
        t[p + "self_attn.k_norm.weight"] = 1 + rng.normal(0, 0.1, HD)
        t[p + "mlp.gate.weight"] = rng.normal(0, 0.5, (E, H))
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in t.items()}


def random_quant(rng, n, k, group, sym, scale_dtype):
    """Codes q [n, k] in [0, 15], zero points z [n, G], scales s [n, G] (scale_dtype values)."""
    g = 1 if group < 0 else -(-k // group)
    q = rng.integers(0, 16, (n, k))
    z = np.full((n, g), 8) if sym else rng.integers(0, 16, (n, g))
    s = torch.tensor(rng.uniform(0.004, 0.012, (n, g)), dtype=torch.float32).to(scale_dtype)
    return q, z, s


def group_index(k, group):
    return np.zeros(k, dtype=np.int64) if group < 0 else np.arange(k) // group


# ---- AutoAWQ, imported from its sdist without its package __init__ (which pulls datasets,
# transformers model classes and the CUDA kernels) --------------------------------------------
def import_awq(src):
    for name in ("awq", "awq.modules", "awq.modules.linear", "awq.utils"):
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(src, *name.split("."))]
        sys.modules[name] = m
    from awq.modules.linear.gemm import WQLinear_GEMM  # noqa: E402
    from awq.utils import packing_utils  # noqa: E402
    return WQLinear_GEMM, packing_utils


def awq_group(group, k):
    """AutoAWQ needs k % group == 0: one group of a k shorter than the group (or per channel) is k."""
    return k if group < 0 or group >= k else group


def awq_pack(awq, q, z, s, group):
    """AutoAWQ's own packer: a linear whose weight is (q - z) * s exactly, from_linear."""
    WQLinear_GEMM, _ = awq
    n, k = q.shape
    gi = group_index(k, group)
    s32 = s.to(torch.float32)
    w = (torch.tensor(q - z[:, gi], dtype=torch.float32) * s32[:, gi])
    lin = torch.nn.Linear(k, n, bias=False)
    lin.weight.data = w
    ql = WQLinear_GEMM.from_linear(lin, 4, awq_group(group, k), scales=s32.t().contiguous(),
                                   zeros=torch.tensor(z.T.copy(), dtype=torch.int32))
    return ql.qweight, ql.qzeros, ql.scales


def awq_dequant(awq, qweight, qzeros, scales, group, k):
    _, pu = awq
    w = pu.dequantize_gemm(qweight, qzeros, scales.to(torch.float32), 4, awq_group(group, k))
    return w.t().contiguous().to(torch.float32)  # [N, K]


# ---- GPTQ ------------------------------------------------------------------------------------
def numpy_gptq_v1(q, z):
    """GPTQModel's layout in numpy: qweight [K/8, N] along k; qzeros [G, N/8] along n, v1."""
    n, k = q.shape
    qt = q.T.astype(np.uint64)  # [K, N]
    qweight = np.zeros((k // 8, n), dtype=np.uint64)
    for j in range(8):
        qweight |= qt[j::8] << np.uint64(4 * j)
    zt = z.T.astype(np.uint64)  # [G, N]
    qzeros = np.zeros((zt.shape[0], n // 8), dtype=np.uint64)
    for j in range(8):
        qzeros |= zt[:, j::8] << np.uint64(4 * j)
    qzeros = (qzeros - np.uint64(0x11111111)) % np.uint64(1 << 32)  # v2 -> v1, word-wide
    return qweight.astype(np.uint32).view(np.int32), qzeros.astype(np.uint32).view(np.int32)


def gptq_from_awq(awq, q, z, s, group, v2):
    _, pu = awq
    n, k = q.shape
    qweight_a, qzeros_a, scales_a = awq_pack(awq, q, z, s, group)
    qweight, qzeros = pu.unpack_reorder_pack(qweight_a, qzeros_a, 4)  # AutoAWQ's GPTQ (ExLlama) packer
    nq, nz = numpy_gptq_v1(q, z)
    assert np.array_equal(qweight.numpy(), nq), "AutoAWQ's and GPTQModel-layout qweight differ"
    assert np.array_equal(qzeros.numpy(), nz), "AutoAWQ's and GPTQModel-layout v1 qzeros differ"
    if v2:
        qzeros = torch.tensor(((nz.view(np.uint32).astype(np.uint64) + 0x11111111) % (1 << 32)).astype(np.uint32)
                              .view(np.int32))
    ref = awq_dequant(awq, qweight_a, qzeros_a, scales_a, group, k)
    return {"qweight": qweight.contiguous(), "qzeros": qzeros.contiguous(), "scales": s.t().contiguous().to(torch.float16),
            "g_idx": torch.tensor(group_index(k, group), dtype=torch.int32)}, ref


# ---- GPTQModel, imported from its sdist: its package __init__ and the modules around its
# quantised linears pull its CUDA kernels, datasets, model definitions and logging/device
# helpers (pcre, logbar, threadpoolctl, ...). The packer and the dequantiser use none of
# them, so those imports are stood in by placeholders that accept anything; the code that
# packs and dequantises is the package's own, unchanged. -------------------------------------
class _Placeholder:
    """Any attribute, call or iteration of a stood-in import: another placeholder, or nothing."""

    def __init__(self, name="placeholder"):
        self._name = name

    def __getattr__(self, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return _Placeholder(f"{self._name}.{k}")

    def __call__(self, *a, **k):
        return _Placeholder(f"{self._name}()")

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __hash__(self):
        return hash(self._name)

    def __eq__(self, other):
        return isinstance(other, _Placeholder) and other._name == self._name


class _PlaceholderType(type):
    """A stood-in class (enums like DEVICE, FORMAT; base classes): usable in annotations."""

    def __getattr__(cls, k):
        if k.startswith("__"):
            raise AttributeError(k)
        return _Placeholder(f"{cls.__name__}.{k}")

    def __iter__(cls):
        return iter(())


def import_gptqmodel(src):
    def package(name):
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(src, *name.split("."))]
        sys.modules[name] = m

    def stand_in(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)

        def missing(k):
            if k.startswith("__"):
                raise AttributeError(k)
            return _PlaceholderType(k, (), {"__init__": lambda self, *a, **kw: None,
                                            "__getattr__": lambda self, a: _Placeholder(a)})
        m.__getattr__ = missing
        sys.modules[name] = m

    class Threads:
        @staticmethod
        def threadpool_limits(*a, **k):
            return contextlib.nullcontext()

    for name in ("gptqmodel", "gptqmodel.nn_modules", "gptqmodel.utils", "gptqmodel.models", "gptqmodel.adapter"):
        package(name)
    stand_in("gptqmodel.adapter.adapter")
    stand_in("gptqmodel.models._const", HAS_CUDA=False)
    stand_in("gptqmodel.quantization")
    stand_in("gptqmodel.utils.backend")
    stand_in("gptqmodel.utils.logger", setup_logger=lambda *a, **k: _Placeholder("log"))
    stand_in("gptqmodel.utils.safe", THREADPOOLCTL=Threads())
    stand_in("gptqmodel.utils.torch", torch_compile=lambda f, **k: f)
    stand_in("gptqmodel.utils.rocm", IS_ROCM=False)
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear  # noqa: E402
    return TorchLinear


def gptq_desc_act(torch_linear, q, z, s, group, g_idx):
    """GPTQModel's packing of a weight whose column j is (q - z[g_idx[j]]) * s[g_idx[j]] (act order),
    and its dequantisation of what it packed."""
    n, k = q.shape
    gi = torch.tensor(g_idx, dtype=torch.int32)
    s32 = s.to(torch.float32)
    lin = torch.nn.Linear(k, n, bias=False)
    lin.weight.data = torch.tensor(q - z[:, g_idx], dtype=torch.float32) * s32[:, g_idx]
    m = torch_linear(bits=4, group_size=group, sym=False, desc_act=True, in_features=k, out_features=n, bias=False)
    m.pack_original(lin, s32, torch.tensor(z, dtype=torch.int32), gi)
    qzeros_v2 = m.qzeros.clone()
    m.post_init()
    m.scales = m.scales.to(torch.float32)  # as written (f16 values), products exact in f32
    ref = m.dequantize_weight().t().contiguous().to(torch.float32)  # [N, K]
    qzeros_v1 = ((qzeros_v2.numpy().view(np.uint32).astype(np.uint64) - 0x11111111) % (1 << 32)).astype(np.uint32)
    return {"qweight": m.qweight.contiguous(), "qzeros": torch.tensor(qzeros_v1.view(np.int32)),
            "scales": s.t().contiguous().to(torch.float16), "g_idx": gi}, ref


def act_order(rng, k, group):
    """A desc_act g_idx: the columns quantised in a random order, group i the i-th run of `group`."""
    rank = np.empty(k, dtype=np.int64)
    rank[rng.permutation(k)] = np.arange(k)
    return rank // group


# ---- compressed-tensors ----------------------------------------------------------------------
def ct_pack(q, z, s, group, sym):
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    n, k = q.shape
    qs = torch.tensor(q - 8, dtype=torch.int8)  # signed codes
    zp = torch.tensor(z - 8, dtype=torch.int8)
    t = {"weight_packed": pack_to_int32(qs, 4), "weight_scale": s.contiguous(),
         "weight_shape": torch.tensor([n, k], dtype=torch.int64)}
    if not sym:
        t["weight_zero_point"] = pack_to_int32(zp, 4, packed_dim=0).contiguous()
    args = QuantizationArgs(num_bits=4, type="int", symmetric=sym, strategy="group" if group > 0 else "channel",
                            group_size=group if group > 0 else None)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    sd = dict(t)
    sd["weight_scale"] = s.to(torch.float32)  # exact products
    ref = PackedQuantizationCompressor.decompress(sd, scheme)["weight"].to(torch.float32)
    return t, ref, args


VARIANTS = [
    # name, method, group, sym, extra
    ("gptq_sym_g32", "gptq", 32, True, {}),
    ("gptq_asym_g64", "gptq", 64, False, {}),
    ("gptq_v2_asym_channel", "gptq", -1, False, {"v2": True}),
    ("awq_g32", "awq", 32, False, {}),
    ("ct_sym_g32", "compressed-tensors", 32, True, {}),
    ("ct_asym_channel", "compressed-tensors", -1, False, {}),
    # desc_act: every linear in a scattered act order (q/k/v one order, as GPTQ quantises them
    # on one input, and gate/up of an expert one); experts of intermediate 64, so down's order
    # moves neurons between its two groups
    ("gptq_desc_act_asym_g32", "gptq", 32, False, {"desc_act": True, "moe_intermediate_size": 64}),
]


def quant_config(method, group, sym, extra, args):
    if method == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": sym,
                "desc_act": bool(extra.get("desc_act")),
                "static_groups": False, "true_sequential": True, "lm_head": False,
                "checkpoint_format": "gptq_v2" if extra.get("v2") else "gptq"}
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "version": "gemm", "zero_point": True,
                "modules_to_not_convert": ["gate"]}
    w = json.loads(args.model_dump_json())
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": None,
                                          "output_activations": None}},
            "ignore": ["lm_head", "re:.*mlp\\.gate$"]}


def write_dir(path, config, tensors):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, os.path.join(path, "model.safetensors"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--autoawq-src", required=True, help="the unpacked autoawq-0.2.9 sdist")
    ap.add_argument("--gptqmodel-src", required=True, help="the unpacked gptqmodel-7.7.0 sdist")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args()
    awq = import_awq(os.path.abspath(a.autoawq_src))
    torch_linear = import_gptqmodel(os.path.abspath(a.gptqmodel_src))
    for name, *_ in VARIANTS:  # README.md stays
        for d in (name, name + "-ref"):
            shutil.rmtree(os.path.join(a.out, d), ignore_errors=True)
    manifest = {}
    for vi, (name, method, group, sym, extra) in enumerate(VARIANTS):
        rng = np.random.default_rng(1000 + vi)
        floats = float_tensors(rng)
        qt, rt = dict(floats), dict(floats)
        args = None
        sdt = torch.bfloat16 if method == "compressed-tensors" else torch.float16
        i_size = extra.get("moe_intermediate_size", I)
        orders = {}  # desc_act: one g_idx per input the linears share
        for m, n, k in linears(i_size):
            q, z, s = random_quant(rng, n, k, group, sym, sdt)
            gi = group_index(k, group)
            if extra.get("desc_act"):
                shared = m.rsplit(".", 1)[0] + (".qkv" if m.endswith(("q_proj", "k_proj", "v_proj")) else
                                                ".gate_up" if m.endswith(("gate_proj", "up_proj")) else "." + m)
                gi = orders.setdefault(shared, act_order(rng, k, group))
                t, ref = gptq_desc_act(torch_linear, q, z, s, group, gi)
            elif method == "gptq":
                t, ref = gptq_from_awq(awq, q, z, s, group, extra.get("v2", False))
            elif method == "awq":
                qw, qz, sc = awq_pack(awq, q, z, s, group)
                t = {"qweight": qw, "qzeros": qz, "scales": sc.to(torch.float16)}
                ref = awq_dequant(awq, qw, qz, sc, group, k)
            else:
                t, ref, args = ct_pack(q, z, s, group, sym)
            # Our own statement of the value, for the assertion only: (q - z) * s in f64.
            want = ((q - z[:, gi]) * s.to(torch.float64).numpy()[:, gi]).astype(np.float32)
            assert np.array_equal(ref.numpy(), want), f"{name} {m}: reference dequantisation is not (q - z) * s"
            for suffix, v in t.items():
                qt[f"{m}.{suffix}"] = v
            rt[f"{m}.weight"] = ref
        cfg = dict(base_config(), moe_intermediate_size=i_size)
        write_dir(os.path.join(a.out, name + "-ref"), cfg, rt)
        cfg["quantization_config"] = quant_config(method, group, sym, extra, args)
        write_dir(os.path.join(a.out, name), cfg, qt)
        manifest[name] = {"method": method, "group_size": group, "sym": sym, **extra}
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump({"generator": "tools/gen_hf_int4_fixtures.py", "torch": torch.__version__,
                   "compressed_tensors": __import__("compressed_tensors").__version__, "autoawq": "0.2.9 (sdist)",
                   "gptqmodel": "7.7.0 (sdist)",
                   "variants": manifest}, f, indent=2)


if __name__ == "__main__":
    main()
