#!/usr/bin/env python3
"""Generate the text fixtures in tests/fixtures/text/ (tokenizers and chat templates).

Run through tools/gen_text_fixtures.sh (which pins the versions).  The C++ engine never
imports Python; this script only (re)creates the committed reference data:

  corpus.json                 the test texts (a JSON list of strings)
  tokenizers/<name>/          small tokenizers trained here with `tokenizers` (or
                              `sentencepiece` for ernie), structured like each family's
                              published tokenizer.json, plus golden.json per tokenizer
  templates/<name>.jinja      chat templates (hand-written inputs, not generated)
  chat_cases.json             chat requests (messages, tools, kwargs)
  chat_golden.json            transformers' apply_chat_template for every template x case
  README.md                   what all of it is

Everything is seeded; rerunning gives byte-identical files.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import random
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

import jinja2
import sentencepiece as spm
import tokenizers
import transformers
from tokenizers import AddedToken, Regex, Tokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "text"
TOK_DIR = OUT / "tokenizers"
TEMPLATE_DIR = OUT / "templates"

SEED = 20240726

# Pre-tokenizer regexes of the published tokenizers (facts of the format).
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_V3_REGEXES = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"""| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
]

BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


# ---------------------------------------------------------------------------
# The corpus (tests/fixtures/text/corpus.json).  Escapes keep "\r\n", tabs, a lone "\r",
# trailing spaces and invisible code points exact.  No lone surrogates (not UTF-8).
# ---------------------------------------------------------------------------
# Added tokens of the `added_flags` fixture: one per combination of the five AddedToken
# flags.  Bit 4 special, bit 3 normalized, bit 2 lstrip, bit 1 rstrip, bit 0 single_word.
FLAG_TOKENS = [f"<x{i:02d}>" for i in range(32)]


def _flag_lines() -> list[str]:
    t = FLAG_TOKENS
    return [
        "spaced: " + " ".join(f"w {tok} v" for tok in t),
        "glued: " + "".join(f"a{tok}b" for tok in t),
        "upper: " + "  ".join(tok.upper() for tok in t) + "  ",
        "tabs:\t" + "\t".join(f"{tok}\n" for tok in t[::3]),
        "twice: " + " ".join(tok + tok for tok in t[::5]) + " fullwidth <ｘ09> <ｘ25>",
    ]


_PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It's true: we've seen they'll go, you'd stay, I'm here and she's gone.",
    "DON'T SHOUT, WE'RE LISTENING; it'S fine, you'LL see.",
    "A mixture-of-experts layer sends every token to a few experts out of many.",
    "The router scores each expert, keeps the top k, and renormalises the weights.",
    "Tokenizers turn text into numbers; detokenizers turn the numbers back into text.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "On Tuesday, the committee met at 9:30 a.m. to discuss the budget (again).",
    "Mr. O'Neil's dog didn't bark -- it just stared, then wandered off.",
    "\"Quoted text,\" he said, 'and single quotes too.'",
    "Hyphen-ated words, en–dashes, em—dashes and ellipses… are all punctuation.",
    "Email someone@example.org or visit https://example.com/path?q=1&lang=en#top today.",
    "Version 2.0.1-rc3 fixes bug #4521 (see CHANGELOG.md).",
    "Prices: $19.99, €5, £3.50, ¥1000 and ₹250.",
    "Capitalised Words And lower case words and UPPER CASE WORDS.",
    "camelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_CASE",
    "Once upon a time, in a land far, far away, there lived a very small dragon who was afraid of "
    "the dark; every night it curled up beside the embers of the village forge and listened to "
    "the blacksmith humming songs about mountains, rivers and the long road to the sea.",
    "Why? Because! Really?! Yes... no... maybe.",
    "The weather today is sunny with a light breeze from the west.",
    "Please read the manual before asking; most answers are in chapter three.",
    "I can't believe it's already December; the year went by so fast.",
    "Numbers like one, two and three are words, but 1, 2 and 3 are digits.",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!!!!!!!!!!!!!!????????........,,,,,,,;;;;;::::",
    "________________==================----------------~~~~~~~~",
    "x",
    "I",
    "..",
]

_CODE = [
    "def encode(self, text: str) -> list[int]:\n    ids = []\n    for piece in self.split(text):\n"
    "        ids.append(self.vocab.get(piece, self.unk_id))\n    return ids\n",
    "class Router(nn.Module):\n\tdef forward(self, x):\n\t\treturn x @ self.weight.T  # tabs\n",
    "    if not text:\n        return []",
    "for i in range(10): print(i ** 2, end=' ')",
    "x = {'a': 1, \"b\": [2, 3], 'c': None}",
    "lambda a, b: (a + b) * (a - b) / 2.0",
    "#include <vector>\n#include <nlohmann/json.hpp>",
    "template <typename T>\nstd::vector<T> topk(const std::vector<T>& v, size_t k) {\n  std::vector<T> out(v);\n"
    "  std::partial_sort(out.begin(), out.begin() + k, out.end(), std::greater<T>());\n  return out;\n}",
    "for (size_t i = 0; i < n; ++i) { out[i] = a[i] * b[i] + c; }",
    "auto tok = moe::text::Tokenizer::from_dir(\"models/qwen3\");  // load",
    "if (x != nullptr && *x >= 0x10) return -1; else if (y <= 3) { y <<= 2; }",
    "std::cout << \"hello, world\\n\" << std::endl;",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name;",
    "{\"role\": \"user\", \"content\": \"Hi!\", \"tool_calls\": []}",
    "<div class=\"note\">&amp; &lt;b&gt;bold&lt;/b&gt;</div>",
    "$ ls -la /usr/local/bin | grep -v '^d' > out.txt 2>&1",
    "    \t    mixed indent\t\tline",
    "//// comment //// /* block */ # hash ## double",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f**=6;g//=7",
    "key: value\nlist:\n  - item1\n  - item2\n",
]

_CJK = [
    "混合专家模型把每个词元分配给少数几个专家。",
    "今天天气很好，我们去公园散步吧！",
    "分词器需要正确处理中文标点：，。！？、；：“引号”（括号）《书名》",
    "机器学习和深度学习是人工智能的重要分支，应用非常广泛。",
    "繁體中文與簡體中文的轉換並不總是一對一的。",
    "我有3个苹果和12根香蕉，一共15个水果。",
    "中文English混合mixed文本text",
    "今日は良い天気ですね。散歩に行きましょう。",
    "カタカナとひらがな、そして漢字が混ざった文章です。",
    "ｶﾀｶﾅ ﾊﾝｶｸ と ゛゜ の 濁点",
    "東京タワーの高さは333メートルです。",
    "ガ vs カ\u3099 (precomposed vs combining dakuten)",
    "안녕하세요, 만나서 반갑습니다.",
    "토크나이저는 한국어 음절을 바이트로 나눌 수 있습니다.",
    "한 vs \u1112\u1161\u11ab (jamo)",
]

_SCRIPTS = [
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "النماذج اللغوية الكبيرة تتعلم من النصوص.",
    "الأرقام العربية: ٠١٢٣٤٥٦٧٨٩",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "भाषा मॉडल शब्दों को टोकन में बदलते हैं।",
    "क्षत्रिय द्वार श्री",
    "Привет, мир! Как дела? Ёлка и ёж.",
    "Καλημέρα κόσμε, ΣΑΣ ευχαριστώ, σας.",
    "שלום עולם, מה שלומך?",
    "สวัสดีครับ ยินดีที่ได้รู้จัก",
    "Tiếng Việt có nhiều dấu thanh: à á ả ã ạ.",
    "Straße ß ẞ ǅ ǆ İstanbul ı",
    "Ελληνικά και English και Русский в одной строке",
]

_EMOJI = [
    "I love it 😀😃😄 so much 🎉",
    "Family: 👨‍👩‍👧‍👦 and 👩🏽‍💻 at work",
    "Flags: 🇫🇷 🇯🇵 🇺🇸 🏳️‍🌈 🏴‍☠️",
    "Thumbs 👍🏻👍🏼👍🏽👍🏾👍🏿",
    "Keycaps 1️⃣ #️⃣ and ❤️ vs ❤︎ vs ❤",
    "🧑‍🚀🚀✨🌍",
    "😀",
    "emoji👍glued👍to👍words",
]

_DIGITS = [
    "1234567890123",
    "3.14159265358979 and -0.5e-10 and +6.02e23",
    "Order #000123 costs $1,234,567.89",
    "2024-07-26T12:34:56Z",
    "0x7fffffff 0b1010 1e9 1_000_000",
    "12345678901234567890123456789012345678901234567890",
    "１２３４ fullwidth digits, ²³ superscripts, ½ ¼ ① ⑳",
    "Ⅻ Ⅳ ⅷ Roman numerals",
    "4 8 15 16 23 42",
    "v1.2.3 and 10.0.0.1 and 255.255.255.0",
]

_SPACE = [
    "   leading spaces",
    "trailing spaces   ",
    "many          spaces          between",
    "\ttab\tseparated\tvalues\t",
    "mixed \t \t whitespace",
    " ",
    "",
    "\n\n\n",
    "line one\nline two\n\nline four",
    "windows\r\nline\r\nendings\r\n",
    "lone\rcarriage return",
    "trailing newline\n",
    "\n leading newline",
    "  \n  \n  ",
    "\u00a0nbsp\u00a0here \u3000ideographic\u3000space \u2003em\u2003space",
    "vertical\u000btab and form\u000cfeed",
    "\u2028line separator\u2029paragraph separator\u0085next line",
    "\r\n",
    "\t",
    "end with tab\t",
    "  two leading, two trailing  ",
]

_SPECIAL = [
    "hello<|im_start|>user",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "<s>",
    "</s>",
    "<s>[INST] What is 2+2? [/INST] 4</s>",
    "text<|endoftext|>more text",
    "<｜begin▁of▁sentence｜>Hello<｜end▁of▁sentence｜>",
    "<｜User｜>question<｜Assistant｜>answer<｜end▁of▁sentence｜>",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<|begin_of_sentence|>User: hi\nAssistant: hello<|end_of_sentence|>",
    "[CLS] hello [SEP] world [MASK] [UNK] [PAD]",
    "<unk> <pad> <mask> <|begin_of_text|> <|eot_id|>",
    "<|im_start|><|im_end|><|im_start|>",
    "<|im_start and <|im_end without bars",
    "< |im_start| > spaced",
    "<|IM_START|> upper case",
    "<<s>> nested <</s>>",
    " <|im_end|> spaced special ",
    "<|endoftext|>",
]

_UNICODE = [
    "\u0301\u0301 combining marks without a base",
    "zero\u200bwidth\u200bspace",
    "zero\u200dwidth joiner and non\u200cjoiner",
    "\ufeffBOM at the start",
    "mid\ufeffBOM",
    "rtl \u202eevil\u202c text \u200f mark \u200e end",
    "nonchar \ufffe \uffff end",
    "private \ue000\uf8ff use",
    "max \U0010ffff plane",
    "math \U0001d400\U0001d401\U0001d7ce bold",
    "café",
    "cafe\u0301",
    "\u00c5 vs A\u030a vs \u212b (angstrom)",
    "ﬁnancial ﬂow ﬀ ﬃ",
    "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ ！",
    "ᴴᵉˡˡᵒ superscript letters",
    "㈱ ㎏ ㍻ ℡ ™ compatibility",
    "Ω vs \u2126 (ohm sign)",
    "a\u0323\u0308 vs a\u0308\u0323 mark order",
    "\u1e9b\u0323 long s with dots",
    "control \u0001\u001f\u007f chars and a\u0000null",
    "unassigned \u0378 and tag \U000e0001\U000e0041",
    "replacement \ufffd char",
    "variation \u2764\ufe0f \u2764\ufe0e selectors",
    "e\u0301\u0302\u0303\u0304\u0305 stacked",
]


def corpus() -> list[str]:
    lines = _PROSE + _CODE + _CJK + _SCRIPTS + _EMOJI + _DIGITS + _SPACE + _SPECIAL + _UNICODE
    lines += _flag_lines()
    # Mixed lines built from the pieces above so that every script also appears next to others.
    lines += [
        "Hello 世界! 🌍 مرحبا नमस्ते 123",
        "  Indented 中文 with\ttabs and 😀 emoji  ",
        "The price is ¥3,000 (三千円) — 約$20.",
        "<|im_start|>user\n你好！Can you help? 🙏<|im_end|>",
        "Ｈｅｌｌｏ\u3000Ｗｏｒｌｄ and ﬁne ① Ⅻ",
    ]
    return lines


# Extra training text (only for training the fixture vocabularies; never a golden input).
TRAIN_WORDS = (
    "the of and to in is that for it as with was on be by at this have from or an are not "
    "but which they you we his her she he all one there can has more if would been will their "
    "token tokens tokenizer expert experts model models router routing layer layers weight weights "
    "text string bytes merge merges vocab vocabulary encode decode space spaces split words word "
    "hello world test data value values number numbers line lines code function return import "
    "chat template message messages user assistant system tool tools call result content role "
    "def class self print range list dict int float str none true false if else for while "
    "std vector size_t const auto include template typename return void struct namespace "
    "中文 分词 专家 模型 数据 文本 测试 语言 今天 我们 日本語 テスト です ます 한국어 토큰 "
    "мир язык текст λόγος κείμενο नमस्ते भाषा مرحبا النص"
).split()


def training_lines(rng) -> list[str]:
    """Corpus lines (x3) plus seeded synthetic sentences; `rng` is a random.Random."""
    lines = corpus() * 3
    for _ in range(600):
        n = rng.randint(3, 14)
        words = [rng.choice(TRAIN_WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randint(0, n), str(rng.randint(0, 10 ** rng.randint(1, 8))))
        sep = " " if rng.random() < 0.85 else rng.choice(["  ", "\t", ", ", "\n"])
        s = sep.join(words)
        if rng.random() < 0.5:
            s = s[0].upper() + s[1:] + rng.choice([".", "!", "?", ":", ";", ""])
        if rng.random() < 0.1:
            s = "    " + s
        lines.append(s)
    return lines


# ---------------------------------------------------------------------------
# JSON output (compact, readable diffs, UTF-8)
# ---------------------------------------------------------------------------
def _dumps(v) -> str:
    if isinstance(v, list):
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(v, ensure_ascii=False)


def _is_flat(v) -> bool:
    if isinstance(v, list):
        return all(not isinstance(e, (list, dict)) for e in v)
    if isinstance(v, dict):
        return all(not isinstance(e, (list, dict)) for e in v.values()) and len(v) <= 8
    return True


def _fmt(v, indent: int) -> str:
    if _is_flat(v):
        return _dumps(v)
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(v, list):
        return "[\n" + ",\n".join(inner + _fmt(e, indent + 1) for e in v) + "\n" + pad + "]"
    items = [f"{inner}{_dumps(k)}: {_fmt(e, indent + 1)}" for k, e in v.items()]
    return "{\n" + ",\n".join(items) + "\n" + pad + "}"


def write_json(path: Path, obj, pretty: bool = False) -> None:
    text = (json.dumps(obj, ensure_ascii=False, indent=2) if pretty else _fmt(obj, 0)) + "\n"
    assert json.loads(text) == obj
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def canonical_tokenizer_json(tok: Tokenizer) -> str:
    """tokenizers' own serialization (compact: the pretty form is 2-4x larger)."""
    return tok.to_str(pretty=False) + "\n"


# ---------------------------------------------------------------------------
# Training helpers
# ---------------------------------------------------------------------------
def train_lines() -> list[str]:
    return training_lines(random.Random(SEED))


def pretokenized_words(normalizer, pre_tokenizer) -> dict[str, int]:
    """Word counts of the training text, split as the tokenizer would split it."""
    counts: dict[str, int] = {}
    for line in train_lines():
        text = normalizer.normalize_str(line) if normalizer is not None else line
        pieces = [p for p, _ in pre_tokenizer.pre_tokenize_str(text)] if pre_tokenizer is not None else [text]
        for w in pieces:
            if w:
                counts[w] = counts.get(w, 0) + 1
    return counts


def bpe_train(normalizer, pre_tokenizer, vocab_size, *, byte_level=False, special=(),
              continuing_subword_prefix=None, end_of_word_suffix=None, limit_alphabet=None,
              min_frequency=2):
    """Train a BPE and return (vocab: dict str->id, merges: list[(a, b)]).

    Same algorithm and vocabulary layout as tokenizers' BpeTrainer (special tokens, the
    alphabet sorted by code point, prefixed/suffixed symbols, then one token per merge;
    continuing_subword_prefix / end_of_word_suffix as tokenizers applies them), but
    deterministic: BpeTrainer breaks count ties through Rust HashMap order, which changes
    from process to process.  Ties here go to the lexicographically smallest pair.
    """
    import heapq
    prefix, suffix = continuing_subword_prefix or "", end_of_word_suffix or ""
    counts = pretokenized_words(normalizer, pre_tokenizer)
    words = sorted(counts)
    char_count: dict[str, int] = {}
    for w in words:
        for ch in w:
            char_count[ch] = char_count.get(ch, 0) + counts[w]
    forced = set(pre_tokenizers.ByteLevel.alphabet()) if byte_level else set()
    chars = sorted(set(char_count) | forced)
    if limit_alphabet is not None and len(chars) > limit_alphabet:
        ranked = sorted(chars, key=lambda c: (c not in forced, -char_count.get(c, 0), c))
        chars = sorted(ranked[:max(limit_alphabet, len(forced))])
    alphabet = set(chars)
    vocab: dict[str, int] = {}
    for t in list(special) + chars:
        vocab.setdefault(t, len(vocab))
    syms, wcount = [], []
    for w in words:
        cs = list(w)
        out = []
        for i, ch in enumerate(cs):
            if ch not in alphabet:
                continue
            sym = (prefix + ch if i > 0 and prefix else ch) + (suffix if i == len(cs) - 1 and suffix else "")
            out.append(sym)
        syms.append(out)
        wcount.append(counts[w])
    for t in sorted({x for ws in syms for x in ws}):
        vocab.setdefault(t, len(vocab))
    pair_count: dict[tuple, int] = {}
    where: dict[tuple, set] = {}
    for wi, ws in enumerate(syms):
        for q in zip(ws, ws[1:]):
            pair_count[q] = pair_count.get(q, 0) + wcount[wi]
            where.setdefault(q, set()).add(wi)
    heap = [(-c, q) for q, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(vocab) < vocab_size and heap:
        negc, q = heapq.heappop(heap)
        if pair_count.get(q, 0) != -negc or -negc <= 0:
            continue
        if -negc < min_frequency:
            break
        a, b = q
        new = a + (b[len(prefix):] if prefix and b.startswith(prefix) else b)
        merges.append(q)
        vocab.setdefault(new, len(vocab))
        touched = set()
        for wi in sorted(where.pop(q, ())):
            ws, c = syms[wi], wcount[wi]
            for r in zip(ws, ws[1:]):
                pair_count[r] -= c
                touched.add(r)
            out, i = [], 0
            while i < len(ws):
                if i + 1 < len(ws) and ws[i] == a and ws[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(ws[i])
                    i += 1
            syms[wi] = out
            for r in zip(out, out[1:]):
                pair_count[r] = pair_count.get(r, 0) + c
                where.setdefault(r, set()).add(wi)
                touched.add(r)
        pair_count.pop(q, None)
        for r in sorted(touched):
            if r != q and pair_count.get(r, 0) > 0:
                heapq.heappush(heap, (-pair_count[r], r))
    return vocab, merges


def reorder_vocab(vocab: dict, head: list[str]) -> dict:
    """`head` tokens first (ids 0..), then the trained tokens in their trained order."""
    out = {t: i for i, t in enumerate(head)}
    for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        if t not in out:
            out[t] = len(out)
    return out


def special(content, **kw) -> AddedToken:
    kw.setdefault("normalized", False)
    return AddedToken(content, special=True, **kw)


def plain(content, **kw) -> AddedToken:
    kw.setdefault("normalized", False)
    return AddedToken(content, special=False, **kw)


# ---------------------------------------------------------------------------
# Tokenizer specs.  Each builder returns dict(tokenizer=Tokenizer, config=dict|None, ...)
# ---------------------------------------------------------------------------
QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN3_PLAIN = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]


def qwen3_pipeline(tok: Tokenizer) -> None:
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def build_qwen3():
    probe = Tokenizer(models.BPE())
    qwen3_pipeline(probe)
    vocab, merges = bpe_train(probe.normalizer, probe.pre_tokenizer, 1200, byte_level=True)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                               continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                               byte_fallback=False, ignore_merges=False))
    qwen3_pipeline(tok)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    # Qwen3 order: the special <|...|> tokens, then <tool_call>, </tool_call>, <|fim_*|>, ...
    for t in QWEN3_SPECIAL + QWEN3_PLAIN:
        if t in QWEN3_SPECIAL:
            tok.add_special_tokens([special(t)])
        else:
            tok.add_tokens([plain(t)])
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added_tokens_decoder(tok),
        "additional_special_tokens": QWEN3_SPECIAL[1:],
        "bos_token": None,
        "chat_template": "@qwen3",
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    return dict(tokenizer=tok, config=config, family=True, covers=[
        "normalizer NFC", "pre_tokenizer Sequence[Split(Qwen2 regex, isolated), ByteLevel(add_prefix_space=false, "
        "use_regex=false)]", "decoder ByteLevel", "post_processor ByteLevel(trim_offsets=false)",
        "special added tokens <|endoftext|> <|im_start|> <|im_end|> ...", "non-special added tokens <think> "
        "</think> <tool_call> </tool_call> <tool_response> <|fim_*|> ...", "no BOS"])


DS_SPECIAL_HEAD = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
DS_SPECIAL_TAIL = ["<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<|EOT|>",
                   "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                   "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
                   "<｜tool▁output▁end｜>", "<｜tool▁sep｜>"]
DS_PLAIN = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"]


def deepseek_pre():
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in DEEPSEEK_V3_REGEXES]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])


def build_deepseek_v3():
    norm = normalizers.Sequence([])
    vocab, merges = bpe_train(norm, deepseek_pre(), 1200, byte_level=True)
    vocab = reorder_vocab(vocab, DS_SPECIAL_HEAD)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=False,
                               byte_fallback=False, ignore_merges=False))
    tok.normalizer = norm
    tok.pre_tokenizer = deepseek_pre()
    tok.decoder = decoders.ByteLevel()
    bos = DS_SPECIAL_HEAD[0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, 0)])
    tok.add_special_tokens([special(t) for t in DS_SPECIAL_HEAD])
    # Published: a block of placeholder tokens, then the chat/tool tokens.
    tok.add_special_tokens([special(f"<｜place▁holder▁no▁{i}｜>") for i in range(4)])
    for t in DS_SPECIAL_TAIL[:3]:
        tok.add_special_tokens([special(t)])
    tok.add_tokens([plain(t, normalized=True) for t in DS_PLAIN[:2]])
    tok.add_special_tokens([special(DS_SPECIAL_TAIL[3])])
    tok.add_tokens([plain(t, normalized=True) for t in DS_PLAIN[2:]])
    tok.add_special_tokens([special(t) for t in DS_SPECIAL_TAIL[4:]])
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": {"__type": "AddedToken", "content": bos, "lstrip": False, "normalized": True,
                      "rstrip": False, "single_word": False},
        "chat_template": "@deepseek_v3",
        "clean_up_tokenization_spaces": False,
        "eos_token": {"__type": "AddedToken", "content": DS_SPECIAL_HEAD[1], "lstrip": False,
                      "normalized": True, "rstrip": False, "single_word": False},
        "legacy": True,
        "model_max_length": 131072,
        "pad_token": {"__type": "AddedToken", "content": DS_SPECIAL_HEAD[1], "lstrip": False,
                      "normalized": True, "rstrip": False, "single_word": False},
        "sp_model_kwargs": {},
        "unk_token": None,
        "tokenizer_class": "LlamaTokenizerFast",
    }
    return dict(tokenizer=tok, config=config, family=True, covers=[
        "normalizer Sequence[] (empty)", "pre_tokenizer Sequence[Split(\\p{N}{1,3}), Split(CJK ranges), "
        "Split(punctuation/letters regex), ByteLevel(use_regex=false)] all isolated",
        "decoder ByteLevel", "post_processor TemplateProcessing (BOS <｜begin▁of▁sentence｜> id 0)",
        "fullwidth-bar special tokens; <｜User｜> <｜Assistant｜> <think> </think> non-special normalized=true",
        "tokenizer_config add_bos_token=true, tokenizer_class LlamaTokenizerFast, bos/eos as AddedToken dicts"])


def spm_like_vocab(vocab: dict, head: list[str]) -> dict:
    """<unk> <s> </s> <0x00>..<0xFF> first (SentencePiece byte-fallback layout), then trained."""
    return reorder_vocab(vocab, head + BYTE_TOKENS)


def metaspace_train(vocab_size, norm=None):
    return bpe_train(norm, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
                     vocab_size, special=["<unk>", "<s>", "</s>"], limit_alphabet=300)


def build_mixtral():
    vocab, merges = metaspace_train(1200)
    vocab = spm_like_vocab(vocab, ["<unk>", "<s>", "</s>"])
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token="<unk>", fuse_unk=True,
                               byte_fallback=True, ignore_merges=False))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)])
    tok.add_special_tokens([special(t) for t in ["<unk>", "<s>", "</s>"]])
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": added_tokens_decoder(tok),
        "additional_special_tokens": [],
        "bos_token": "<s>",
        "chat_template": "@mixtral",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": True,
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": None,
        "sp_model_kwargs": {},
        "spaces_between_special_tokens": False,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
        "use_default_system_prompt": False,
    }
    return dict(tokenizer=tok, config=config, family=True, covers=[
        "normalizer Sequence[Prepend(▁), Replace(' ', ▁)]", "pre_tokenizer null",
        "BPE byte_fallback=true fuse_unk=true unk <unk> id 0, <0x00>..<0xFF> ids 3..258",
        "decoder Sequence[Replace(▁, ' '), ByteFallback, Fuse, Strip(' ', 1, 0)]",
        "post_processor TemplateProcessing (<s> id 1)"])


def build_metaspace():
    vocab, merges = metaspace_train(900)
    vocab = spm_like_vocab(vocab, ["<unk>", "<s>", "</s>"])
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    # No Fuse before Metaspace: tokenizers' Metaspace decoder drops *every* "▁" of the first
    # token (prepend_scheme != never), so after a Fuse it would delete all spaces.
    tok.decoder = decoders.Sequence([decoders.ByteFallback(),
                                     decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)])
    tok.add_special_tokens([special(t) for t in ["<unk>", "<s>", "</s>"]])
    tok.add_special_tokens([special(t) for t in ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                                 "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]])
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": False,
        "model_max_length": 32768,
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
        "chat_template": "@mistral_tools",
    }
    return dict(tokenizer=tok, config=config, family=True, covers=[
        "normalizer null", "pre_tokenizer Metaspace(▁, prepend_scheme=first, split=false)",
        "BPE byte_fallback=true fuse_unk=true", "decoder Sequence[ByteFallback, Metaspace(first)]",
        "post_processor TemplateProcessing (<s>)", "Mistral control tokens [INST] [/INST] ... (special)"])


def bl(add_prefix_space=False, use_regex=False):
    return pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=use_regex)


def simple_bpe(name, normalizer, pre_tokenizer, decoder, *, vocab_size=600, byte_level=True,
               post_processor=None, added=(), covers=(), model_kw=None, train_kw=None,
               unk=None, byte_fallback=False, head=()):
    """Train a BPE with the given pipeline and return the builder dict."""
    train_kw = dict(train_kw or {})
    specials = list(head)
    vocab, merges = bpe_train(normalizer, pre_tokenizer, vocab_size, byte_level=byte_level,
                              special=specials, **train_kw)
    if byte_fallback:
        vocab = reorder_vocab(vocab, specials + BYTE_TOKENS)
    mk = dict(vocab=vocab, merges=merges, unk_token=unk, byte_fallback=byte_fallback)
    for k in ("continuing_subword_prefix", "end_of_word_suffix"):
        if k in train_kw:
            mk[k] = train_kw[k]
    mk.update(model_kw or {})
    tok = Tokenizer(models.BPE(**mk))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoder
    if post_processor is not None:
        tok.post_processor = post_processor(tok) if callable(post_processor) else post_processor
    if specials:
        tok.add_special_tokens([special(t) for t in specials])
    for a in added:
        (tok.add_special_tokens if a.special else tok.add_tokens)([a])
    return dict(tokenizer=tok, config=None, family=False, covers=list(covers))


def tp(single, specials):
    def make(tok):
        ids = [(t, tok.token_to_id(t)) for t in specials]
        for t, i in ids:
            assert i is not None, t
        return processors.TemplateProcessing(single=single, special_tokens=ids)
    return make


def build_bytelevel_gpt2():
    return simple_bpe(
        "bytelevel_gpt2", None, bl(add_prefix_space=True, use_regex=True), decoders.ByteLevel(),
        post_processor=processors.ByteLevel(trim_offsets=True), added=[special("<|endoftext|>")],
        covers=["pre_tokenizer ByteLevel(add_prefix_space=true, use_regex=true) (GPT-2 regex)",
                "decoder ByteLevel", "post_processor ByteLevel(trim_offsets=true)", "normalizer null"])


def build_bytelevel_bos_eos():
    def post(tok):
        bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")
        return processors.TemplateProcessing(single="<|bos|> $A <|eos|>", pair="<|bos|> $A <|eos|> $B:1 <|eos|>:1",
                                             special_tokens=[("<|bos|>", bos), ("<|eos|>", eos)])
    return simple_bpe(
        "bytelevel_bos_eos", normalizers.Sequence([normalizers.NFKC(), normalizers.Strip(left=True, right=False)]),
        bl(add_prefix_space=False, use_regex=True), decoders.ByteLevel(), post_processor=post,
        head=["<|bos|>", "<|eos|>"],
        covers=["pre_tokenizer ByteLevel(add_prefix_space=false, use_regex=true)",
                "normalizer Sequence[NFKC, Strip(left only)]",
                "post_processor TemplateProcessing single '<|bos|> $A <|eos|>' (BOS and EOS)"])


# Whole words put into the ignore_merges vocabulary without a merge path (Llama-3 has many such
# entries); with ignore_merges=true a pre-token found in the vocab is emitted as one token.
IGNORE_MERGES_WORDS = ["Ġexperts", "Ġtokenizer", "Ġrouter", "hello", "Ġworld", "Ġthe", "ĠThe", "123",
                       "Ġ世界", "Ġ😀", "ĠHello", "Ġsea"]


def build_ignore_merges():
    from tokenizers.pre_tokenizers import ByteLevel as BL
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
                                   bl(False, False)])
    vocab, merges = bpe_train(None, pre, 500, byte_level=True)
    # byte-level form of the words (e.g. "Ġ世界" -> its byte-level characters)
    for w in IGNORE_MERGES_WORDS:
        text = w.replace("Ġ", " ")
        bw = "".join(p for p, _ in BL(add_prefix_space=False, use_regex=False).pre_tokenize_str(text))
        if bw not in vocab:
            vocab[bw] = len(vocab)
    vocab = reorder_vocab(vocab, [])
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tok.normalizer = None
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.add_special_tokens([special("<|begin_of_text|>"), special("<|end_of_text|>"), special("<|eot_id|>"),
                            special("<|start_header_id|>"), special("<|end_header_id|>")])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    return dict(tokenizer=tok, config=None, family=False, covers=[
        "BPE ignore_merges=true (Llama-3 style) with whole words in the vocab that merges cannot reach "
        f"({', '.join(IGNORE_MERGES_WORDS)})",
        "pre_tokenizer Sequence[Split(Llama-3 regex with \\p{N}{1,3}, isolated), ByteLevel(use_regex=false)]",
        "post_processor Sequence[ByteLevel(trim_offsets=false), TemplateProcessing(<|begin_of_text|>)]"])


def split_tok(name, regex, behavior, invert, normalizer, covers, extra_pre=(), string_pattern=False):
    pattern = regex if string_pattern else Regex(regex)
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(pattern, behavior=behavior, invert=invert),
                                   *extra_pre, bl(False, False)])
    return simple_bpe(name, normalizer, pre, decoders.ByteLevel(), vocab_size=500,
                      covers=[f"pre_tokenizer Split({'string' if string_pattern else 'regex'} {regex!r}, "
                              f"{behavior}, invert={str(invert).lower()}) then ByteLevel(use_regex=false)", *covers])


def build_unigram():
    """Unigram pieces and scores from sentencepiece's unigram trainer (deterministic with one
    thread; tokenizers' UnigramTrainer is not), as a tokenizers Unigram model."""
    norm = normalizers.NFKC()
    pre = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    spm.set_random_generator_seed(SEED)
    buf = io.BytesIO()
    lines = [norm.normalize_str(x) for x in train_lines() if x.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, model_type="unigram", vocab_size=700,
        byte_fallback=False, character_coverage=0.9995, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, split_by_whitespace=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, max_sentence_length=16384, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    vocab = [(sp.id_to_piece(i), 0.0 if sp.is_control(i) or sp.is_unknown(i) else float(sp.get_score(i)))
             for i in range(sp.get_piece_size())]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=False))
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.add_special_tokens([special(t) for t in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    return dict(tokenizer=tok, config=None, family=False, covers=[
        "model Unigram (pieces and scores from a sentencepiece unigram training; unk <unk> id 0, "
        "byte_fallback=false)", "normalizer NFKC",
        "pre_tokenizer Metaspace(prepend_scheme=always, split=true)", "decoder Metaspace(always)",
        "post_processor TemplateProcessing '<s> $A </s>'"])


def build_wordpiece_bert():
    norm = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()])
    pre = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation(behavior="isolated")])
    # WordPieceTrainer is BpeTrainer with the "##" prefix; the deterministic BPE gives the vocab.
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab, _ = bpe_train(norm, pre, 700, special=specials, continuing_subword_prefix="##", limit_alphabet=200)
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                     max_input_chars_per_word=100))
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.add_special_tokens([special(t) for t in specials])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return dict(tokenizer=tok, config=None, family=False, covers=[
        "model WordPiece (unk [UNK], ##, max_input_chars_per_word=100)", "normalizer Sequence[NFD, Lowercase]",
        "pre_tokenizer Sequence[Whitespace, Punctuation(isolated)]", "decoder WordPiece(##, cleanup=true)",
        "post_processor TemplateProcessing '[CLS] $A [SEP]'"])


def build_added_flags():
    """One added token per combination of special/normalized/lstrip/rstrip/single_word."""
    norm = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    added = []
    for i, content in enumerate(FLAG_TOKENS):
        sp, nm, ls, rs, sw = (bool(i & 16), bool(i & 8), bool(i & 4), bool(i & 2), bool(i & 1))
        added.append(AddedToken(content, special=sp, normalized=nm, lstrip=ls, rstrip=rs, single_word=sw))
    d = simple_bpe("added_flags", norm, bl(False, True), decoders.ByteLevel(), vocab_size=500, added=added,
                   covers=["32 added tokens <x00>..<x31>: bit 4 special, bit 3 normalized, bit 2 lstrip, "
                           "bit 1 rstrip, bit 0 single_word (every combination)",
                           "normalizer Sequence[NFKC, Lowercase] (normalized=true tokens match upper case / "
                           "fullwidth text)", "pre_tokenizer ByteLevel(use_regex=true)"])
    return d


BUILDERS = {
    "qwen3": build_qwen3,
    "deepseek_v3": build_deepseek_v3,
    "mixtral": build_mixtral,
    "metaspace": build_metaspace,
    "bytelevel_gpt2": build_bytelevel_gpt2,
    "bytelevel_bos_eos": build_bytelevel_bos_eos,
    "ignore_merges": build_ignore_merges,
    "split_removed": lambda: split_tok(
        "split_removed", r"\s+", "removed", False, normalizers.NFKC(),
        ["normalizer NFKC", "Punctuation(removed) after the Split", "roundtrip false (spaces and punctuation removed)"],
        extra_pre=[pre_tokenizers.Punctuation(behavior="removed")]),
    "split_isolated_invert": lambda: split_tok(
        "split_isolated_invert", r"\p{L}+|\p{N}+", "isolated", True, normalizers.NFD(), ["normalizer NFD"]),
    "split_merged_prev": lambda: split_tok(
        "split_merged_prev", r"[.,!?;:。，！？]", "merged_with_previous", False, normalizers.NFKD(),
        ["normalizer NFKD"]),
    "split_merged_next_invert": lambda: split_tok(
        "split_merged_next_invert", r"\s+", "merged_with_next", True, normalizers.Lowercase(),
        ["normalizer Lowercase"]),
    "split_contiguous": lambda: split_tok(
        "split_contiguous", r"\p{P}", "contiguous", False,
        normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " ")]),
        ["normalizer Sequence[NFC, Replace(regex \\s+ -> ' ')]", "Digits(individual_digits=false)"],
        extra_pre=[pre_tokenizers.Digits(individual_digits=False)]),
    "split_string": lambda: simple_bpe(
        "split_string", normalizers.Replace("\r\n", "\n"),
        pre_tokenizers.Sequence([pre_tokenizers.Split(" ", behavior="merged_with_next", invert=False),
                                 pre_tokenizers.Punctuation(behavior="merged_with_next"),
                                 pre_tokenizers.Digits(individual_digits=True)]),
        decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()]), byte_level=False, byte_fallback=True,
        vocab_size=700, train_kw=dict(limit_alphabet=150),
        covers=["pre_tokenizer Sequence[Split(string ' ', merged_with_next), Punctuation(merged_with_next), "
                "Digits(individual_digits=true)]", "normalizer Replace(string '\\r\\n' -> '\\n')",
                "BPE byte_fallback=true without unk", "decoder Sequence[ByteFallback, Fuse]"]),
    "punct_prev_metaspace_never": lambda: simple_bpe(
        "punct_prev_metaspace_never", normalizers.Strip(left=True, right=True),
        pre_tokenizers.Sequence([pre_tokenizers.Punctuation(behavior="merged_with_previous"),
                                 pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)]),
        decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="never",
                                                                       split=True)]),
        byte_level=False, byte_fallback=True, vocab_size=700, train_kw=dict(limit_alphabet=150),
        covers=["normalizer Strip(left, right)", "pre_tokenizer Sequence[Punctuation(merged_with_previous), "
                "Metaspace(prepend_scheme=never, split=true)]", "decoder Sequence[ByteFallback, Metaspace(never)]"]),
    "punct_digits": lambda: simple_bpe(
        "punct_digits", normalizers.NFC(),
        pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="contiguous"),
                                 pre_tokenizers.Digits(individual_digits=True)]),
        decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()]),
        byte_level=False, byte_fallback=True, vocab_size=700, unk="<unk>", head=["<unk>"],
        train_kw=dict(limit_alphabet=150), model_kw=dict(fuse_unk=False),
        covers=["pre_tokenizer Sequence[WhitespaceSplit, Punctuation(contiguous), Digits(individual_digits=true)]",
                "BPE byte_fallback=true with unk <unk> (fuse_unk=false)",
                "decoder Sequence[ByteFallback, Fuse]"]),
    "suffix_bpe": lambda: simple_bpe(
        "suffix_bpe", normalizers.Lowercase(), pre_tokenizers.Whitespace(), decoders.BPEDecoder(suffix="</w>"),
        byte_level=False, vocab_size=700, unk="<unk>", head=["<unk>"],
        train_kw=dict(end_of_word_suffix="</w>", limit_alphabet=120), model_kw=dict(fuse_unk=True),
        covers=["BPE end_of_word_suffix '</w>' (CLIP style), unk <unk> fuse_unk=true", "pre_tokenizer Whitespace",
                "normalizer Lowercase", "decoder BPEDecoder(suffix '</w>')"]),
    "subword_prefix_bpe": lambda: simple_bpe(
        "subword_prefix_bpe", normalizers.Sequence([normalizers.NFKD(), normalizers.Lowercase()]),
        pre_tokenizers.WhitespaceSplit(), decoders.WordPiece(prefix="##", cleanup=False),
        byte_level=False, vocab_size=700, unk="[UNK]", head=["[UNK]"],
        train_kw=dict(continuing_subword_prefix="##", limit_alphabet=120), model_kw=dict(fuse_unk=False),
        covers=["BPE continuing_subword_prefix '##', unk [UNK] fuse_unk=false", "pre_tokenizer WhitespaceSplit",
                "normalizer Sequence[NFKD, Lowercase]", "decoder WordPiece(##, cleanup=false)"]),
    "norm_nfkc_lower": lambda: simple_bpe(
        "norm_nfkc_lower", normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]),
        bl(False, True), decoders.ByteLevel(),
        covers=["normalizer Sequence[NFKC, Lowercase]", "pre_tokenizer ByteLevel(use_regex=true)"]),
    "norm_replace_prepend": lambda: simple_bpe(
        "norm_replace_prepend",
        normalizers.Sequence([normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(r"\d"), "0"),
                              normalizers.Replace("\t", "    "), normalizers.Prepend(">>")]),
        bl(False, True), decoders.ByteLevel(),
        covers=["normalizer Sequence[Strip, Replace(regex \\d -> 0), Replace(string tab -> 4 spaces), "
                "Prepend('>>')]"]),
    "unigram": build_unigram,
    "wordpiece_bert": build_wordpiece_bert,
    "added_flags": build_added_flags,
}
# tokenizer -> model_type of the config it is checked with
FAMILY_TRANSFORMERS_CHECK = {"qwen3": "qwen3_moe", "deepseek_v3": "deepseek_v3", "mixtral": "mixtral",
                             "metaspace": "mistral"}


def added_tokens_decoder(tok: Tokenizer) -> dict:
    out = {}
    for i, t in sorted(tok.get_added_tokens_decoder().items()):
        out[str(i)] = {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                       "single_word": t.single_word, "special": t.special}
    return out


# ---------------------------------------------------------------------------
# ERNIE: a SentencePiece tokenizer.model only
# ---------------------------------------------------------------------------
ERNIE_USER_DEFINED = ["<|begin_of_sentence|>", "<|end_of_sentence|>", "<|IMAGE_START|>", "<|IMAGE_END|>",
                      "<think>", "</think>"]
ERNIE_CONTROL = [f"<mask:{i}>" for i in range(8)] + ["<|IMAGE_PLACEHOLDER|>"]


def build_ernie_model() -> bytes:
    spm.set_random_generator_seed(SEED)
    buf = io.BytesIO()
    lines = [s for s in train_lines() if s.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, model_type="bpe", vocab_size=1000,
        byte_fallback=True, character_coverage=0.9995, split_digits=True, allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", add_dummy_prefix=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
        control_symbols=ERNIE_CONTROL, user_defined_symbols=ERNIE_USER_DEFINED, num_threads=1,
        max_sentence_length=16384, minloglevel=2, train_extremely_large_corpus=False)
    return buf.getvalue()


ERNIE_CONFIG = {
    "add_bos_token": False,
    "add_eos_token": False,
    "additional_special_tokens": None,
    "bos_token": "<s>",
    "chat_template": "@ernie",
    "clean_up_tokenization_spaces": False,
    "cls_token": "<|begin_of_sentence|>",
    "eos_token": "</s>",
    "header_end_token": "<mask:7>",
    "header_start_token": "<mask:6>",
    "mask_token": "<mask:1>",
    "model_max_length": 131072,
    "pad_token": "<unk>",
    "sep_token": "<|end_of_sentence|>",
    "sys_end_token": "<mask:5>",
    "sys_start_token": "<mask:4>",
    "tokenizer_class": "Ernie4_5_Tokenizer",
    "unk_token": "<unk>",
}


# ---------------------------------------------------------------------------
# Goldens
# ---------------------------------------------------------------------------
def versions() -> dict:
    return {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
            "sentencepiece": spm.__version__, "jinja2": jinja2.__version__}


def compact_case(c: dict, joined: bool = False) -> dict:
    """Drop the fields that equal their base (see README: absent = same as).  The joined
    corpus keeps only ids, decode and roundtrip (size)."""
    if joined:
        return {"ids": c["ids"], "decode": c["decode"], "roundtrip": c["roundtrip"]}
    out = {"ids": c["ids"]}
    if c["ids_plain"] != c["ids"]:
        out["ids_plain"] = c["ids_plain"]
    if c["ids_split_special"] != c["ids_plain"]:
        out["ids_split_special"] = c["ids_split_special"]
    if not joined:
        out["tokens"] = c["tokens"]
    out["decode"] = c["decode"]
    if c["decode_skip"] != c["decode"]:
        out["decode_skip"] = c["decode_skip"]
    out["roundtrip"] = c["roundtrip"]
    return out


def hf_case(tok: Tokenizer, text: str) -> dict:
    tok.encode_special_tokens = False
    enc = tok.encode(text)
    plain_ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = True
    split_ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    ids = enc.ids
    return {
        "ids": ids,
        "ids_plain": plain_ids,
        "ids_split_special": split_ids,
        "tokens": enc.tokens,
        "decode": tok.decode(ids, skip_special_tokens=False),
        "decode_skip": tok.decode(ids, skip_special_tokens=True),
        "roundtrip": tok.decode(plain_ids, skip_special_tokens=False) == text,
    }


def spm_case(sp, cfg: dict, text: str) -> dict:
    plain_ids = sp.encode(text, out_type=int)
    ids = ([sp.bos_id()] if cfg["add_bos_token"] else []) + plain_ids + ([sp.eos_id()] if cfg["add_eos_token"] else [])
    skip = [i for i in ids if not (sp.is_control(i) or sp.is_unknown(i))]
    return {
        "ids": ids,
        "ids_plain": plain_ids,
        "ids_split_special": plain_ids,
        "tokens": [sp.id_to_piece(i) for i in ids],
        "decode": sp.decode(ids),
        "decode_skip": sp.decode(skip),
        "roundtrip": sp.decode(plain_ids) == text,
    }


def transformers_case(ht, text: str) -> dict:
    ids = ht(text)["input_ids"]
    plain_ids = ht(text, add_special_tokens=False)["input_ids"]
    split_ids = ht(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return {
        "ids": ids,
        "ids_plain": plain_ids,
        "ids_split_special": split_ids,
        "tokens": ht.convert_ids_to_tokens(ids),
        "decode": ht.decode(ids, skip_special_tokens=False),
        "decode_skip": ht.decode(ids, skip_special_tokens=True),
        "roundtrip": ht.decode(plain_ids, skip_special_tokens=False) == text,
    }


def load_transformers(d: Path, model_type: str | None):
    from transformers import AutoConfig, AutoTokenizer
    kw = {"config": AutoConfig.for_model(model_type)} if model_type else {}
    transformers.logging.set_verbosity_error()
    return AutoTokenizer.from_pretrained(str(d), **kw)


def compare_cases(a: list[dict], b: list[dict]) -> list[dict]:
    """Field-by-field differences; the last entry of each list is the joined corpus."""
    diffs = []
    for i, (x, y) in enumerate(zip(a, b)):
        for k in x:
            if x[k] != y[k]:
                diffs.append({"case": i if i < len(a) - 1 else "joined", "field": k,
                              "tokenizers": x[k], "transformers": y[k]})
    return diffs


def errors_section(tok: Tokenizer) -> dict:
    V = tok.get_vocab_size(with_added_tokens=True)
    ids = [tok.token_to_id(tok.id_to_token(0)), V, V + 100]
    return {
        "vocab_size": V,
        "decode_out_of_range": {"ids": ids, "tokenizers_decode": tok.decode(ids, skip_special_tokens=False),
                                "note": "tokenizers silently skips ids >= vocab_size; moe::text throws"},
        "id_to_token_out_of_range": {"id": V, "tokenizers": tok.id_to_token(V)},
    }


def template_source(name: str) -> str:
    return (TEMPLATE_DIR / f"{name}.jinja").read_text(encoding="utf-8")


def finish_config(cfg: dict | None) -> dict | None:
    if cfg is None:
        return None
    cfg = dict(cfg)
    ct = cfg.get("chat_template")
    if isinstance(ct, str) and ct.startswith("@"):
        cfg["chat_template"] = template_source(ct[1:])
    return dict(sorted(cfg.items()))


def save_tokenizer_dir(d: Path, tok: Tokenizer, cfg: dict | None) -> list[str]:
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / "tokenizer.json").write_text(canonical_tokenizer_json(tok), encoding="utf-8")
    files = ["tokenizer.json"]
    if cfg is not None:
        write_json(d / "tokenizer_config.json", cfg, pretty=True)
        files.append("tokenizer_config.json")
    return files


def generate_tokenizers(texts: list[str], only=None) -> dict:
    joined = "\n".join(texts)
    records = {}
    for name, builder in BUILDERS.items():
        if only and name not in only:
            continue
        print(f"== tokenizer {name}", flush=True)
        b = builder()
        tok = b["tokenizer"]
        cfg = finish_config(b["config"])
        d = TOK_DIR / name
        files = save_tokenizer_dir(d, tok, cfg)
        # Goldens from the saved file (what the C++ reads), not the in-memory object.
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        cases = [hf_case(tok, t) for t in texts]
        joined_case = hf_case(tok, joined)
        notes = []
        source = "tokenizers"
        tdiffs, bare = [], None
        if name in FAMILY_TRANSFORMERS_CHECK:
            # As users load it: from a model directory, i.e. with the model's config (its
            # model_type picks the tokenizer class).  Must agree with `tokenizers`.
            model_type = FAMILY_TRANSFORMERS_CHECK[name]
            ht = load_transformers(d, model_type)
            tcases = [transformers_case(ht, t) for t in texts]
            tjoined = transformers_case(ht, joined)
            assert len(ht) == tok.get_vocab_size(with_added_tokens=True), (name, len(ht))
            tdiffs = compare_cases(cases + [joined_case], tcases + [tjoined])
            notes.append(f"transformers AutoTokenizer with a {model_type} config (as from a model directory) loads "
                         f"{type(ht).__name__}: "
                         + ("identical to tokenizers on every case and field (ids, split_special_tokens=True, "
                            "tokens, decode, skip_special_tokens)" if not tdiffs else
                            f"{len(tdiffs)} differing fields; the goldens hold transformers' values, "
                            "'transformers_diff' lists the tokenizers values"))
            if tdiffs:
                cases, joined_case, source = tcases, tjoined, "transformers"
            # The bare directory (no config.json): transformers 5 trusts tokenizer_class and
            # may rebuild the pipeline (LlamaTokenizer does).  Informational only.
            hb = load_transformers(d, None)
            bdiffs = compare_cases(cases + [joined_case], [transformers_case(hb, t) for t in texts + [joined]])
            if bdiffs:
                idx = sorted({x["case"] for x in bdiffs}, key=lambda c: (isinstance(c, str), str(c) if isinstance(c, str) else c))
                fields = sorted({x["field"] for x in bdiffs})
                bare = {"class": type(hb).__name__, "cases": idx, "fields": fields}
                notes.append(f"transformers AutoTokenizer on the bare directory (no config.json) loads "
                             f"{type(hb).__name__}, which rebuilds the pipeline from tokenizer_class: it differs "
                             f"on {len(idx)} texts (fields {', '.join(fields)}); see 'transformers_bare_dir'")
            else:
                notes.append(f"transformers AutoTokenizer on the bare directory (no config.json) loads "
                             f"{type(hb).__name__}: identical too")
        rec = {
            "name": name,
            "files": files,
            "source": source,
            "versions": versions(),
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "covers": b["covers"],
            "notes": notes,
            "errors": errors_section(tok),
            "cases": [compact_case(c) for c in cases],
            "joined": compact_case(joined_case, joined=True),
        }
        if tdiffs:
            rec["transformers_diff"] = tdiffs
        if bare:
            rec["transformers_bare_dir"] = bare
        write_json(d / "golden.json", rec)
        records[name] = {k: rec[k] for k in ("name", "files", "source", "vocab_size", "covers", "notes")}
    if not only or "ernie" in only:
        records["ernie"] = generate_ernie(texts, joined)
    return records


def generate_ernie(texts, joined) -> dict:
    print("== tokenizer ernie (sentencepiece)", flush=True)
    d = TOK_DIR / "ernie"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / "tokenizer.model").write_bytes(build_ernie_model())
    cfg = finish_config(ERNIE_CONFIG)
    write_json(d / "tokenizer_config.json", cfg, pretty=True)
    sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    cases = [spm_case(sp, cfg, t) for t in texts]
    V = sp.get_piece_size()
    types = {}
    for i in range(V):
        kind = ("control" if sp.is_control(i) else "unknown" if sp.is_unknown(i) else
                "byte" if sp.is_byte(i) else "unused" if sp.is_unused(i) else None)
        if kind is None and sp.id_to_piece(i) in ERNIE_USER_DEFINED:
            kind = "user_defined"
        if kind:
            types.setdefault(kind, []).append(i)
    notes = [
        "ids from sentencepiece's own encode (sp.encode(text)); 'ids' adds BOS/EOS only as tokenizer_config's "
        "add_bos_token/add_eos_token say (both false here, so ids == ids_plain)",
        "sentencepiece never parses control symbols (<s>, </s>, <mask:N>) in text: they encode as ordinary "
        "pieces; user-defined symbols (<|begin_of_sentence|>, <think>, ...) are always matched; so "
        "ids_split_special == ids_plain",
        "decode: sp.decode(ids) (control pieces decode to nothing, <unk> to ' ⁇ '); decode_skip: sp.decode of "
        "the ids that are neither control nor unknown",
    ]
    notes += ernie_transformers_notes(d, sp, texts)
    rec = {
        "name": "ernie",
        "files": ["tokenizer.model", "tokenizer_config.json"],
        "source": "sentencepiece",
        "versions": versions(),
        "vocab_size": V,
        "piece_types": types,
        "covers": ["SentencePiece BPE tokenizer.model (protobuf), byte_fallback=true, identity normalization, "
                   "add_dummy_prefix=true, remove_extra_whitespaces=false, split_digits=true",
                   "control symbols <mask:0>..<mask:7> <|IMAGE_PLACEHOLDER|>; user-defined symbols "
                   + " ".join(ERNIE_USER_DEFINED)],
        "notes": notes,
        "cases": [compact_case(c) for c in cases],
        "joined": compact_case(spm_case(sp, cfg, joined), joined=True),
    }
    write_json(d / "golden.json", rec)
    return {k: rec[k] for k in ("name", "files", "source", "vocab_size", "covers", "notes")}


def ernie_transformers_notes(d: Path, sp, texts) -> list[str]:
    """What transformers makes of the directory (informational; the goldens are sentencepiece's)."""
    from transformers import AutoTokenizer
    try:
        ht = AutoTokenizer.from_pretrained(str(d))
    except Exception as exc:  # noqa: BLE001
        return [f"transformers AutoTokenizer cannot load this directory offline ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200]}); the published repo needs trust_remote_code"]
    same = diff = 0
    first = None
    for t in texts:
        a = sp.encode(t, out_type=int)
        b = ht(t, add_special_tokens=False)["input_ids"]
        if a == b:
            same += 1
        else:
            diff += 1
            first = first or t
    with_special = ht("hi")["input_ids"]
    return [f"transformers AutoTokenizer loads it as {type(ht).__name__}: add_special_tokens=False ids equal "
            f"sentencepiece's on {same}/{same + diff} corpus lines"
            + (f" (first difference: {first!r})" if first else "")
            + f"; tokenizer('hi') = {with_special}"]


# ---------------------------------------------------------------------------
# Chat cases
# ---------------------------------------------------------------------------
SYS = "You are a concise assistant."
TOOL_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a location (°C or °F).",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}
TOOL_SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 5}},
            "required": ["query"],
        },
        "return": {"type": "array", "items": {"type": "string"}},
    },
}
TOOLS = [TOOL_WEATHER, TOOL_SEARCH]


def call(name, args, cid="call00001"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def u(text):
    return {"role": "user", "content": text}


def a(text, **kw):
    return {"role": "assistant", "content": text, **kw}


def s(text):
    return {"role": "system", "content": text}


def tool_msg(content, cid="call00001", name="get_weather"):
    return {"role": "tool", "tool_call_id": cid, "name": name, "content": content}


WEATHER = '{"temperature": 21, "condition": "sunny"}'


def chat_cases() -> list[dict]:
    C = []

    def case(name, messages, add_generation_prompt=True, tools=None, kwargs=None, note=None):
        c = {"name": name, "messages": messages}
        if tools is not None:
            c["tools"] = tools
        c["add_generation_prompt"] = add_generation_prompt
        c["kwargs"] = kwargs or {}
        if note:
            c["note"] = note
        C.append(c)

    case("system_user", [s(SYS), u("What is the capital of France?")])
    case("user_only", [u("Hello!")])
    case("user_only_no_gen", [u("Hello!")], add_generation_prompt=False)
    case("multi_turn", [s(SYS), u("Hi, who are you?"), a("I am a small test model."), u("What can you do?")])
    case("multi_turn_closed", [u("Ping"), a("Pong"), u("Ping again"), a("Pong again")], add_generation_prompt=False)
    case("only_system", [s(SYS)])
    case("thinking_off", [u("What is 17 * 3?")], kwargs={"enable_thinking": False})
    case("thinking_on", [u("What is 17 * 3?")], kwargs={"enable_thinking": True})
    case("reasoning_history", [u("What is 2 + 2?"),
                               a("2 + 2 = 4.", reasoning_content="Add two and two.\nThat is four."),
                               u("And 3 + 3?")])
    case("reasoning_last", [u("What is 2 + 2?"), a("4", reasoning_content="Simple addition.")],
         add_generation_prompt=False)
    case("think_in_content", [u("What is 2 + 2?"), a("<think>\nFirst add 2 and 2.\n</think>\n\n2 + 2 = 4."),
                              u("Thanks!")])
    case("thinking_alias", [u("Name a colour."), {"role": "assistant", "content": "Blue.", "thinking": "Pick one."}],
         add_generation_prompt=False, note="'thinking' instead of 'reasoning_content': transformers copies it to "
                                           "reasoning_content (and keeps thinking) before rendering")
    case("tools_system", [s(SYS), u("What's the weather in Paris?")], tools=TOOLS)
    case("tools_no_system", [u("What's the weather in Paris?")], tools=TOOLS)
    case("tool_call_dict_args", [u("What's the weather in Paris?"),
                                 a("", tool_calls=[call("get_weather", {"location": "Paris, France",
                                                                        "unit": "celsius"})]),
                                 tool_msg(WEATHER)], tools=TOOLS)
    case("tool_call_string_args", [u("Weather in Tokyo?"),
                                   a("Let me check.", tool_calls=[call("get_weather", '{"location": "Tokyo, Japan"}')]),
                                   tool_msg('{"temperature": 18}')], tools=TOOLS)
    case("tool_call_null_content", [u("Weather in Oslo?"),
                                    a(None, tool_calls=[call("get_weather", {"location": "Oslo, Norway"})]),
                                    tool_msg("Cloudy, 9 degrees")], tools=TOOLS,
         note="content null: transformers drops message keys whose value is None before rendering")
    case("parallel_tool_calls", [u("Weather in Paris and Rome?"),
                                 a("", tool_calls=[call("get_weather", {"location": "Paris"}, "call00001"),
                                                   call("get_weather", {"location": "Rome"}, "call00002")]),
                                 tool_msg("Paris: 21", "call00001"), tool_msg("Rome: 25", "call00002"),
                                 a("Paris is 21 degrees and Rome is 25.")], tools=TOOLS, add_generation_prompt=False)
    case("multi_step_tools", [u("Find the docs on routing, then the weather in Lima."),
                              a("", tool_calls=[call("search_docs", {"query": "routing", "limit": 2}, "call00001")]),
                              tool_msg('["routing.md", "experts.md"]', "call00001", "search_docs"),
                              a("", tool_calls=[call("get_weather", {"location": "Lima"}, "call00002")]),
                              tool_msg("Lima: 19", "call00002")], tools=TOOLS)
    case("content_parts", [u([{"type": "text", "text": "Describe this:"}, {"type": "text", "text": "a red apple"}])])
    case("system_parts", [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, u("Hi")])
    case("empty_content", [u(""), a(""), u("ok")])
    case("unicode", [s("Réponds en français 🇫🇷"), u("東京の天気は？ 😀 مرحبا नमस्ते")])
    case("special_tokens_in_content", [u("Ignore <|im_start|>system and <｜User｜> and [INST] and </s> please")],
         note="control-token strings inside content render verbatim; tokenize=True then parses them as special")
    case("whitespace_content", [s("  padded system  \n"), u("\n  hi there  \n\n")])
    case("two_users", [u("First question"), u("Second question")])
    case("assistant_first", [a("Hello, how can I help?"), u("Tell me a joke.")])
    case("bad_tool_call_id", [u("Weather?"), a("", tool_calls=[call("get_weather", {"location": "Bern"}, "abc")]),
                              tool_msg("Bern: 15", "abc")], tools=TOOLS)
    case("typed_args", [u("Forecast for Oslo"),
                        a("", tool_calls=[call("get_weather", {"location": "Oslo", "days": 3, "detailed": True,
                                                               "threshold": 0.5, "note": None, "tags": ["rain", "wind"],
                                                               "extra": {"b": 1, "a": [1, 2]}})])],
         tools=TOOLS, add_generation_prompt=False,
         note="argument values of every JSON type; keys deliberately not sorted; a null inside arguments is kept")
    case("builtin_tools", [u("Search for the tallest building"),
                           a("", tool_calls=[call("brave_search", {"query": "tallest building"})]),
                           tool_msg("Burj Khalifa, 828 m", name="brave_search")],
         kwargs={"builtin_tools": ["brave_search", "wolfram_alpha"]})
    case("override_bos", [u("hi")], kwargs={"bos_token": "<BOS-OVERRIDE>"},
         note="kwargs override the tokenizer's special tokens of the same name")
    case("long_conversation", [u(f"Question {i}") if i % 2 == 0 else a(f"Answer {i}") for i in range(10)] + [u("Last")])
    case("prefill", [u("Complete the sentence."), a("The answer is")], add_generation_prompt=False)
    case("extra_kwarg", [u("hi")], kwargs={"extra_flag": "yes", "enable_thinking": False})
    return C


# Templates rendered for the goldens: name -> where transformers gets the template and the
# special tokens from.  "dir": a tokenizer directory (loaded with AutoTokenizer and that model
# type's config); "special": special tokens for an in-memory tokenizer (template file).
LLAMA3_DATE = "26 Jul 2024"
CHAT_TEMPLATES = {
    "qwen3": {"dir": "qwen3", "ids": True},
    "deepseek_v3": {"dir": "deepseek_v3", "ids": True},
    "mixtral": {"dir": "mixtral", "ids": True},
    "mistral_tools": {"dir": "metaspace", "ids": True},
    "ernie": {"dir": "ernie", "ids": False},
    "llama3": {"file": "llama3", "special": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
               "extra_kwargs": {"date_string": LLAMA3_DATE}},
    "gemma": {"file": "gemma", "special": {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
                                           "pad_token": "<pad>"}},
    "phi_macro": {"file": "phi_macro", "special": {"bos_token": "<s>", "eos_token": "<|endoftext|>",
                                                   "unk_token": "<unk>", "pad_token": "<|endoftext|>"}},
    "jinja_features": {"file": "jinja_features", "special": {"bos_token": "<s>", "eos_token": "</s>"}},
    "named_templates": {"dir": "named_templates", "ids": False},
    "jinja_file": {"dir": "jinja_file", "ids": False},
}
DIR_MODEL_TYPE = {"qwen3": "qwen3_moe", "deepseek_v3": "deepseek_v3", "mixtral": "mixtral", "metaspace": "mistral",
                  "ernie": "ernie4_5_moe", "named_templates": "qwen3_moe", "jinja_file": "qwen3_moe"}
DECOY_TEMPLATE = ("{{ raise_exception('tokenizer_config.json chat_template must not be used when "
                  "chat_template.jinja exists') }}")


def make_template_dirs() -> None:
    """Two qwen3-tokenizer directories that test where templates come from."""
    src = TOK_DIR / "qwen3"
    base_cfg = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    d = TOK_DIR / "named_templates"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    shutil.copy(src / "tokenizer.json", d / "tokenizer.json")
    cfg = dict(base_cfg)
    cfg["chat_template"] = [{"name": "default", "template": template_source("chatml")},
                            {"name": "tool_use", "template": template_source("qwen3")}]
    write_json(d / "tokenizer_config.json", cfg, pretty=True)
    d = TOK_DIR / "jinja_file"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    shutil.copy(src / "tokenizer.json", d / "tokenizer.json")
    cfg = dict(base_cfg)
    cfg["chat_template"] = DECOY_TEMPLATE
    write_json(d / "tokenizer_config.json", cfg, pretty=True)
    (d / "chat_template.jinja").write_text(template_source("chatml"), encoding="utf-8")


def template_tokenizer(name: str, spec: dict):
    from transformers import PreTrainedTokenizerFast
    if "dir" in spec:
        return load_transformers(TOK_DIR / spec["dir"], DIR_MODEL_TYPE[spec["dir"]])
    # A template file with an in-memory tokenizer that carries the family's special tokens
    # (only the template's text is golden here, so any vocabulary will do).
    ht = PreTrainedTokenizerFast(tokenizer_file=str(TOK_DIR / "bytelevel_gpt2" / "tokenizer.json"), **spec["special"])
    ht.chat_template = template_source(spec["file"])
    return ht


def render_case(ht, c: dict, extra_kwargs: dict, tokenize: bool):
    kwargs = {**extra_kwargs, **c["kwargs"]}
    return ht.apply_chat_template(copy.deepcopy(c["messages"]), tools=copy.deepcopy(c.get("tools")),
                                  add_generation_prompt=c["add_generation_prompt"], tokenize=tokenize,
                                  return_dict=False, **kwargs)


def selected_template_name(ht, c) -> str | None:
    if not isinstance(ht.chat_template, dict):
        return None
    return "tool_use" if c.get("tools") is not None and "tool_use" in ht.chat_template else "default"


def generate_chat() -> dict:
    make_template_dirs()
    cases = chat_cases()
    write_json(OUT / "chat_cases.json", {
        "notes": [
            "messages are passed to transformers' apply_chat_template exactly as stored here; transformers first "
            "drops message keys whose value is null and copies 'thinking'/'reasoning' to 'reasoning_content'",
            "tools: absent means tools=None (the template still sees a variable 'tools' that is none)",
            "kwargs become template variables and override special tokens of the same name",
        ],
        "cases": cases}, pretty=True)
    results, templates = [], {}
    for tname, spec in CHAT_TEMPLATES.items():
        print(f"== chat template {tname}", flush=True)
        ht = template_tokenizer(tname, spec)
        extra = spec.get("extra_kwargs", {})
        info = {"source": (f"templates/{spec['file']}.jinja" if "file" in spec else
                           f"tokenizers/{spec['dir']}/" + ("chat_template.jinja" if spec["dir"] == "jinja_file"
                                                           else "tokenizer_config.json")),
                "tokenizer": f"tokenizers/{spec['dir']}" if "dir" in spec else None,
                "special_tokens": ht.special_tokens_map,
                "extra_kwargs": extra}
        if "dir" in spec and spec["dir"] not in ("named_templates", "jinja_file"):
            cfg_t = json.loads((TOK_DIR / spec["dir"] / "tokenizer_config.json").read_text(encoding="utf-8"))
            assert cfg_t["chat_template"] == template_source(tname if tname != "mistral_tools" else "mistral_tools")
            info["same_as"] = f"templates/{tname}.jinja"
        if spec.get("dir") == "jinja_file":
            assert ht.chat_template == template_source("chatml"), "chat_template.jinja must win over the config"
            info["same_as"] = "templates/chatml.jinja"
        if spec.get("dir") == "named_templates":
            info["named"] = {"default": "templates/chatml.jinja", "tool_use": "templates/qwen3.jinja"}
        templates[tname] = info
        for c in cases:
            r = {"template": tname, "case": c["name"]}
            name = selected_template_name(ht, c)
            if name:
                r["template_name"] = name
            try:
                r["text"] = render_case(ht, c, extra, tokenize=False)
            except Exception as exc:  # noqa: BLE001 - the error is the golden
                r["error"] = str(exc)
                r["error_type"] = type(exc).__name__
                results.append(r)
                continue
            if spec.get("ids"):
                ids = render_case(ht, c, extra, tokenize=True)
                assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), type(ids)
                # apply_chat_template(tokenize=True) == tokenizer(text, add_special_tokens=False)
                assert ids == ht(r["text"], add_special_tokens=False)["input_ids"], (tname, c["name"])
                r["ids"] = ids
            results.append(r)
    n_err = sum("error" in r for r in results)
    golden = {
        "versions": versions(),
        "notes": [
            "text: transformers' tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=..., "
            "tokenize=False, **kwargs) with the tokenizer named in 'templates' (its special tokens and chat "
            "template); error/error_type where rendering raises (message of the Python exception)",
            "ids: the same call with tokenize=True (return_dict=False); transformers tokenizes the rendered text "
            "with add_special_tokens=False, so BOS appears only if the template writes it (checked: equal to "
            "tokenizer(text, add_special_tokens=False))",
            "the effective template kwargs are {**templates[t].extra_kwargs, **case.kwargs}; llama3 always gets "
            f"date_string={LLAMA3_DATE!r} so that strftime_now is never called",
            "template variables: messages, tools (None when absent), documents (None), add_generation_prompt, "
            "the special_tokens map of the template's tokenizer, then the kwargs",
            "named_templates: transformers picks 'tool_use' when tools is not None, else 'default' "
            "(template_name records which)",
        ],
        "templates": templates,
        "counts": {"results": len(results), "errors": n_err},
        "results": results,
    }
    write_json(OUT / "chat_golden.json", golden)
    return golden


# ---------------------------------------------------------------------------
# README
# ---------------------------------------------------------------------------
README_HEAD = """# Text fixtures: tokenizers and chat templates

Reference data for `moe::text` (src/text/): tokenizer goldens computed with Hugging Face
`tokenizers` / `sentencepiece` / `transformers`, and chat-template goldens computed with
transformers' `apply_chat_template`.  The C++ tests (tests/text/) read these files; nothing
here is needed at run time.

Regenerate (developers only; creates tools/.venv with pinned versions, no network except
PyPI, nothing is downloaded from the Hub):

    tools/gen_text_fixtures.sh            # everything (~1 minute on one core)
    tools/gen_text_fixtures.sh --only qwen3 unigram   # some tokenizers, while iterating

The output is deterministic (fixed seeds; single-threaded training): rerunning gives
byte-identical files.  `jinja_cases.json` in this directory comes from a different
generator (tools/gen_jinja_cases.py) and is not touched by this one.

Versions: {versions}.

All tokenizers were trained here (on the corpus plus seeded synthetic text) and all
templates were written here; each family's tokenizer copies the *structure* of the
published tokenizer.json (normalizer, pre-tokenizer regexes, model options, decoder,
post-processor, added tokens and their flags), not its vocabulary.

## Layout

    corpus.json                       JSON list of the {n_texts} test texts
    tokenizers/<name>/tokenizer.json  (tokenizers' own serialization, compact)
    tokenizers/<name>/tokenizer_config.json   family tokenizers only
    tokenizers/ernie/tokenizer.model  SentencePiece model (no tokenizer.json)
    tokenizers/<name>/golden.json     goldens for every corpus text + the joined corpus
    tokenizers/named_templates/       qwen3 tokenizer; chat_template is a list of named templates
    tokenizers/jinja_file/            qwen3 tokenizer; chat_template.jinja next to a decoy
                                      chat_template in tokenizer_config.json (the file wins)
    templates/<name>.jinja            chat templates (hand-written inputs of the generator)
    chat_cases.json                   {n_cases} chat requests
    chat_golden.json                  apply_chat_template for every template x case

## corpus.json

A JSON list of strings (so "\\r\\n", tabs, a lone "\\r", trailing spaces and invisible
code points survive exactly): English prose with contractions, Python/C++ with
indentation and tabs, Chinese, Japanese (kana, kanji, half-width katakana, combining
dakuten), Korean (syllables and jamo), Arabic, Hindi, Cyrillic, Greek, Hebrew, Thai,
Vietnamese, emoji (ZWJ families, skin tones, flags, keycaps, variation selectors), digit
runs, whitespace runs (leading/trailing spaces, tabs, CRLF, lone CR, NBSP, U+3000,
U+2028/2029, U+0085, VT/FF), special-token strings inside text, unusual Unicode
(combining marks without base, U+200B/200C/200D, U+FEFF, RTL controls, U+FFFE/U+FFFF,
private use, U+10FFFF, NFC vs NFD é, Å/Å/Å, ligatures, fullwidth, Ⅻ, superscripts,
U+0000 and C0 controls, unassigned code points, U+FFFD), the empty string, " ",
"\\n\\n\\n", and five lines with the 32 `<xNN>` added tokens of `added_flags` in
different contexts.  The "joined" golden is `"\\n".join(corpus)` as one text.
"""

README_GOLDEN = """
## tokenizers/<name>/golden.json

    {
      "name", "files", "source",       source: "tokenizers" | "sentencepiece" (whose values these are)
      "versions": {tokenizers, transformers, sentencepiece, jinja2},
      "vocab_size",                    tokenizer.get_vocab_size(with_added_tokens=True) / sp.get_piece_size()
      "covers": [...], "notes": [...],
      "errors": {"vocab_size", "decode_out_of_range": {"ids", "tokenizers_decode", "note"},
                 "id_to_token_out_of_range": {"id", "tokenizers"}},      (tokenizer.json only)
      "piece_types": {"control": [ids], "user_defined": [...], "byte": [...], "unknown": [...]}  (ernie)
      "transformers_bare_dir": {"class", "cases", "fields"}   (only where that differs, see below)
      "cases": [ one per corpus.json entry, same order ],
      "joined": {"ids", "decode", "roundtrip"}     the joined corpus (no tokens, to save space)
    }

Each case:

    "ids"                encode(text).ids, add_special_tokens=True (BOS/EOS of the post-processor)
    "ids_plain"          add_special_tokens=False                       ABSENT = same as "ids"
    "ids_split_special"  add_special_tokens=False, special added tokens read as plain text
                         (tokenizers' `tokenizer.encode_special_tokens = True`, the setting
                         transformers' `split_special_tokens=True` sets; non-special added
                         tokens such as Qwen's <think> are still matched)   ABSENT = same as "ids_plain"
    "tokens"             encode(text).tokens (the Encoding's token strings)
    "decode"             decode(ids, skip_special_tokens=False)
    "decode_skip"        decode(ids, skip_special_tokens=True)         ABSENT = same as "decode"
    "roundtrip"          decode(ids_plain) == text

Fields are omitted when equal to their base only to keep the files small (< 3 MB in all).

`tokens` caveat: for an added token with lstrip/rstrip, `tokenizers` reports the matched
span, whitespace included (e.g. " <x04>", "<x02> "), not the vocabulary string; everywhere
else tokens[i] == id_to_token(ids[i]).

For sentencepiece (ernie): ids_plain = sp.encode(text); ids = ids_plain with BOS/EOS only if
tokenizer_config.json's add_bos_token/add_eos_token (both false, so ids == ids_plain);
ids_split_special == ids_plain (sentencepiece never parses control symbols in text and
always matches user-defined ones); tokens = sp.id_to_piece; decode = sp.decode(ids)
(control pieces decode to nothing, <unk> to " ⁇ "); decode_skip = sp.decode of the ids that
are neither control nor unknown.
"""

README_TRANSFORMERS = """
## tokenizers vs transformers

For the family tokenizers (qwen3, deepseek_v3, mixtral, metaspace) the generator also loads
the directory with transformers' `AutoTokenizer` the way users get it, i.e. from a model
directory: `AutoTokenizer.from_pretrained(dir, config=AutoConfig.for_model(model_type))`
(qwen3_moe, deepseek_v3, mixtral, mistral).  ids, ids_plain, split_special_tokens=True,
tokens (convert_ids_to_tokens), decode and skip_special_tokens decode are compared on every
case: **identical for all four**, so the goldens are the `tokenizers` values.

Without a config (the bare directory), transformers 5 trusts `tokenizer_class` in
tokenizer_config.json.  For `LlamaTokenizer` (mixtral, metaspace) it keeps only the vocab,
merges and post-processor of tokenizer.json and rebuilds the rest (Metaspace pre-tokenizer,
prepend_scheme "always" when legacy=true, else "first"; decoder Replace/ByteFallback/Fuse/Strip).
That changes mixtral's ids for texts that start with spaces (the Prepend normalizer adds
a "▁" even before an existing one; Metaspace "always" does not): those texts are listed in
mixtral's golden.json "transformers_bare_dir" (informational).  For metaspace the rebuilt
pipeline happens to be equivalent.  DeepSeek's
LlamaTokenizerFast + ByteLevel tokenizer.json is detected and loaded as TokenizersBackend
(identical).  Qwen2Tokenizer rebuilds an identical pipeline.

ernie: transformers 5.24 loads tokenizer.model as TokenizersBackend (converted); it gives
the same ids as sentencepiece except where the text contains the config's special tokens
(<s>, </s>, <unk>, ...), which transformers parses as special tokens (see ernie's notes).
tokenizer("hi") adds no BOS (add_bos_token false).

Observed `tokenizers` behaviours worth replicating:
- decode() silently skips ids >= vocab_size (moe::text throws instead; see "errors");
- Lowercase is per code point (Rust char::to_lowercase): "ΣΑΣ" -> "σασ" (no final sigma),
  "İ" -> "i̇" (two code points);
- Metaspace(prepend_scheme="first") prepends "▁" only to the first section of the text
  (not after an added token);
- the Metaspace *decoder* (prepend_scheme first/always) removes every "▁" of the first
  token, not just a leading one (a first token "▁▁" decodes to ""; after a Fuse it would
  remove all spaces, which is why no fixture puts Fuse before Metaspace);
- the Strip decoder with right > 0 panics on an empty token in tokenizers 0.23.3, so no
  fixture uses it (mixtral's Strip(" ", 1, 0) is fine).
"""

README_CHAT = """
## Chat templates

`templates/*.jinja` are inputs written for these tests, each in the style of a family's
published template (same Jinja constructs, same shape of output, own text):

| template | style / what it exercises |
|---|---|
| qwen3 | ChatML; tools block with `tojson`; `<tool_call>`/`<tool_response>`; thinking (`enable_thinking`, `reasoning_content`, `<think>` split out of content); `namespace()` with multi_step_tool/last_query_index; `messages[::-1]`; `loop.index0`; startswith/endswith/split/strip/lstrip/rstrip; content as string or list of parts (a macro) |
| deepseek_v3 | `bos_token` first; `ns = namespace(is_first, is_tool, is_output_first, system_prompt, is_first_sp)`; `{% set ns.system_prompt = ... %}` on indented lines without `-` (trim_blocks / lstrip_blocks); fullwidth-bar tool tokens; `raise_exception` for unknown roles; `not in`; `~` |
| mixtral | `[INST]`; strict user/assistant alternation via `loop.index0 % 2` + `raise_exception`; `bos_token`/`eos_token`; system folded into the first turn (`messages[1:]`) |
| ernie | "User:/Assistant:" with `cls_token`/`sep_token` (`not x is defined` defaults), `-%}` everywhere, `selectattr`/`map(attribute=)`/`join` |
| llama3 | `strftime_now("%d %b %Y")` unless `date_string` is defined; `tojson(indent=4)`; `message['content'] \\| trim` (filter binds tighter than `+`); builtin_tools with `reject('equalto', ...)`, `\\| items`; `messages = messages[1:]` reassignment; `is mapping or is iterable` |
| gemma | role mapping `{% set role = 'model' %}` inside the loop; alternation check; content parts (`is iterable`) |
| mistral_tools | `selectattr('role','equalto','system') \\| list`, `map(attribute=...)`, `\\| length`, `namespace()` + attribute set, `for key, val in tool.items() if key != "return"` (loop filter), `tojson` then `out[:-1]`, dict equality (`message == user_messages[-1]`), `tool_call.id`, `\\| string` |
| phi_macro | `{% macro %}` with default and keyword arguments, `{% call %}`/`caller()`, `{% set %}...{% endset %}` block assignment, `{% filter upper %}` |
| jinja_features | not a model's template: loop.index/index0/revindex/revindex0/first/last/length/cycle/previtem, `{% for %}{% else %}`, `break`/`continue`, loop `if` filter, slicing `[1:-1]` `[::-1]` `[:20]`, `~`, `in`/`not in`, tests defined/undefined/none/string/number/integer/float/boolean/mapping/iterable/sequence, filters trim/tojson/tojson(indent)/length/items/join/selectattr/rejectattr/map/default (and `default(x, true)`)/string/upper/lower/title/replace/first/last/list/unique/sort/int/round, dict `.items()` `.get()` `.keys()`, str `.strip()` `.split()` `.upper()` `.title()`, arithmetic `/ // % **` (`7 / 2` = 3.5, `8 / 2` = 4.0), Python reprs of lists/booleans/None (`[1, 2.5, 'x', True, None]`), set scoping (a `set` inside a loop does not leak out), whitespace control (indent before `{{` is kept, `{%+`, comment lines), `{% raw %}` |
| chatml | plain ChatML: the "default" of named_templates and the chat_template.jinja of jinja_file |

The family templates are also in their tokenizer's tokenizer_config.json "chat_template"
(qwen3, deepseek_v3, mixtral, ernie; mistral_tools in metaspace's).

### chat_cases.json

    {"notes": [...], "cases": [{"name", "messages", "tools"?, "add_generation_prompt", "kwargs", "note"?}]}

messages are OpenAI style; tool calls are `{"id", "type": "function", "function": {"name",
"arguments"}}` with arguments a dict or a JSON string; tool results are
`{"role": "tool", "tool_call_id", "name", "content"}`.

### chat_golden.json

    {
      "versions", "notes",
      "templates": {name: {"source", "tokenizer", "special_tokens", "extra_kwargs", "same_as"?, "named"?}},
      "counts": {"results", "errors"},
      "results": [{"template", "case", "template_name"?, "text" | ("error", "error_type"), "ids"?}]
    }

- text: `tok.apply_chat_template(messages, tools=tools, add_generation_prompt=...,
  tokenize=False, **kwargs)` where tok is the template's tokenizer (a directory here, or an
  in-memory tokenizer with `special_tokens` for the template files) and kwargs =
  `{**extra_kwargs, **case.kwargs}`.  llama3 always gets `date_string="26 Jul 2024"` so
  that no golden depends on the clock (`strftime_now` itself is not golden-tested).
- error, error_type: the Python exception's message and class when rendering raises:
  `TemplateError` is raise_exception (the message is the template's string);
  `TypeError`/`UndefinedError` are Python/Jinja runtime errors (message wording is Python's).
- ids (qwen3, deepseek_v3, mixtral, mistral_tools with their own tokenizers):
  `apply_chat_template(..., tokenize=True, return_dict=False)`.  transformers tokenizes
  the rendered text with add_special_tokens=False, so BOS appears exactly once when the
  template writes `bos_token` (never twice); checked equal to
  `tokenizer(text, add_special_tokens=False)`.  Special-token strings inside user content
  are parsed as special tokens there (case special_tokens_in_content).
- template_name (named_templates only): transformers uses "tool_use" when tools is not None
  and the list has one, else "default".

What transformers does around the template (the C++ renderer must do the same):
- Jinja2 ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
  extensions=[loopcontrols]) (+ its `{% generation %}` tag);
- variables: messages, tools (None when not given), documents (None),
  add_generation_prompt, then the tokenizer's special_tokens_map, then the kwargs
  (kwargs win: case override_bos).  special_tokens_map holds only the tokens that are set
  (qwen3: eos_token and pad_token, no bos_token), as strings, and includes every extra
  `<name>_token` key of tokenizer_config.json (ernie: sys_start_token, header_end_token, ...);
- before rendering, each message drops its keys whose value is None (content: null with
  tool_calls becomes "no content key"; `message.content is defined` is false), and a
  message with "thinking" or "reasoning" gets "reasoning_content" (and "thinking") copies;
- `tojson` is `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
  sort_keys=False)`: ", " and ": " separators, no HTML escaping, non-ASCII kept, keys in
  insertion order (the cases deliberately have unsorted keys: a parser that sorts keys,
  like nlohmann::json's default, changes every tools/arguments golden);
  `tojson(indent=4)` is Python's indent (newline + spaces, ", " -> ",");
- globals raise_exception(msg) (TemplateError), strftime_now(fmt) (local time),
  namespace (keys must not start with "_"), dict;
- printing a list/dict/bool/None uses Python's repr/str (`[{'type': 'text', ...}]`, True,
  None; case content_parts in llama3), floats print like Python (0.5, 4.0).
- chat_template.jinja in the directory wins over tokenizer_config.json's chat_template; a
  list of {"name", "template"} becomes a dict of named templates.

## Talking model fixtures (tests/fixtures/chat_qwen3/, tests/fixtures/chat_deepseek_v3/)

Made by tools/gen_chat_fixtures.py (run by the same gen_text_fixtures.sh, after this
generator): tiny random-weight Qwen3-MoE / DeepSeek-V3 models built with
tools/gen_fixtures.py's helpers (bf16-exact weights stored as bfloat16), vocab_size =
the qwen3 / deepseek_v3 fixture tokenizer's size, with that tokenizer.json and
tokenizer_config.json (chat template included) copied in.  config.json has
bos/eos_token_id; generation_config.json is what the goldens were generated with
(do_sample false; qwen3: eos [<|im_end|>, <|endoftext|>], deepseek_v3: eos
<｜end▁of▁sentence｜>).  golden/chat_greedy.json:

    {"model", "versions", "tokenizer_class", "dtype", "max_new_tokens": 12, "do_sample": false,
     "eos_token_id", "pad_token_id", "notes",
     "prompts": [{"name", "kind": "chat" | "text", "messages"?, "add_generation_prompt"?, "kwargs"?,
                  "prompt_text", "prompt_ids", "generated", "stopped_at_eos", "text",
                  "text_with_special", "generated_no_eos", "text_no_eos",
                  "text_no_eos_with_special", "generated_min_new_tokens", "top2_margin"}]}

The EOS row of lm_head is scaled so that some runs stop at EOS (see the notes), and the
texts contain U+FFFD where a generation ends inside a UTF-8 character.
"""


def write_readme(texts, records, golden) -> None:
    rows = ["| tokenizer | files | vocab | covers |", "|---|---|---|---|"]
    for name, r in records.items():
        rows.append(f"| {name} | {', '.join(r['files'])} | {r['vocab_size']} | "
                    + "; ".join(c.replace("|", "\\|") for c in r["covers"]) + " |")
    v = versions()
    head = README_HEAD.format(versions=", ".join(f"{k} {x}" for k, x in v.items()),
                              n_texts=len(texts), n_cases=len(chat_cases()))
    body = (head + "\n## Tokenizers\n\nBPE vocabularies come from the generator's own deterministic BPE trainer (the "
            "algorithm and vocabulary layout of tokenizers' BpeTrainer, whose tie-breaking changes from process to "
            "process), unigram's pieces and scores from sentencepiece's unigram trainer, ernie's tokenizer.model "
            "from sentencepiece's BPE trainer; all on the corpus (x3) plus 600 seeded synthetic lines.  The "
            "tokenizer.json files are written by `tokenizers` itself (Tokenizer.to_str()).\n\n" + "\n".join(rows) + "\n"
            + README_GOLDEN + README_TRANSFORMERS + README_CHAT)
    (OUT / "README.md").write_text(body, encoding="utf-8")


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="tokenizer names to regenerate (skips chat goldens and README)")
    args = ap.parse_args(argv)
    transformers.logging.set_verbosity_error()
    print(f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}, "
          f"sentencepiece {spm.__version__}, jinja2 {jinja2.__version__}")
    OUT.mkdir(parents=True, exist_ok=True)
    texts = corpus()
    assert len(texts) == len(set(texts)), "duplicate corpus entries"
    for t in texts:
        t.encode("utf-8")  # no lone surrogates
    write_json(OUT / "corpus.json", texts)
    records = generate_tokenizers(texts, only=args.only)
    if args.only:
        return 0
    golden = generate_chat()
    write_readme(texts, records, golden)
    for path in OUT.rglob("*"):
        if path.is_file() and path.name != "jinja_cases.json":
            path.chmod(0o644)
    print(f"wrote {len(records)} tokenizers, {golden['counts']['results']} chat goldens to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
