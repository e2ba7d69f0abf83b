#!/usr/bin/env python3
"""Tokenizer throughput: HF `tokenizers` vs moe::text (bench/bench_tokenize.cpp), one thread.

    tools/bench_tokenize.py <tokenizer_dir> <text_file> [--bench build/bench/bench_tokenize]
                            [--repeat 5] [--mode whole|lines]

Both sides encode the same text with add_special_tokens=False, best of N runs:
  whole: the whole file as one string (tokenizer.encode(text))
  lines: every '\\n'-separated line on its own (tokenizer.encode per line, in a loop: the
         same unit of work as the C++ loop; also encode_batch on one thread, "tok.batch",
         which saves the per-call Python overhead)
The ids of `tokenizers` are written to a temporary file and the C++ binary checks its own
ids against them before timing.  RAYON_NUM_THREADS=1 keeps `tokenizers` on one thread.
Needs the `tokenizers` package (tools/.venv).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from tokenizers import Tokenizer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer_dir")
    ap.add_argument("text_file")
    ap.add_argument("--bench", default=None, help="path of the bench_tokenize binary")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mode", choices=["whole", "lines"], default="whole")
    a = ap.parse_args()

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(os.path.join(a.tokenizer_dir, "tokenizer.json"))
    load_s = time.perf_counter() - t0
    with open(a.text_file, encoding="utf-8", newline="") as f:
        text = f.read()
    nbytes = len(text.encode("utf-8"))
    units = text.split("\n") if a.mode == "lines" else [text]

    ids = [tok.encode(u, add_special_tokens=False).ids for u in units]
    ntok = sum(len(x) for x in ids)
    best_enc = best_dec = float("inf")
    for _ in range(a.repeat):
        s = time.perf_counter()
        for u in units:
            tok.encode(u, add_special_tokens=False)
        best_enc = min(best_enc, time.perf_counter() - s)
        s = time.perf_counter()
        for x in ids:
            tok.decode(x)
        best_dec = min(best_dec, time.perf_counter() - s)
    hf = {"impl": "tokenizers", "mode": a.mode, "load_s": load_s, "bytes": nbytes, "tokens": ntok,
          "encode_s": best_enc, "encode_MBps": nbytes / 1e6 / best_enc, "encode_tokps": ntok / best_enc,
          "decode_s": best_dec, "decode_tokps": ntok / best_dec}
    rows = [hf]
    if a.mode == "lines":
        # encode_batch (still one thread) saves the per-call Python overhead of the loop.
        best_b = best_db = float("inf")
        for _ in range(a.repeat):
            s = time.perf_counter()
            tok.encode_batch(units, add_special_tokens=False)
            best_b = min(best_b, time.perf_counter() - s)
            s = time.perf_counter()
            tok.decode_batch(ids)
            best_db = min(best_db, time.perf_counter() - s)
        rows.append({**hf, "impl": "tok.batch", "encode_s": best_b, "encode_MBps": nbytes / 1e6 / best_b,
                     "encode_tokps": ntok / best_b, "decode_s": best_db, "decode_tokps": ntok / best_db})

    if a.bench:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(ids if a.mode == "lines" else ids[0], f)
            ids_path = f.name
        try:
            r = subprocess.run([a.bench, a.tokenizer_dir, a.text_file, "--ids", ids_path, "--repeat",
                                str(a.repeat), "--mode", a.mode], capture_output=True, text=True)
        finally:
            os.unlink(ids_path)
        if r.stderr:
            sys.stderr.write(r.stderr)
        line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "{}"
        rows.append(json.loads(line))
        ours = rows[-1]
        if r.returncode != 0:
            print("moe::text failed or its ids differ from tokenizers'", file=sys.stderr)

    print(f"text: {a.text_file} ({nbytes / 1e6:.2f} MB, {ntok} tokens, mode {a.mode}, best of {a.repeat})")
    print(f"{'impl':<12}{'load s':>9}{'enc MB/s':>10}{'enc Mtok/s':>11}{'dec Mtok/s':>11}  ids")
    for row in rows:
        if "encode_s" not in row:
            continue
        check = ("match" if row.get("ids_match") else "DIFFER") if row["impl"] == "moe::text" else ""
        print(f"{row['impl']:<12}{row['load_s']:>9.3f}{row['encode_MBps']:>10.2f}{row['encode_tokps'] / 1e6:>11.3f}"
              f"{row['decode_tokps'] / 1e6:>11.3f}  {check}")
    if a.bench and "encode_s" in ours:
        for row in rows[:-1]:
            print(f"moe::text vs {row['impl']}: encode {row['encode_s'] / ours['encode_s']:.2f}x, "
                  f"decode {row['decode_s'] / ours['decode_s']:.2f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
