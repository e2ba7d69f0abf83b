#!/usr/bin/env python3
"""A GGUF's header without its weights, and a GGUF made from such a header with
pseudo-random weights: the side-by-side benchmark's model on a machine that cannot take
the 1.5-5 GB file (the lent 16-core hosts: 64 MiB travels, nothing can be fetched there).

    gguf_refill.py header SRC.gguf HDR   # metadata, tokenizer, tensor table of SRC (2.6 MB
                                         # for tools/bench_vs_llamacpp.sh's checkpoint)
    gguf_refill.py fill HDR OUT.gguf     # OUT: HDR, then every tensor in its own type

Both engines then run OUT as they run SRC: same tensors, types, bytes per token and
tokenizer. Speed does not depend on the weights' values, but routing does, so the values
are chosen to route like the real checkpoint (tools/gen_big_checkpoint.cpp's random bf16,
quantised by llama-quantize): measured with `moe-ep generate` on a 512-token prompt,
expert load max/mean 1.54-1.61 against the real file's 1.51. What it takes:
  - f16 block scales set to normal numbers (never NaN/Inf) small enough that four layers of
    random weights keep the activations finite;
  - zero-mean codes, as trained weights are. Uniform codes (Q4_0's -8..7 has mean -0.5)
    give every matrix a rank-1 part: every token's residual stream became alike, and all
    tokens went to the same 8 experts (max/mean 16), which flatters prefill;
  - F32 tensors (norms, router) as gen_big_checkpoint makes every weight: random sign,
    magnitude in [2^-8, 2^-6). Norm weights of 1 let attention's output (an average over
    the prefix, the same for every token) swamp the embedding, with the same effect.
Types: F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K (those of llama-quantize's BF16,
Q8_0, Q4_0 and Q4_K_M files); another type is an error naming the tensor. Needs numpy
(fill only). Deterministic: the same HDR and numpy version give the same OUT.
"""
import os
import struct
import sys

# ggml type -> (bytes per block, elements per block)
SIZES = {0: (4, 1), 1: (2, 1), 30: (2, 1), 2: (18, 32), 8: (34, 32), 12: (144, 256), 13: (176, 256),
         14: (210, 256)}
NAMES = {0: "F32", 1: "F16", 30: "BF16", 2: "Q4_0", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}


def parse_header(data, meta=None):
    """(data start, [(name, dims, offset, type)]) of the GGUF whose first bytes are `data`;
    its metadata key -> value into `meta` when a dict is given."""
    o = 0

    def rd(fmt):
        nonlocal o
        v = struct.unpack_from("<" + fmt, data, o)
        o += struct.calcsize("<" + fmt)
        return v[0]

    def rstr():
        nonlocal o
        n = rd("Q")
        s = data[o:o + n].decode("utf-8", "replace")
        o += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            et, n = rd("I"), rd("Q")
            return [rval(et) for _ in range(n)]
        return rd(scalar[t])

    if data[:4] != b"GGUF":
        raise SystemExit("gguf_refill: not a GGUF file (no 'GGUF' magic)")
    o = 4
    _version, n_tensors, n_kv = rd("I"), rd("Q"), rd("Q")
    align = 32
    for _ in range(n_kv):
        key = rstr()
        val = rval(rd("I"))
        if meta is not None:
            meta[key] = val
        if key == "general.alignment":
            align = val
    infos = []
    for _ in range(n_tensors):
        name = rstr()
        dims = [rd("Q") for _ in range(rd("I"))]
        ty = rd("I")
        infos.append((name, dims, rd("Q"), ty))
    return (o + align - 1) // align * align, infos


def tensor_bytes(name, dims, ty):
    if ty not in SIZES:
        raise SystemExit(f"gguf_refill: tensor {name} has ggml type {ty}; this tool fills "
                         + ", ".join(NAMES.values()))
    n = 1
    for d in dims:
        n *= d
    bs, be = SIZES[ty]
    if n % be:
        raise SystemExit(f"gguf_refill: tensor {name} has {n} elements, not a multiple of {NAMES[ty]}'s {be}")
    return n // be * bs


def header(src, hdr):
    with open(src, "rb") as f:
        head = f.read(64 << 20)
    start, _ = parse_header(head)
    with open(hdr, "wb") as f:
        f.write(head[:start])


def fill(hdr, out):
    import numpy as np

    head = open(hdr, "rb").read()
    start, infos = parse_header(head)
    if len(head) != start:
        raise SystemExit(f"gguf_refill: {hdr} holds {len(head)} bytes, its header {start}: not made by 'header'")
    rng = np.random.default_rng(1234)

    def kquant_scales(nb, mean_q, choices):
        # [nb, 12] packed 6-bit (scale, min) of 8 sub-blocks (llama.cpp's get_scale_min_k4
        # layout) with min = mean code x scale: d * sc * q - dmin * m has mean 0 when dmin == d.
        sc = rng.choice(np.array(choices, np.uint8), size=(nb, 8))
        m = (sc.astype(np.float64) * mean_q).astype(np.uint8)
        q = np.zeros((nb, 12), np.uint8)
        q[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
        q[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
        q[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
        return q

    # f16 fields: byte offsets in the block, and the exponent field (value 2^(e-15) x [1, 2)).
    F16 = {2: ([0], 6), 8: ([0], 2), 12: ([0, 2], 4), 13: ([0, 2], 4), 14: ([208], 1)}
    with open(out, "wb") as f:
        f.write(head)
        for name, dims, off, ty in sorted(infos, key=lambda i: i[2]):
            nbytes = tensor_bytes(name, dims, ty)
            pad = start + off - f.tell()
            if pad < 0:
                raise SystemExit(f"gguf_refill: tensor {name} overlaps the one before it")
            f.write(b"\0" * pad)
            n = nbytes // SIZES[ty][0] * SIZES[ty][1]
            if ty == 0:
                a = rng.choice(np.array([-1, 1], np.float32), n) * np.exp2(rng.uniform(-8, -6, n))
                f.write(a.astype(np.float32).tobytes())
            elif ty == 1:
                a = rng.choice(np.array([-1, 1], np.float32), n) * np.exp2(rng.uniform(-8, -6, n))
                f.write(a.astype(np.float16).tobytes())
            elif ty == 30:  # sign, exponent 2^-7, random mantissa
                a = np.frombuffer(rng.bytes(2 * n), np.uint16) & np.uint16(0x807F) | np.uint16(0x3C00)
                f.write(a.tobytes())
            else:
                bs = SIZES[ty][0]
                a = np.frombuffer(rng.bytes(nbytes), np.uint8).copy().reshape(-1, bs)
                offs, ex = F16[ty]
                for o in offs:  # little-endian f16: high byte = sign 0 | 5-bit exponent | 2 mantissa bits
                    a[:, o + 1] = (ex << 2) | (a[:, o + 1] & 3)
                if ty == 2:  # Q4_0: code 0 (-8) becomes 8 (0): codes -7..7
                    c = a[:, 2:18]
                    lo, hi = c & 15, c >> 4
                    lo[lo == 0] = 8
                    hi[hi == 0] = 8
                    a[:, 2:18] = lo | (hi << 4)
                elif ty == 8:  # Q8_0: -128 becomes 0
                    c = a[:, 2:34]
                    c[c == 0x80] = 0
                elif ty in (12, 13):  # Q4_K (codes 0..15), Q5_K (0..31): dmin = d
                    a[:, 2:4] = a[:, 0:2]
                    a[:, 4:16] = (kquant_scales(a.shape[0], 7.5, [2, 4, 6, 8]) if ty == 12
                                  else kquant_scales(a.shape[0], 15.5, [2, 4]))
                # Q6_K (q - 32, q 0..63): mean -0.5 against a spread of 18.5, left as is (in
                # Q4_K_M only lm_head and two layers' ffn_down, after zero-mean inputs).
                f.write(a.tobytes())


def main(argv):
    if len(argv) != 4 or argv[1] not in ("header", "fill"):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    (header if argv[1] == "header" else fill)(argv[2], argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
