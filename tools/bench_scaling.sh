#!/usr/bin/env bash
# Thread scaling, moe-ep against a llama.cpp / ik_llama.cpp build on the same GGUF
# (issue #21 item 5: 1/2/4/8/16 threads), and where moe-ep's decode step goes at each count.
#
#   tools/bench_scaling.sh LLAMA_BUILD_DIR GGUF_DIR CKPT_DIR
#
# The arguments are tools/bench_vs_llamacpp.sh's (its environment too: PEER, LLAMA_ARGS,
# LINEARS, PREFILL, DECODE, R, MOE_EP; with PEER2_BUILD set the second peer runs in the same
# rounds, its table stays in OUT/side-N.txt, and the scaling table is against the first).
# For each count in THREADS_LIST (default "1 2 4 8 16"; counts above this machine's CPUs
# are skipped) it runs that script on GGUF_TYPE (default Q4_0) with THREADS set, then one
# `moe-ep generate --threads N --warmup --profile` on the same file and prompt, and prints
# two tables: tokens/s, ratios, the bandwidth probe and floor fractions per count; and
# milliseconds per decode step of each stage (core/stage_profile.h) per count, so a stage
# that stops getting faster shows.
# On a machine that cannot hold the GGUFs, tools/gguf_refill.py rebuilds them from their
# headers (docs/PERF.md, ninth session). Raw output: OUT (default a new /tmp dir).
set -euo pipefail

[ $# -eq 3 ] || { sed -n '5,6p' "$0" >&2; exit 2; }
LLAMA_BUILD=$1 GGUF_DIR=$2 CKPT=$3
REPO=$(cd "$(dirname "$0")/.." && pwd)
MOE_EP=${MOE_EP:-$REPO/build/moe-ep}
TYPE=${GGUF_TYPE:-Q4_0} PREFILL=${PREFILL:-512} DECODE=${DECODE:-64}
OUT=${OUT:-$(mktemp -d /tmp/bench_scaling.XXXXXX)}
mkdir -p "$OUT"
die() { echo "bench_scaling: $*" >&2; exit 1; }
[ -x "$MOE_EP" ] || die "no moe-ep binary at $MOE_EP (set MOE_EP)"
G=("$GGUF_DIR"/*-"$TYPE".gguf)
[ -f "${G[0]}" ] && [ ${#G[@]} -eq 1 ] || die "need exactly one *-$TYPE.gguf in $GGUF_DIR"
CPUS=$(nproc)
VOCAB=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$CKPT/config.json")
# The side-by-side script's prompt ids, so both measure the same prompt.
python3 -c '
import sys; n, v = int(sys.argv[1]), int(sys.argv[2]) - 256
print(",".join(str((17 + 104729 * j) % v) for j in range(n)))' "$PREFILL" "$VOCAB" > "$OUT/ids.txt"

COUNTS=()
for t in ${THREADS_LIST:-1 2 4 8 16}; do
  [[ $t =~ ^[1-9][0-9]*$ ]] || die "THREADS_LIST holds '$t', not a positive integer"
  if ((t > CPUS)); then echo "bench_scaling: skipping $t threads (this machine has $CPUS CPUs)" >&2; continue; fi
  COUNTS+=("$t")
  echo "== $t threads" >&2
  THREADS=$t MODES=gguf GGUF_TYPES=$TYPE OUT="$OUT/side-$t" "$REPO/tools/bench_vs_llamacpp.sh" \
    "$LLAMA_BUILD" "$GGUF_DIR" "$CKPT" > "$OUT/side-$t.txt" 2> "$OUT/side-$t.err" ||
    die "bench_vs_llamacpp.sh at $t threads failed: $(tail -3 "$OUT/side-$t.err")"
  "$MOE_EP" generate --threads "$t" --model "${G[0]}" --dtype bf16 --prompt-ids "@$OUT/ids.txt" \
    --max-new-tokens $((DECODE + 1)) --ignore-eos --quiet --warmup --kv-cache-dtype "${KV:-bf16}" \
    --max-seq-len $((PREFILL + DECODE + 16)) --profile --output-json "$OUT/profile-$t.json" 2> "$OUT/profile-$t.err" ||
    die "moe-ep generate --profile at $t threads failed: $(tail -3 "$OUT/profile-$t.err")"
done
((${#COUNTS[@]})) || die "no thread count of THREADS_LIST fits this machine's $CPUS CPUs"

echo "thread scaling: $TYPE ($(basename "${G[0]}")), prompt $PREFILL, $DECODE decode steps, ${PEER:-llama.cpp} ${LLAMA_ARGS:-}; CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $CPUS CPUs; raw: $OUT"
python3 - "$OUT" "$TYPE" "${PEER:-llama.cpp}" "${COUNTS[@]}" <<'EOF'
import json, re, sys
out, ftype, peer, counts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
print(f"\n| threads | decode moe-ep / {peer} | ratio | prefill moe-ep / {peer} | ratio | probe GB/s | floor moe-ep / {peer} |")
print("|---|---|---|---|---|---|---|")
for t in counts:
    text = open(f"{out}/side-{t}.txt").read()
    row = next(l for l in text.splitlines() if l.startswith(f"| gguf:{ftype} |"))
    c = [x.strip() for x in row.strip("|").split("|")]
    bw = re.search(r"probe, GB/s\): before ([\d.?]+), after ([\d.?]+)", text)
    probe = max(float(x) for x in bw.groups() if x != "?") if bw else 0
    print(f"| {t} | {c[2]} / {c[3]} | {c[4]} | {c[5]} / {c[6]} | {c[7]} | {probe:.1f} | {c[9] if len(c) > 9 else '-'} |")
stages = None
rows = []
for t in counts:
    j = json.load(open(f"{out}/profile-{t}.json"))
    p, steps = j["profile_s"]["decode"], j["timings"]["decode_steps"]
    stages = stages or [k for k in p if k not in ("total", "other")] + ["other"]
    rows.append((t, steps, p))
used = [s for s in stages if any(p[s] > 0 for _, _, p in rows)]
print(f"\nmoe-ep decode step by stage (generate --profile), ms per step:\n")
print("| threads | step | " + " | ".join(used) + " |")
print("|---|---|" + "---|" * len(used))
for t, steps, p in rows:
    print(f"| {t} | {1e3 * p['total'] / steps:.3f} | " + " | ".join(f"{1e3 * p[s] / steps:.3f}" for s in used) + " |")
EOF
