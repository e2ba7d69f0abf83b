#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/tokenizer/: GGUF files that hold only a tokenizer (the
`tokenizer.ggml.*` metadata, no tensors), written the way llama.cpp's convert_hf_to_gguf.py
writes them from a Hugging Face model directory, and the goldens of Hugging Face
`tokenizers` (the reference) on the source tokenizer.json for the text corpus.
tests/test_gguf_tokenizer.cpp turns each GGUF back into tokenizer.json text
(loader/gguf/gguf_tokenizer.h) and checks it encodes and decodes like the source.

    python3 -m venv /tmp/gguf-venv
    /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy==2.4.6 tokenizers==0.23.3
    /tmp/gguf-venv/bin/python tools/gen_gguf_tokenizer_fixtures.py

Deterministic: two runs give the same bytes.

What convert_hf_to_gguf.py does is re-implemented here with `tokenizers` alone (no
transformers, torch or sentencepiece):
  * byte-level BPE ("gpt2"): get_vocab_base (every id below vocab_size, holes as
    [PAD<i>] UNUSED; added tokens CONTROL when special or when they look special
    (<|...|>, <｜...｜>), else USER_DEFINED with U+2581 turned into spaces) and
    _set_vocab_gpt2 (merges from tokenizer.json, spaces inside a merge part as U+0120).
    tokenizer.ggml.pre is named per fixture: the script cannot use the converter's
    hash of a probe text, since these vocabularies are our own.
  * SentencePiece BPE ("llama"): _create_vocab_sentencepiece. The source has no
    tokenizer.model, so the scores are the ones a SentencePiece BPE model gives its
    pieces (minus the merge rank that creates a piece; single characters below every
    merge); tokenizer_config's added_tokens_decoder marks <unk>/<s>/</s> CONTROL, as
    the converter does. No merges are written: the reader derives them from the scores
    (transformers' generate_merges); the script checks that those derived merges give
    `tokenizers` the same ids as the source merges on the whole corpus.
  * deepseek_llm / gpt2: the small Llama-3-style vocabulary with another family's
    published normalizer and pre-tokenizer swapped into its tokenizer.json (no
    ignore_merges), to cover those tokenizer.ggml.pre values too.
  * gguf.SpecialVocab: special token ids from tokenizer_config's <typ>_token strings
    found in tokenizer.json's added_tokens, then config.json's <typ>_token_id for the
    missing ones; add_<typ>_token from the TemplateProcessing post-processor, overridden
    by tokenizer_config's add_<typ>_token booleans; the chat template.
"""
import json
from pathlib import Path

import gguf
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "gguf" / "tokenizer"

# The Llama-3-style source (ignore_merges) has no tokenizer_config.json; this is the
# part of Meta-Llama-3's that SpecialVocab reads (no chat template: the GGUF tests the
# "absent" case).
LLAMA3_CONFIG = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}


def char_class(ranges):
    # Written from code points: the published class holds look-alikes (U+1F7D, U+2126,
    # U+212A, ...) that a copy through NFC text would silently fold.
    return "[" + "".join(chr(a) if a == b else f"{chr(a)}-{chr(b)}" for a, b in ranges) + "]"


DS_LLM_LETTERS = char_class([
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA), (0x1BC, 0x1BF),
    (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x376), (0x377, 0x377), (0x37B, 0x37D), (0x37F, 0x37F),
    (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C), (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481), (0x48A, 0x52F),
    (0x531, 0x556), (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D), (0x1F20, 0x1F45),
    (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B), (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D),
    (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE), (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3),
    (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107),
    (0x210A, 0x2113), (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126), (0x2128, 0x2128),
    (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149), (0x214E, 0x214E),
    (0x2183, 0x2183), (0x2184, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2, 0x2CF2),
    (0x2CF3, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E),
    (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F),
    (0x104B0, 0x104D3), (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943)])


def split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}

# Two more pre-tokenizers on the small Llama-3-style vocabulary: the source tokenizer.json
# with the published family's normalizer and pre_tokenizer swapped in (and no ignore_merges).
# deepseek-llm-7b-base's (DeepSeek-V2's is the same):
DEEPSEEK_LLM = {
    "normalizer": {"type": "Sequence", "normalizers": []},
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        split("[\r\n]"), split("\\s?" + DS_LLM_LETTERS + "+"),
        split("\\s?" + char_class([(0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E), (0x2018, 0x201F),
                                    (0x3000, 0x3002)]) + "+"),
        split("\\s+$"), split(char_class([(0x4E00, 0x9FA5), (0x800, 0x4E00), (0xAC00, 0xD7FF)]) + "+"),
        {"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
}
# GPT-2's: the ByteLevel pre-tokenizer with its own regex, no post-processor.
GPT2 = {
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
}

FIXTURES = [
    # name, tokenizer.json (path, or (path, changes)), tokenizer_config.json (path or dict), config.json,
    # model, pre
    ("qwen3", "chat_qwen3/tokenizer.json", "chat_qwen3/tokenizer_config.json", "chat_qwen3/config.json",
     "gpt2", "qwen2"),
    ("deepseek_v3", "chat_deepseek_v3/tokenizer.json", "chat_deepseek_v3/tokenizer_config.json",
     "chat_deepseek_v3/config.json", "gpt2", "deepseek-v3"),
    ("llama3", "text/tokenizers/ignore_merges/tokenizer.json", LLAMA3_CONFIG, None, "gpt2", "llama-bpe"),
    ("mixtral", "text/tokenizers/mixtral/tokenizer.json", "text/tokenizers/mixtral/tokenizer_config.json", None,
     "llama", "default"),
    ("deepseek_llm", ("text/tokenizers/ignore_merges/tokenizer.json", DEEPSEEK_LLM), LLAMA3_CONFIG, None,
     "gpt2", "deepseek-llm"),
    ("gpt2", ("text/tokenizers/ignore_merges/tokenizer.json", GPT2), {"eos_token": "<|end_of_text|>"}, None,
     "gpt2", "gpt-2"),
]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def looks_special(t):
    # convert_hf_to_gguf.py does_token_look_special
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (t.startswith("<|") and t.endswith("|>"))
            or (t.startswith("<｜") and t.endswith("｜>")) or (t.startswith("<unused") and t.endswith(">")))


def vocab_gpt2(tok, tj, config):
    """get_vocab_base: tokens and types in id order."""
    vocab = tok.get_vocab(with_added_tokens=True)
    vocab_size = config.get("vocab_size", len(vocab))
    assert max(vocab.values()) < vocab_size
    reverse = {i: t for t, i in vocab.items()}
    added = tok.get_added_tokens_decoder()
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        t = reverse[i]
        if i in added:
            if not added[i].normalized:  # the converter's decode(encode(t)) round trip
                t = tok.decode(tok.encode(t, add_special_tokens=False).ids, skip_special_tokens=False)
            if added[i].special or looks_special(t):
                types.append(CONTROL)
            else:
                t = t.replace("\u2581", " ")
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(t)
    merges = [" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in part) for part in pair)
              for pair in tj["model"]["merges"]]
    return tokens, types, merges


def vocab_spm(tj, tok_config):
    """_create_vocab_sentencepiece, with the SentencePiece BPE scores the pieces would have."""
    vocab = tj["model"]["vocab"]
    merges = tj["model"]["merges"]
    rank = {}
    for r, (a, b) in enumerate(merges):
        rank.setdefault(a + b, r)
    reverse = {i: t for t, i in vocab.items()}
    tokens, scores, types = [], [], []
    for i in range(len(reverse)):
        t = reverse[i]
        if t == tj["model"]["unk_token"]:
            kind, score = UNKNOWN, 0.0
        elif t in ("<s>", "</s>"):
            kind, score = CONTROL, 0.0
        elif t.startswith("<0x") and len(t) == 6:
            kind, score = BYTE, 0.0
        else:
            kind, score = NORMAL, -float(rank[t]) if t in rank else -float(len(merges) + i)
        tokens.append(t)
        scores.append(score)
        types.append(kind)
    for sid, data in tok_config.get("added_tokens_decoder", {}).items():
        i, t = int(sid), data["content"]
        if data.get("special") or looks_special(t):
            types[i] = CONTROL
        else:
            t = t.replace("\u2581", " ")
            types[i] = USER_DEFINED
        tokens[i] = t
        scores[i] = -1000.0
    return tokens, scores, types


def derive_merges(tokens, scores, types):
    """transformers' generate_merges over the NORMAL pieces (what the C++ reader does)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    out = []
    for i, piece in enumerate(tokens):
        if types[i] != NORMAL:
            continue
        local = [(piece[:k], piece[k:], scores[i]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        out.extend(local)
    out.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [[a, b] for a, b, _ in out]


def special_vocab(tj, tok_config, config, n_vocab):
    """gguf.SpecialVocab: ids and add_<typ>_token flags."""
    ids, add = {}, {}
    types = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
    post = tj.get("post_processor") or {}
    for proc in post.get("processors", [post]):
        if proc.get("type") != "TemplateProcessing":
            continue
        single = proc.get("single", [])
        if len(single) > 1:
            first = single[0].get("SpecialToken", {}).get("id")
            last = single[-1].get("SpecialToken", {}).get("id")
            if first:
                add["bos"] = first in (tok_config.get("bos_token"), tok_config.get("cls_token"))
            if last:
                add["eos"] = last == tok_config.get("eos_token")

    def content(v):
        return v if isinstance(v, str) else v.get("content") if isinstance(v, dict) else None

    def set_id(typ, tid):
        if isinstance(tid, int) and typ not in ids and (n_vocab is None or tid < n_vocab):
            ids[typ] = tid

    for typ in types:
        if isinstance(tok_config.get(f"add_{typ}_token"), bool):
            add[typ] = tok_config[f"add_{typ}_token"]
        c = content(tok_config.get(f"{typ}_token"))
        if c is not None:
            set_id(typ, next((a["id"] for a in tj.get("added_tokens", []) if a["content"] == c), None))
    for typ in types:
        set_id(typ, config.get(f"{typ}_token_id"))
    return ids, add


def load_json(p):
    return json.loads((FIX / p).read_text(encoding="utf-8")) if isinstance(p, str) else dict(p or {})


def source_tokenizer(tok_path):
    """The source tokenizer.json as a dict, with a variant's changes applied."""
    path, changes = tok_path if isinstance(tok_path, tuple) else (tok_path, {})
    tj = load_json(path)
    tj.update(changes)
    if changes:
        tj["model"] = dict(tj["model"], ignore_merges=False)
    return tj


def write_fixture(name, tok_path, cfg_path, config_path, model, pre):
    w = gguf.GGUFWriter(str(OUT / f"{name}.gguf"), "llama")
    result = add_tokenizer(w, tok_path, cfg_path, config_path, model, pre)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return result


def add_tokenizer(w, tok_path, cfg_path, config_path, model, pre):
    """Writes the tokenizer.* metadata of a tokenizer.json into GGUF writer w, as
    convert_hf_to_gguf.py does (also used by tools/gen_gguf_model_fixtures.py)."""
    tj = source_tokenizer(tok_path)
    tok_config = load_json(cfg_path)
    config = load_json(config_path)
    tok = Tokenizer.from_str(json.dumps(tj))
    if model == "gpt2":
        tokens, types, merges = vocab_gpt2(tok, tj, config)
        scores = None
    else:
        tokens, scores, types = vocab_spm(tj, tok_config)
        merges = None
        check_derived_merges(tj, tokens, scores, types)
    ids, add = special_vocab(tj, tok_config, config, None if model == "gpt2" else len(tokens))
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if scores is not None:
        w.add_token_scores(scores)
    w.add_token_types(types)
    if merges:
        w.add_token_merges(merges)
    for typ, tid in ids.items():
        getattr(w, f"add_{typ}_token_id", lambda _: None)(tid)  # SpecialVocab skips types without a key
    for typ, value in add.items():
        getattr(w, f"add_add_{typ}_token", lambda _: None)(value)
    if tok_config.get("chat_template") is not None:
        w.add_chat_template(tok_config["chat_template"])
    return tok, tokens, types, ids


def check_derived_merges(tj, tokens, scores, types):
    derived = dict(tj, model=dict(tj["model"], merges=derive_merges(tokens, scores, types)))
    a, b = Tokenizer.from_str(json.dumps(tj)), Tokenizer.from_str(json.dumps(derived))
    for text in corpus_texts():
        assert a.encode(text).ids == b.encode(text).ids, f"derived merges differ on {text!r}"


def corpus_texts():
    corpus = json.loads((FIX / "text" / "corpus.json").read_text(encoding="utf-8"))
    return corpus + ["\n".join(corpus)]


def golden_of(name, tok, tokens, types, ids, cfg_path):
    special_ids = {i for i, t in enumerate(types) if t in (CONTROL, UNKNOWN)}
    cases = []
    for text in corpus_texts():
        with_special = tok.encode(text).ids
        cases.append({
            "text": text,
            "ids": with_special,
            "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
            "decoded": tok.decode(with_special, skip_special_tokens=False),
            # llama.cpp's control tokens are the GGUF's CONTROL and UNKNOWN ones (the
            # converter makes <|fim_prefix|> and the like control even where HF has them
            # non-special): skipping exactly those, decoded by `tokenizers`.
            "decoded_skip": tok.decode([i for i in with_special if i not in special_ids],
                                       skip_special_tokens=False),
        })
    names = {"bos": "bos_id", "eos": "eos_id", "unk": "unk_id", "pad": "pad_id"}
    return {
        "gguf": f"{name}.gguf",
        "template_source": cfg_path if isinstance(cfg_path, str) else None,
        "n_tokens": len(tokens),
        "special": {v: ids.get(k, -1) for k, v in names.items()},
        "cases": cases,
    }


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    golden = {"tokenizers_version": __import__("tokenizers").__version__, "fixtures": {}}
    for name, tok_path, cfg_path, config_path, model, pre in FIXTURES:
        tok, tokens, types, ids = write_fixture(name, tok_path, cfg_path, config_path, model, pre)
        golden["fixtures"][name] = golden_of(name, tok, tokens, types, ids, cfg_path)
    (OUT / "golden.json").write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n",
                                     encoding="utf-8")


if __name__ == "__main__":
    main()
