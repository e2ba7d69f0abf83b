#!/usr/bin/env python3
"""Generate src/text/unicode_tables.inc: the character classes HF `tokenizers` uses, as
that library itself reports them for every code point.

`tokenizers` takes its character data from several Rust crates of different Unicode
versions: `unicode_categories` 0.1 (punctuation, Cc/Cf/Co "other", Mn), Rust std
(is_numeric, to_lowercase), regex-syntax (\\w of the Whitespace pre-tokenizer and of
AddedToken.single_word) and unicode-normalization-alignments (NFC/NFD/NFKC/NFKD and
is_combining_mark; older than utf8proc's Unicode 15).  Rather than guess versions, this
script asks tokenizers about every code point, through its own components:

  punct          Punctuation(isolated) isolates the char
  numeric        Digits(individual_digits) isolates it
  word           Whitespace keeps it glued to the "x"s around it (\\w)
  bert_control   BertNormalizer(clean_text) removes it
  mn             BertNormalizer(strip_accents) removes it (for chars NFD leaves alone)
  combining      StripAccents removes it
  lower          Lowercase maps it (full map)
  barrier_<nf>   chars the normaliser treats as unassigned while utf8proc (asked through
                 ctypes, the library the C++ code links) does not: a
                 different one-char result, a combining class utf8proc has and
                 tokenizers does not, or a part of a composite tokenizers cannot compose.
                 src/text/unicode.cpp normalises the text between them with utf8proc and
                 leaves them as they are, which is what tokenizers does.

Run: tools/.venv/bin/python tools/gen_unicode_tables.py  (~30 s)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")

import tokenizers  # noqa: E402
from tokenizers import normalizers, pre_tokenizers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "text" / "unicode_tables.inc"
# Test golden: per-block hashes of tokenizers' one-char results over every code point, the
# class sets as ranges, and random multi-character strings through each normaliser.
GOLDEN = ROOT / "tests" / "fixtures" / "text" / "extra_unicode.json"
BLOCK = 4096
SEP = {0x01, 0x78}  # separators of the probes ("\x01", "x"); their classes are ASCII facts
CPS = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and c not in SEP]
CHUNK = 40000


def chunks():
    for i in range(0, len(CPS), CHUNK):
        yield CPS[i:i + CHUNK]


def isolated_by(pre) -> set[int]:
    out = set()
    for ch in chunks():
        s = "x" + "".join(chr(c) + "x" for c in ch)
        for piece, _ in pre.pre_tokenize_str(s):
            if len(piece) == 1 and piece != "x":
                out.add(ord(piece))
    return out


def per_char_map(norm, sep: str = "\x01") -> dict[int, str]:
    m = {}
    for ch in chunks():
        parts = norm.normalize_str(sep.join(chr(c) for c in ch)).split(sep)
        assert len(parts) == len(ch)
        for c, p in zip(ch, parts):
            if p != chr(c):
                m[c] = p
    return m


def removed_by(norm, sep: str = "\x01") -> set[int]:
    return {c for c, p in per_char_map(norm, sep).items() if p == ""}


def word_chars() -> set[int]:
    out = set()
    pre = pre_tokenizers.Whitespace()
    for ch in chunks():
        s = "x" + "".join(chr(c) + "x" for c in ch)
        for piece, _ in pre.pre_tokenize_str(s):
            if len(piece) > 1:
                out.update(ord(q) for q in piece if q != "x")
    return out


def probe_nfd(before: str, after: str, cps, test) -> set[int]:
    """Code points c for which test(NFD("a" + before + c + after)) holds."""
    norm = normalizers.NFD()
    out = set()
    for i in range(0, len(cps), CHUNK):
        ch = cps[i:i + CHUNK]
        parts = norm.normalize_str("\x01".join("a" + before + chr(c) + after for c in ch)).split("\x01")
        assert len(parts) == len(ch)
        out.update(c for c, p in zip(ch, parts) if test(p))
    return out


_UTF8PROC = ctypes.CDLL(ctypes.util.find_library("utf8proc") or "libutf8proc.so.2")
for _name in ("utf8proc_NFC", "utf8proc_NFD", "utf8proc_NFKC", "utf8proc_NFKD"):
    getattr(_UTF8PROC, _name).restype = ctypes.c_void_p
    getattr(_UTF8PROC, _name).argtypes = [ctypes.c_char_p]
_UTF8PROC.utf8proc_get_property.restype = ctypes.POINTER(ctypes.c_int16 * 2)  # category, combining_class
_UTF8PROC.utf8proc_get_property.argtypes = [ctypes.c_int32]
_LIBC = ctypes.CDLL(None)
_LIBC.free.argtypes = [ctypes.c_void_p]


def utf8proc_normalize(c: int, form: str) -> str:
    """What src/text/unicode.cpp gets from utf8proc for one code point."""
    p = getattr(_UTF8PROC, "utf8proc_" + form)(chr(c).encode("utf-8") if c else b"")
    out = ctypes.string_at(p).decode("utf-8") if c else ""
    _LIBC.free(p)
    return out if c else chr(0)


def _utf8proc_version() -> str:
    _UTF8PROC.utf8proc_version.restype = ctypes.c_char_p
    return _UTF8PROC.utf8proc_version().decode()


def utf8proc_ccc(c: int) -> int:
    return _UTF8PROC.utf8proc_get_property(c).contents[1]


def ranges(s) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for c in sorted(s):
        if out and out[-1][1] + 1 == c:
            out[-1][1] = c
        else:
            out.append([c, c])
    return [(a, b) for a, b in out]


def emit_ranges(name: str, s) -> str:
    rs = ranges(s)
    items = [f"{{0x{a:X},0x{b:X}}}" for a, b in rs]
    lines = []
    for i in range(0, len(items), 8):
        lines.append("    " + ",".join(items[i:i + 8]) + ",")
    return f"constexpr Range {name}[] = {{\n" + "\n".join(lines) + "\n};\n"


def fnv1a(data: bytes, h: int = 0xCBF29CE484222325) -> int:
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def block_hashes(mapping: dict[int, str]) -> list[str]:
    """FNV-1a 64 of (result + NUL) for every non-surrogate code point, per 4096 block."""
    out = []
    for base in range(0, 0x110000, BLOCK):
        buf = bytearray()
        for c in range(base, base + BLOCK):
            if 0xD800 <= c <= 0xDFFF:
                continue
            buf += mapping.get(c, chr(c)).encode("utf-8", "surrogatepass") + b"\0"
        out.append(f"{fnv1a(bytes(buf)):016x}")
    return out


def random_strings(n: int) -> list[str]:
    import random
    rng = random.Random(1234)
    marks = [c for c in CPS if utf8proc_ccc(c)]
    pools = [marks, list(range(0x41, 0x7B)), list(range(0xC0, 0x250)), list(range(0x1100, 0x1200)),
             list(range(0xAC00, 0xAC40)), list(range(0x3040, 0x30FF)), list(range(0x1E00, 0x1F00)),
             list(range(0x11900, 0x11960)), list(range(0x16100, 0x16140)), list(range(0xFB00, 0xFB50))]
    out = []
    for _ in range(n):
        k = rng.randint(1, 7)
        out.append("".join(chr(rng.choice(rng.choice(pools))) for _ in range(k)))
    return out


def main() -> None:
    tables = {}
    tables["kPunct"] = isolated_by(pre_tokenizers.Punctuation("isolated"))
    tables["kNumeric"] = isolated_by(pre_tokenizers.Digits(individual_digits=True))
    tables["kWord"] = word_chars() | {0x78}
    tables["kBertControl"] = removed_by(normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False), "x") | {0x01}
    nfd_map = per_char_map(normalizers.NFD())
    stripped = removed_by(normalizers.BertNormalizer(
        clean_text=False, handle_chinese_chars=False, strip_accents=True, lowercase=False))
    tables["kMn"] = {c for c in stripped if c not in nfd_map}
    tables["kCombining"] = removed_by(normalizers.StripAccents())
    lower = per_char_map(normalizers.Lowercase())

    # Normalisation barriers.
    forms = {"NFC": normalizers.NFC(), "NFD": normalizers.NFD(), "NFKC": normalizers.NFKC(),
             "NFKD": normalizers.NFKD()}
    # Combining classes tokenizers knows: c moves behind U+0334 (ccc 1) or U+0316 (ccc 220)
    # moves behind c.
    marks = [c for c in CPS if utf8proc_ccc(c)]
    has_ccc = (probe_nfd("", "\u0334", marks, lambda p: not p.endswith("\u0334"))
               | probe_nfd("\u0316", "", marks, lambda p: p.endswith("\u0316")))
    barrier = {}
    for name, norm in forms.items():
        hf = per_char_map(norm)
        b = set()
        for c in CPS:
            ours = utf8proc_normalize(c, name)
            theirs = hf.get(c, chr(c))
            if ours != theirs:
                assert theirs == chr(c), (name, hex(c), theirs, ours)  # tokenizers: unchanged
                b.add(c)
        b |= {c for c in marks if c not in has_ccc}
        barrier[name] = b
    # Parts of composites tokenizers does not decompose cannot be composed by it either.
    for c in barrier["NFD"]:
        parts = utf8proc_normalize(c, "NFD")
        if len(parts) > 1:
            for name in ("NFC", "NFKC"):
                barrier[name].update(ord(p) for p in parts)

    with OUT.open("w", encoding="utf-8") as f:
        f.write("// Generated by tools/gen_unicode_tables.py from tokenizers "
                f"{tokenizers.__version__} against utf8proc {_utf8proc_version()}.\n"
                "// Do not edit. Character classes exactly as HF tokenizers applies them; see the script.\n"
                "// Included by unicode.cpp inside namespace moe::text::uni::tables.\n\n")
        for name, s in tables.items():
            f.write(emit_ranges(name, s) + "\n")
        for name, s in barrier.items():
            f.write(emit_ranges(f"kBarrier{name}", s) + "\n")
        f.write("struct Lower {\n  char32_t cp, a, b;\n};\n")
        f.write("constexpr Lower kLower[] = {\n")
        items = []
        for c in sorted(lower):
            t = [ord(x) for x in lower[c]]
            assert 1 <= len(t) <= 2, (hex(c), t)
            items.append(f"{{0x{c:X},0x{t[0]:X},0x{t[1] if len(t) > 1 else 0:X}}}")
        for i in range(0, len(items), 6):
            f.write("    " + ",".join(items[i:i + 6]) + ",\n")
        f.write("};\n")
    print({k: len(ranges(v)) for k, v in tables.items()}, {k: len(v) for k, v in barrier.items()}, len(lower))

    import json
    maps = {name.lower(): per_char_map(norm) for name, norm in forms.items()}
    maps["lowercase"] = lower
    strings = random_strings(600)
    golden = {
        "generator": "tools/gen_unicode_tables.py", "tokenizers": tokenizers.__version__, "block": BLOCK,
        "classes": {k: ranges(v) for k, v in tables.items()},
        "block_hashes": {k: block_hashes(m) for k, m in maps.items()},
        "strings": [{"text": t, **{name.lower(): norm.normalize_str(t) for name, norm in forms.items()},
                     "lowercase": normalizers.Lowercase().normalize_str(t)} for t in strings],
    }
    GOLDEN.write_text(json.dumps(golden, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
