#!/usr/bin/env python3
"""Generate the "talking" model fixtures tests/fixtures/chat_qwen3/ and chat_deepseek_v3/.

Run through tools/gen_text_fixtures.sh (after tools/gen_text_fixtures.py, whose trained
tokenizers these models use).  Each fixture is a tiny random-weight MoE model built with
tools/gen_fixtures.py's helpers (same init, bf16-exact weights, reload check), with
vocab_size = the fixture tokenizer's size, the tokenizer files and chat template copied in,
and greedy-generation goldens for chats and plain prompts computed with transformers:

  chat_<x>/config.json, generation_config.json, model.safetensors   save_pretrained
  chat_<x>/tokenizer.json, tokenizer_config.json                    from tests/fixtures/text/tokenizers/<x>/
  chat_<x>/golden/chat_greedy.json                                  prompts, ids, generations

The weights are random, so the generated text is gibberish; what matters is that every
step (template, tokenizer, model, greedy loop, EOS handling, detokenizer) is golden.  The
lm_head row of the EOS token is scaled (by the smallest factor that works) so that some,
but not all, of the greedy runs stop at EOS within max_new_tokens.

Everything is seeded; rerunning gives byte-identical files.
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer, GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_fixtures as gf  # noqa: E402  (model builders: build_model, load_saved, bf16, ...)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
TEXT_TOKENIZERS = FIXTURES / "text" / "tokenizers"

MAX_NEW_TOKENS = 12
EOS_SCALES = [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0]
MAX_DIR_BYTES = 1024 * 1024

SYS = "You are a concise assistant."
PLAIN = ["The quick brown fox", "def encode(self, text):\n    return", "混合专家模型把每个词元"]


def chats_for(family: str) -> list[dict]:
    think = {"enable_thinking": False} if family == "qwen3" else {}
    chats = [
        dict(name="system_user", messages=[{"role": "system", "content": SYS},
                                           {"role": "user", "content": "What is the capital of France?"}],
             kwargs=think),
        dict(name="user_only", messages=[{"role": "user", "content": "Hello!"}], kwargs=think),
        dict(name="multi_turn", messages=[{"role": "system", "content": SYS},
                                          {"role": "user", "content": "Hi, who are you?"},
                                          {"role": "assistant", "content": "I am a small test model."},
                                          {"role": "user", "content": "What can you do?"}], kwargs=think),
        dict(name="unicode", messages=[{"role": "user", "content": "東京の天気は？ 😀 Réponds en français."}],
             kwargs=think),
        dict(name="tool_result", messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call00001", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "call00001", "content": "21 degrees, sunny"}], kwargs=think),
    ]
    if family == "qwen3":
        chats.append(dict(name="thinking_on", messages=[{"role": "user", "content": "What is 17 * 3?"}],
                          kwargs={"enable_thinking": True}))
    return chats


def spec_like(name: str, base: str, seed: int, overrides: dict, notes: list[str]) -> dict:
    spec = copy.deepcopy(next(s for s in gf.SPECS if s["name"] == base))
    spec["name"] = name
    spec["seed"] = seed
    spec["save_dtype"] = torch.bfloat16
    spec["config"].update(overrides)
    spec["notes"] = notes
    return spec


def families() -> list[dict]:
    out = []
    from tokenizers import Tokenizer
    tq = Tokenizer.from_file(str(TEXT_TOKENIZERS / "qwen3" / "tokenizer.json"))
    im_end, eot = tq.token_to_id("<|im_end|>"), tq.token_to_id("<|endoftext|>")
    out.append(dict(
        family="qwen3", tokenizer="qwen3",
        spec=spec_like("chat_qwen3", "qwen3_moe", 201, dict(
            vocab_size=tq.get_vocab_size(with_added_tokens=True), num_experts=16, max_position_embeddings=1024,
            bos_token_id=eot, eos_token_id=im_end, pad_token_id=None), [
            "like qwen3_moe (q/k norm, dense layer 1, head_dim 8) with 16 experts and the qwen3 fixture "
            "tokenizer's vocabulary"]),
        # As Qwen3 ships it: config eos = <|im_end|>; generation_config eos = [<|im_end|>, <|endoftext|>].
        generation=dict(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot),
        scale_token=im_end))
    td = Tokenizer.from_file(str(TEXT_TOKENIZERS / "deepseek_v3" / "tokenizer.json"))
    bos, eos = td.token_to_id("<｜begin▁of▁sentence｜>"), td.token_to_id("<｜end▁of▁sentence｜>")
    out.append(dict(
        family="deepseek_v3", tokenizer="deepseek_v3",
        spec=spec_like("chat_deepseek_v3", "deepseek_v3", 202, dict(
            vocab_size=td.get_vocab_size(with_added_tokens=True), n_routed_experts=16, num_experts_per_tok=4,
            n_group=4, topk_group=2, max_position_embeddings=1024, bos_token_id=bos, eos_token_id=eos,
            pad_token_id=None), [
            "like deepseek_v3 (MLA with q-LoRA, dense layer 0, sigmoid router with random "
            "e_score_correction_bias, 4 groups pick 2, x2.5, 1 shared expert) with 16 experts, top-4, "
            "the deepseek_v3 fixture tokenizer's vocabulary, weights stored as bfloat16"]),
        generation=dict(bos_token_id=bos, eos_token_id=eos, pad_token_id=eos),
        scale_token=eos))
    return out


def generate(model, ids: list[int], gcfg: GenerationConfig, **kw) -> list[int]:
    """Greedy generate with `gcfg` as the model's generation config too: generate() fills the
    unset (None) fields of the config it is given from model.generation_config, so
    eos_token_id=None only takes effect this way."""
    x = torch.tensor([ids], dtype=torch.int64)
    saved = model.generation_config
    model.generation_config = gcfg
    try:
        with torch.no_grad():
            out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gcfg,
                                 max_new_tokens=MAX_NEW_TOKENS, **kw)
    finally:
        model.generation_config = saved
    return out[0, len(ids):].tolist()


def no_eos(gcfg: GenerationConfig) -> GenerationConfig:
    g = copy.deepcopy(gcfg)
    g.eos_token_id = None
    return g


def eos_set(gcfg: GenerationConfig) -> set[int]:
    e = gcfg.eos_token_id
    return set(e if isinstance(e, list) else [e]) if e is not None else set()


def margins(model, ids: list[int], gen: list[int]) -> list[float]:
    """Top-1 minus top-2 logit at every step, recomputed without the KV cache."""
    out = []
    seq = torch.tensor([ids], dtype=torch.int64)
    with torch.no_grad():
        for tok in gen:
            last = model(seq, use_cache=False).logits[0, -1].double()
            top2 = last.topk(2).values
            assert int(last.argmax()) == tok, "cached/uncached greedy mismatch"
            out.append(float(f"{float(top2[0] - top2[1]):.4g}"))
            seq = torch.cat([seq, torch.tensor([[tok]])], dim=1)
    return out


def prompts(ht, family: str) -> list[dict]:
    ps = []
    for c in chats_for(family):
        text = ht.apply_chat_template(c["messages"], add_generation_prompt=True, tokenize=False, **c["kwargs"])
        ids = ht.apply_chat_template(c["messages"], add_generation_prompt=True, tokenize=True, return_dict=False,
                                     **c["kwargs"])
        assert ids == ht(text, add_special_tokens=False)["input_ids"]
        ps.append(dict(name=c["name"], kind="chat", messages=c["messages"], add_generation_prompt=True,
                       kwargs=c["kwargs"], prompt_text=text, prompt_ids=ids))
    for i, text in enumerate(PLAIN):
        ps.append(dict(name=f"plain_{i}", kind="text", prompt_text=text, prompt_ids=ht(text)["input_ids"]))
    return ps


def scale_eos(model, row: int, scale: float) -> None:
    with torch.no_grad():
        w = model.lm_head.weight
        w[row] = gf.bf16(w[row] * scale)


def build_one(fam: dict) -> dict:
    spec = fam["spec"]
    name = spec["name"]
    print(f"== {name}", flush=True)
    d = FIXTURES / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    src = TEXT_TOKENIZERS / fam["tokenizer"]
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, d / f)
    cfg, model, bias_notes = gf.build_model(spec)
    gcfg = GenerationConfig(do_sample=False, **fam["generation"])
    model.generation_config = gcfg

    # The tokenizer as users load it from the model directory (config.json decides the class).
    cfg.save_pretrained(str(d))
    ht = AutoTokenizer.from_pretrained(str(d))
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(str(d / "tokenizer.json"))
    ps = prompts(ht, fam["family"])
    for p in ps:
        if p["kind"] == "text":
            assert p["prompt_ids"] == raw.encode(p["prompt_text"]).ids, p["name"]
        else:
            assert p["prompt_ids"] == raw.encode(p["prompt_text"], add_special_tokens=False).ids, p["name"]

    # Smallest EOS-row scale with which some, but not all, greedy runs stop at EOS.
    eos = eos_set(gcfg)
    orig = model.lm_head.weight[fam["scale_token"]].clone()
    chosen = None
    for s in EOS_SCALES:
        with torch.no_grad():
            model.lm_head.weight[fam["scale_token"]] = gf.bf16(orig * s)
        stops = sum(any(t in eos for t in generate(model, p["prompt_ids"], gcfg)) for p in ps)
        if 0 < stops < len(ps):
            chosen = s
            break
    assert chosen is not None, f"{name}: no EOS scale gives a mix of stopped / running generations"

    model.to(torch.bfloat16)
    model.save_pretrained(str(d), safe_serialization=True)
    model.to(torch.float32)
    reloaded = gf.load_saved(d)
    sd_a, sd_b = model.state_dict(), reloaded.state_dict()
    assert sd_a.keys() == sd_b.keys(), name
    for k in sd_a:
        assert torch.equal(sd_a[k].float(), sd_b[k].float()), f"{name}: {k} did not round-trip"
        assert gf.is_bf16_exact(sd_a[k]), f"{name}: {k} not bf16-exact"
    gsaved = reloaded.generation_config
    assert gsaved.eos_token_id == gcfg.eos_token_id and gsaved.do_sample is False, gsaved
    saved_cfg = json.loads((d / "config.json").read_text())
    assert saved_cfg["eos_token_id"] is not None, "config.json needs eos_token_id"

    records, min_margin = [], float("inf")
    for p in ps:
        gen = generate(reloaded, p["prompt_ids"], gsaved)
        full = generate(reloaded, p["prompt_ids"], no_eos(gsaved))
        masked = generate(reloaded, p["prompt_ids"], gsaved, min_new_tokens=MAX_NEW_TOKENS)
        assert len(full) == MAX_NEW_TOKENS and len(masked) == MAX_NEW_TOKENS, (name, p["name"], len(full))
        assert not (set(masked) & eos), (name, p["name"], masked)
        stop = next((i for i, t in enumerate(full) if t in eos), None)
        want = full if stop is None else full[:stop + 1]
        assert gen == want, (name, p["name"], gen, full)
        m = margins(reloaded, p["prompt_ids"], full)
        min_margin = min(min_margin, min(m))
        r = dict(p)
        r.update(
            generated=gen,
            stopped_at_eos=stop is not None,
            text=ht.decode(gen, skip_special_tokens=True),
            text_with_special=ht.decode(gen, skip_special_tokens=False),
            generated_no_eos=full,
            text_no_eos=ht.decode(full, skip_special_tokens=True),
            text_no_eos_with_special=ht.decode(full, skip_special_tokens=False),
            generated_min_new_tokens=masked,
            top2_margin=m,
        )
        records.append(r)
    n_stop = sum(r["stopped_at_eos"] for r in records)
    gold = d / "golden"
    gold.mkdir()
    golden = {
        "model": name,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "tokenizer_class": type(ht).__name__,
        "dtype": "float32 (weights stored as bf16-exact bfloat16, loaded as float32)",
        "max_new_tokens": MAX_NEW_TOKENS,
        "do_sample": False,
        "eos_token_id": gcfg.eos_token_id,
        "pad_token_id": gcfg.pad_token_id,
        "notes": [
            "prompt_ids: chats = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, "
            "**kwargs) (no special tokens added beyond the template's text); plain texts = tokenizer(text) "
            "(add_special_tokens=True: deepseek_v3 adds BOS, qwen3 adds nothing)",
            "generated: model.generate(prompt, max_new_tokens, generation_config from generation_config.json: "
            "do_sample=False, stops after the first id in eos_token_id, which is included); fp32, eager",
            "generated_no_eos: the same with eos_token_id=None (EOS is not a stop condition and may appear as an "
            "ordinary token; always max_new_tokens ids); generated is its prefix",
            "generated_min_new_tokens: the same with min_new_tokens=max_new_tokens (EOS logits set to -inf at "
            "every step, so EOS never appears and a different token is chosen where EOS was the argmax)",
            "text / text_with_special: tokenizer.decode(generated, skip_special_tokens=True / False); "
            "*_no_eos likewise for generated_no_eos",
            "top2_margin: top-1 minus top-2 logit at each step of generated_no_eos (uncached recomputation)",
            f"lm_head row {fam['scale_token']} (EOS) scaled by {chosen} (bf16-exact) so that {n_stop} of "
            f"{len(records)} runs stop at EOS",
            f"smallest top-1/top-2 logit gap over all steps: {min_margin:.3g}",
        ] + list(spec["notes"]) + [f"e_score_correction_bias {n}" for n in bias_notes],
        "prompts": records,
    }
    gf.write_json(gold / "chat_greedy.json", golden)
    for path in d.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    assert size < MAX_DIR_BYTES, f"{name}: {size} bytes"
    print(f"   {size} bytes, vocab {cfg.vocab_size}, EOS scale {chosen}, {n_stop}/{len(records)} stop at EOS, "
          f"min margin {min_margin:.3g}")
    return golden


def main() -> int:
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for fam in families():
        build_one(fam)
    return 0


if __name__ == "__main__":
    sys.exit(main())
