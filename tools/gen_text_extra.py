#!/usr/bin/env python3
"""Extra tokenizer goldens: tests/fixtures/text/extra_tokenizers.json.

The main fixtures (tools/gen_text_fixtures.py) cover the published families and most
components; this adds the components and loading paths they leave out, each in a small
tokenizer trained here (seeded, deterministic):

  bert_full          BertNormalizer + BertPreTokenizer + WordPiece + BertProcessing
  roberta            ByteLevel(add_prefix_space) BPE + RobertaProcessing, <mask> lstrip
  wordlevel_misc     Nmt/NFKD/StripAccents/Lowercase + CharDelimiterSplit/FixedLength + WordLevel + CTC
  unigram_fallback   Unigram byte_fallback + Strip/Replace(regex) + Metaspace(first) (offset tracking)
  legacy_bpe         merges as "a b" strings, model without "type", Whitespace+Digits, BPEDecoder,
                     upper-case normalized added tokens under a Lowercase normalizer
  split_metaspace    Split then Metaspace(first, split) after a Prepend normalizer (offset tracking)
  config_bos_eos     tokenizer_config.json with add_bos_token/add_eos_token, an added_tokens_decoder
                     entry and a special token missing from tokenizer.json (values from transformers)

Output: {"versions", "texts": [...], "tokenizers": [{"name", "source", "tokenizer_json",
"config_json", "vocab_size", "cases": [{"ids", "ids_plain", "ids_split_special", "decode",
"decode_skip"}]}]}; cases follow "texts" (corpus.json plus targeted strings).

Run: HF_HUB_OFFLINE=1 tools/.venv/bin/python tools/gen_text_extra.py
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer  # noqa: E402
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "text"
SEED = 7

EXTRA_TEXTS = [
    "Hello WORLD, héllo wörld!", "  leading and trailing  ", "中文字符测试，还有日本語のテキスト。",
    "Ünïcödé àccénts: Åström, Ñandú, Øresund.", "control\x07chars\x00and\x1bescapes\x7f",
    "<mask> at the start", "in the <mask> middle", "a<mask>b", "hello <HELLO> <hello> <Hello>",
    "ΣΑΣ ΟΔΟΣ İstanbul ǅemal", "ﬁ ligature ① ㎏ ＡＢＣ ½", "tab\there\tand\tthere", "multi\n\nline\r\ntext",
    "", " ", "x" * 120, "supercalifragilisticexpialidocious " * 3, "emoji 😀🎉👍🏽 and 🇫🇷",
    "don't do not it's they're we've I'm", "digits 1234567890 and 3.14159", "  <extra_tok>  and <new_special>",
    "<s> </s> <pad> [CLS] [SEP]", "\u200b\u200c\u200d\ufeff zero width", "a\u0301e\u0301 combining",
    "   ", "\t\n", "ends with space ", "<|bos|>hello<|eos|>",
]
# Only in the test texts, never in training: characters the vocabularies lack (unk, byte fallback).
UNSEEN_TEXTS = ["unseen ꙮ 𓀀 ᚠᛇᚻ ⵣ", "mixed ᚠa𓀀b ꙮꙮ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math"]


def synthetic(rng: random.Random, corpus: list[str]) -> list[str]:
    words = [w for line in corpus for w in line.split() if w.isalpha()] or ["word"]
    out = corpus * 2
    for _ in range(400):
        n = rng.randint(2, 12)
        out.append(" ".join(rng.choice(words) for _ in range(n)))
    return out


def train(tok: Tokenizer, trainer, lines) -> Tokenizer:
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def hf_cases(tok: Tokenizer, texts):
    cases = []
    for t in texts:
        tok.encode_special_tokens = False
        ids = tok.encode(t).ids
        plain = tok.encode(t, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        split = tok.encode(t, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        cases.append({"ids": ids, "ids_plain": plain, "ids_split_special": split,
                      "decode": tok.decode(ids, skip_special_tokens=False),
                      "decode_skip": tok.decode(ids, skip_special_tokens=True)})
    return cases


def build(lines):
    out = []

    # bert_full
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=60))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    train(tok, trainers.WordPieceTrainer(vocab_size=600, show_progress=False, limit_alphabet=300,
                                         special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]), lines)
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    out.append(("bert_full", tok, None))

    # roberta
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    train(tok, trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                   special_tokens=["<s>", "<pad>", "</s>", "<unk>"]), lines)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False, special=True)])
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                      ("<s>", tok.token_to_id("<s>")))
    tok.decoder = decoders.ByteLevel()
    out.append(("roberta", tok, None))

    # wordlevel_misc
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKD(), normalizers.StripAccents(),
                                           normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.CharDelimiterSplit(" "),
                                                 pre_tokenizers.FixedLength(length=4)])
    train(tok, trainers.WordLevelTrainer(vocab_size=400, show_progress=False, special_tokens=["<pad>", "<unk>"]),
          lines)
    tok.decoder = decoders.CTC(pad_token="<pad>", word_delimiter_token="|", cleanup=True)
    out.append(("wordlevel_misc", tok, None))

    # unigram_fallback
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.Strip(left=True, right=True),
                                           normalizers.Replace(Regex(r"\s{2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    train(tok, trainers.UnigramTrainer(vocab_size=1400, show_progress=False, unk_token="<unk>",
                                       special_tokens=["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)],
                                       max_piece_length=8, n_sub_iterations=2), lines)
    j = json.loads(tok.to_str())
    j["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens([AddedToken("<s>", special=True, normalized=False),
                            AddedToken("</s>", special=True, normalized=False)])
    tok.decoder = decoders.Sequence([decoders.Replace(Regex("▁+"), " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[
        ("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    out.append(("unigram_fallback", tok, None))

    # legacy_bpe (json edited below)
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=False))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(True)])
    train(tok, trainers.BpeTrainer(vocab_size=500, show_progress=False, limit_alphabet=100,
                                   end_of_word_suffix="</w>", special_tokens=["<unk>"]), lines)
    tok.add_tokens([AddedToken("<HELLO>", normalized=True), AddedToken("<World>", normalized=True, single_word=True)])
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    j = json.loads(tok.to_str())
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    del j["model"]["type"]
    tok = Tokenizer.from_str(json.dumps(j))
    out.append(("legacy_bpe", tok, None))

    # split_metaspace
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Prepend("▁")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\d+|[,.!?]"), behavior="isolated"),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)])
    train(tok, trainers.BpeTrainer(vocab_size=500, show_progress=False, limit_alphabet=150,
                                   special_tokens=["<unk>", "<s>"] + [f"<0x{b:02X}>" for b in range(256)]), lines)
    tok.add_special_tokens([AddedToken("<s>", special=True, normalized=False)])
    tok.add_tokens([AddedToken("<mask>", normalized=False)])
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁",
                                                                                 prepend_scheme="first")])
    out.append(("split_metaspace", tok, None))

    # config_bos_eos: transformers applies tokenizer_config.json
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    train(tok, trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                   special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"]), lines)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    n = tok.get_vocab_size()
    config = {
        "add_bos_token": True, "add_eos_token": True, "bos_token": "<|bos|>", "eos_token": "<|eos|>",
        "pad_token": "<|pad|>", "unk_token": None, "clean_up_tokenization_spaces": False,
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
        "added_tokens_decoder": {
            "0": {"content": "<|bos|>", "lstrip": False, "normalized": False, "rstrip": False,
                  "single_word": False, "special": True},
            "1": {"content": "<|eos|>", "lstrip": False, "normalized": False, "rstrip": False,
                  "single_word": False, "special": True},
            str(n): {"content": "<extra_tok>", "lstrip": False, "normalized": False, "rstrip": True,
                     "single_word": False, "special": False},
        },
        "additional_special_tokens": ["<new_special>"],
    }
    out.append(("config_bos_eos", tok, config))
    return out


def transformers_cases(tok_json: str, config: dict, texts):
    from transformers import AutoTokenizer
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as d:
        Path(d, "tokenizer.json").write_text(tok_json, encoding="utf-8")
        Path(d, "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        ht = AutoTokenizer.from_pretrained(d)
        cases = []
        for t in texts:
            ids = ht(t)["input_ids"]
            cases.append({"ids": ids, "ids_plain": ht(t, add_special_tokens=False)["input_ids"],
                          "ids_split_special": ht(t, add_special_tokens=False, split_special_tokens=True)["input_ids"],
                          "decode": ht.decode(ids, skip_special_tokens=False),
                          "decode_skip": ht.decode(ids, skip_special_tokens=True)})
        return cases, len(ht), type(ht).__name__


def main() -> None:
    corpus = json.loads((FIX / "corpus.json").read_text(encoding="utf-8"))
    texts = corpus + EXTRA_TEXTS + UNSEEN_TEXTS
    lines = synthetic(random.Random(SEED), corpus + EXTRA_TEXTS)
    entries = []
    for name, tok, config in build(lines):
        tok_json = tok.to_str(pretty=False)
        if config is None:
            t2 = Tokenizer.from_str(tok_json)
            cases, vocab, source = hf_cases(t2, texts), t2.get_vocab_size(with_added_tokens=True), "tokenizers"
        else:
            cases, vocab, cls = transformers_cases(tok_json, config, texts)
            source = f"transformers ({cls})"
        entries.append({"name": name, "source": source, "vocab_size": vocab, "tokenizer_json": tok_json,
                        "config_json": json.dumps(config, ensure_ascii=False) if config else "", "cases": cases})
        print(name, source, vocab)
    out = {"versions": {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__},
           "generator": "tools/gen_text_extra.py", "texts": texts, "tokenizers": entries}
    (FIX / "extra_tokenizers.json").write_text(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n",
                                              encoding="utf-8")


if __name__ == "__main__":
    main()
