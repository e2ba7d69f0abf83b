#!/usr/bin/env python3
"""Writes a byte-level BPE tokenizer of Qwen3's vocabulary size (151,643 tokens + Qwen3's
added tokens at their ids; config vocab 151,936) into DIR: tokenizer.json and
tokenizer_config.json, for benchmarks that need a real-sized vocabulary next to a random
checkpoint (tools/gen_big_checkpoint.cpp), e.g. the structured-output decode cost
(tools/bench_structured.sh): the grammar engine's work depends on how many tokens and
what kinds of strings a vocabulary holds.

No real vocabulary is needed, and none can be fetched here, so the tokens are made to
look like one: the 256 byte characters; numbers; pseudo-words of 2-12 letters built from
syllables, lower and capitalised, with and without a leading space (most of a BPE
vocabulary); code and punctuation runs; whitespace runs (spaces, newlines, tabs); CJK
characters and pairs (multi-byte UTF-8). No merges: encoding falls back to bytes, which
is all a benchmark of token ids needs. Standard library only; deterministic (seeded).

    python3 tools/gen_big_vocab.py DIR
"""
import json
import os
import random
import sys

N_REGULAR = 151643  # Qwen3's regular tokens; the added ones follow (ids as Qwen3's)
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
         "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
         "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
         "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
         "</tool_response>", "<think>", "</think>"]
SPECIAL = 14  # the first 14 are control tokens, the rest are text (as in Qwen3's tokenizer.json)


def byte_chars():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1234)
    bc = byte_chars()
    enc = lambda s: "".join(bc[b] for b in s.encode("utf-8"))  # noqa: E731
    vocab = {}

    def add(s):
        t = enc(s)
        if t not in vocab and len(vocab) < N_REGULAR:
            vocab[t] = len(vocab)

    for b in range(256):
        vocab.setdefault(bc[b], len(vocab))
    for i in range(1000):
        add(str(i))
        add(" " + str(i))
    for n in range(2, 33):
        for ws in (" ", "\n", "\t"):
            add(ws * n)
        add("\n" + " " * n)
    punct = "(){}[]<>.,;:=+-*/_\"'#!?&|%$@^~`\\"
    while len(vocab) < 12000:
        s = "".join(rng.choice(punct) for _ in range(rng.randint(2, 3)))
        add(s)
        add(" " + s)
    cjk = [chr(c) for c in range(0x4E00, 0x4E00 + 12000)]
    for c in cjk:
        add(c)
    while len(vocab) < 32000:
        add(rng.choice(cjk) + rng.choice(cjk))
    syll = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"] + list("aeiou") + ["th", "ch", "sh", "ng", "st"]
    while len(vocab) < N_REGULAR:
        w = "".join(rng.choice(syll) for _ in range(rng.randint(1, 5)))
        r = rng.random()
        add((" " if r < 0.6 else "") + (w.capitalize() if rng.random() < 0.2 else w))
    assert len(vocab) == N_REGULAR
    added = [{"id": N_REGULAR + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": i < SPECIAL} for i, c in enumerate(ADDED)]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": vocab, "merges": []}}
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
                   "model_max_length": 131072}, f)
    print(f"{out}: {len(vocab)} regular + {len(added)} added tokens")


if __name__ == "__main__":
    main()
