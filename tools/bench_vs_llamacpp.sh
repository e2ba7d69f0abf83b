#!/usr/bin/env bash
# moe-ep vs llama.cpp on the same weights, side by side (issue #12 item 5).
#
#   tools/bench_vs_llamacpp.sh LLAMA_BUILD_DIR GGUF_DIR CKPT_DIR
#
# LLAMA_BUILD_DIR: a llama.cpp or ik_llama.cpp build holding bin/llama-bench (this script
#   neither fetches nor builds either; docs/PERF.md says how the numbers were made).
#   PEER names it in the report (default llama.cpp; ik_llama.cpp for ik's build), and
#   LLAMA_ARGS adds flags to every llama-bench run (ik: "-fa 1 -fmoe 1", its flash
#   attention and fused MoE; "-rtr 1" for its run-time repacking).
#   A second peer in the same rounds: PEER2_BUILD (its build dir), PEER2 (its name, default
#   ik_llama.cpp) and PEER2_ARGS (its flags). Its runs interleave with the others', so the
#   three engines see the same drift of the machine; the report has one table per peer.
# GGUF_DIR: the GGUFs of CKPT_DIR, found by their ftype suffix: *-BF16.gguf, *-Q8_0.gguf,
#   *-Q4_0.gguf, *-Q4_K_M.gguf (convert_hf_to_gguf.py --outtype bf16, then llama-quantize).
# CKPT_DIR: the Hugging Face checkpoint both were made from (tools/gen_big_checkpoint.cpp).
#
# The inputs of issue #12's table (Qwen3-30B-A3B layer shapes, 4 layers, random bf16):
#   gen_big_checkpoint CKPT 4 128 2048 768 0 32000 32 4 128, then config.json gains the
#   fields convert_hf_to_gguf.py and llama.cpp need (architectures Qwen3MoeForCausalLM,
#   rms_norm_eps 1e-6, max_position_embeddings 40960, rope_theta 1e6), and CKPT gets a
#   32000-token byte-level BPE tokenizer of Qwen2's form (tokenizer.json, tokenizer_config.json).
#   convert_hf_to_gguf.py CKPT --outtype bf16 --outfile GGUF_DIR/ckpt-BF16.gguf, with its
#   pre-tokenizer check answering "qwen2" (it knows a tokenizer only by the hash of its
#   output on a test string, and refuses a new one); then from that file
#   llama-quantize ckpt-BF16.gguf ckpt-{Q8_0,Q4_0,Q4_K_M}.gguf {Q8_0,Q4_0,Q4_K_M}.
#
# Cases, each moe-ep mode against the llama.cpp type of the same weight width:
#   bf16 vs BF16, --quantize w8a8 vs Q8_0, --quantize w4a8 vs Q4_0 and Q4_K_M;
#   and with mode "gguf" in MODES, moe-ep on the very GGUF file the peer runs, for each
#   type in GGUF_TYPES (default "BF16 Q4_0"): rows "gguf:TYPE" (moe-ep keeps every tensor
#   of an integer-coded type in its codes, exactly: 4-bit types in 4 bits, 5- and 6-bit
#   ones in 6, Q8_0 in 8; with LINEARS w8a8 it requantises the attention linears and lm_head to int8
#   instead, so LINEARS=none is the same-bytes comparison).
# A case whose GGUF is missing, or that this moe-ep build lacks (w4a8), prints "-".
#
# Each of R rounds runs every case of both engines once, one process at a time, in a
# fixed order that is reversed every other round (so a slow drift of the shared
# machine's memory bandwidth does not favour whoever runs first); the table holds the
# medians over rounds. Both engines get THREADS threads (moe-ep --threads, llama-bench -t;
# before 2026-12-04 moe-ep was given OMP_NUM_THREADS, which it ignored: it ran on every core).
#   prefill: one prompt of PREFILL tokens, from an empty cache. moe-ep: the first step of
#     `generate` (fixed pseudo-random prompt ids); llama.cpp: llama-bench -p PREFILL -n 0.
#   decode (batch 1): DECODE tokens after that prompt. moe-ep: the remaining steps of the
#     same `generate` (greedy, --ignore-eos); llama.cpp: llama-bench -p 0 -n DECODE -d
#     PREFILL (generation after PREFILL tokens of context, as moe-ep's).
# Warm-up, both engines: llama-bench runs its test once untimed before the timed run (its
# default); moe-ep `generate --warmup` runs the whole generation once untimed, then the
# timed one (builds without --warmup time their first run, which pays the page faults of
# every fresh buffer: 2.6x slower prefill on a 2-vCPU Zen 4 VM).
# llama-bench runs with its defaults otherwise (its default flash attention and CPU
# weight repacking), one repetition per round (-r 1).
#
# DRAM floor (FLOOR=1): the fraction of decode tokens/s over bandwidth / bytes a decode
# token must read. Bytes per token: every weight but the experts and token_embd, 8/128
# (top-k / experts, from config.json) of the expert weights, one embedding row, and the
# KV cache at the mean decode context. moe-ep's bytes come from the checkpoint's shapes
# with moe-ep's storage: attention, norms, lm_head in bf16, router f32, experts bf16 /
# int8 + f32 per-channel scale (w8a8) / 4-bit + f32 scale + u8 zero per group (w4a8),
# KV in moe-ep's --kv-cache-dtype (KV, default bf16). llama.cpp's come from the GGUF's own tensor table (the bytes of each tensor as
# stored, whatever its quant type), KV f16. The bandwidth is moe-ep's streaming-read
# probe (the "limits: read bandwidth" of `moe-ep bench`), taken before and after the
# rounds; the higher of the two is used, so the fractions are not flattered.
#
# Environment: R (rounds, 5), THREADS (2), PREFILL (512), DECODE (64), MOE_EP (moe-ep
# binary, default build/moe-ep of this checkout), INT4_GROUP (--int4-group for w4a8;
# unset: moe-ep's default), LINEARS (--quantize-linears of the w8a8 and w4a8 modes: w8a8,
# the default, quantises attention and lm_head too, as llama.cpp's Q8_0/Q4 files do;
# w4a8 makes them int4 with --int4-group groups; none keeps them bf16), KV (moe-ep's --kv-cache-dtype: bf16, the default, holds what the
# peers' f16 cache holds per value; f32), FLOOR (1), OUT (raw logs; default a new /tmp dir).
set -euo pipefail

usage() { sed -n '2,4p' "$0" >&2; exit 2; }
[ $# -eq 3 ] || usage
LLAMA_BUILD=$1 GGUF_DIR=$2 CKPT=$3
REPO=$(cd "$(dirname "$0")/.." && pwd)
R=${R:-5} THREADS=${THREADS:-2} PREFILL=${PREFILL:-512} DECODE=${DECODE:-64} FLOOR=${FLOOR:-1}
MOE_EP=${MOE_EP:-$REPO/build/moe-ep}
OUT=${OUT:-$(mktemp -d /tmp/bench_vs_llamacpp.XXXXXX)}
mkdir -p "$OUT"
die() { echo "bench_vs_llamacpp: $*" >&2; exit 1; }
# The peers, by index: a name, a llama-bench binary and its extra flags.
PEER_NAME=("${PEER:-llama.cpp}") PEER_LB=("$LLAMA_BUILD/bin/llama-bench") PEER_ARGS=("${LLAMA_ARGS:-}")
if [ -n "${PEER2_BUILD:-}" ]; then
  PEER_NAME+=("${PEER2:-ik_llama.cpp}") PEER_LB+=("$PEER2_BUILD/bin/llama-bench") PEER_ARGS+=("${PEER2_ARGS:-}")
  [ "${PEER_NAME[0]}" != "${PEER_NAME[1]}" ] || die "PEER and PEER2 are both '${PEER_NAME[0]}': name them apart"
fi
for i in "${!PEER_LB[@]}"; do
  [ -x "${PEER_LB[$i]}" ] || die "no llama-bench at ${PEER_LB[$i]} (${PEER_NAME[$i]}'s build dir must hold bin/llama-bench)"
done
[ -x "$MOE_EP" ] || die "no moe-ep binary at $MOE_EP (set MOE_EP)"
[ -f "$CKPT/config.json" ] || die "no config.json in CKPT_DIR $CKPT"
[ -d "$GGUF_DIR" ] || die "GGUF_DIR $GGUF_DIR is not a directory"
command -v python3 >/dev/null || die "python3 is needed to read the JSON results"
for v in R THREADS PREFILL DECODE; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, got '${!v}'"
done

gguf_of() {  # ftype -> the one GGUF of that type in GGUF_DIR, or nothing
  local f=( "$GGUF_DIR"/*-"$1".gguf )
  [ -f "${f[0]}" ] || return 0
  [ ${#f[@]} -eq 1 ] || die "more than one *-$1.gguf in $GGUF_DIR: ${f[*]}"
  echo "${f[0]}"
}
# (Not `--help | grep -q`: grep quits at the first match, the help's writer gets SIGPIPE,
# and under pipefail the test fails.)
moe_has() { local h; h=$("$MOE_EP" generate --help 2>&1); [[ "$h" == *"$1"* ]]; }

# Jobs: "moe MODE" or "llama PEER_INDEX FTYPE"; pairs: moe mode -> llama ftypes.
declare -A PAIR=([bf16]="BF16" [w8a8]="Q8_0" [w4a8]="Q4_0 Q4_K_M")
MODES=(${MODES:-bf16 w8a8 w4a8})  # MODES="bf16 w4a8": a subset
JOBS=() SKIPPED=()
for m in "${MODES[@]}"; do
  if [ "$m" = gguf ]; then
    for t in ${GGUF_TYPES:-BF16 Q4_0}; do
      if [ -z "$(gguf_of "$t")" ]; then SKIPPED+=("moe-ep gguf:$t: no *-$t.gguf in $GGUF_DIR"); continue; fi
      JOBS+=("moe gguf:$t")
      for i in "${!PEER_LB[@]}"; do [[ " ${JOBS[*]} " == *" llama $i $t "* ]] || JOBS+=("llama $i $t"); done
    done
    continue
  fi
  if [ "$m" = w4a8 ] && ! moe_has w4a8; then SKIPPED+=("moe-ep $m: this build has no --quantize $m")
  else JOBS+=("moe $m"); fi
  for t in ${PAIR[$m]}; do
    if [[ " ${JOBS[*]} " == *" llama 0 $t "* ]]; then continue
    elif [ -n "$(gguf_of "$t")" ]; then for i in "${!PEER_LB[@]}"; do JOBS+=("llama $i $t"); done
    else SKIPPED+=("the peers' $t: no *-$t.gguf in $GGUF_DIR"); fi
  done
done

# Prompt ids: fixed pseudo-random, below the special tokens (the vocab's last ids).
VOCAB=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$CKPT/config.json")
IDS=$(python3 -c '
import sys; n, v = int(sys.argv[1]), int(sys.argv[2]) - 256
print(",".join(str((17 + 104729 * j) % v) for j in range(n)))' "$PREFILL" "$VOCAB")

INT4_ARGS=()
[ -n "${INT4_GROUP:-}" ] && INT4_ARGS=(--int4-group "$INT4_GROUP")
LINEARS=${LINEARS:-w8a8}
# The ids go in a file (--prompt-ids @FILE): 32k ids are more than one argument may hold.
IDS_FILE=$OUT/prompt_ids.txt
printf '%s\n' "$IDS" > "$IDS_FILE"
moe_cmd() {  # MODE -> CMD, the moe-ep command line (the prompt ids in $IDS_FILE)
  local q=$1 extra=() model=$CKPT
  if [[ $1 == gguf:* ]]; then  # the peer's own file; experts as stored
    model=$(gguf_of "${1#gguf:}") q=none
    [ "${1#gguf:}" != BF16 ] && [ "$LINEARS" != none ] && extra+=(--quantize-linears "$LINEARS")
  fi
  [ "$q" = bf16 ] && q=none
  [ "$1" = w4a8 ] && extra=("${INT4_ARGS[@]}")
  [ "$q" != none ] && [ "$LINEARS" != none ] && extra+=(--quantize-linears "$LINEARS")
  moe_has --warmup && extra+=(--warmup)
  CMD=("$MOE_EP" generate --threads "$THREADS" --model "$model" --dtype bf16 --quantize "$q" "${extra[@]}"
       --prompt-ids "@$IDS_FILE" --max-new-tokens $((DECODE + 1)) --ignore-eos --quiet --kv-cache-dtype "${KV:-bf16}"
       --max-seq-len $((PREFILL + DECODE + 16)))
}
# Decode after PREFILL tokens of context: mainline llama-bench's -d (depth); ik_llama.cpp's
# llama-bench has no -d but -gp PP,TG, which times only the TG tokens after a PP prompt.
DECODE_AT=()  # per peer, its flags as one string
for i in "${!PEER_LB[@]}"; do
  LB_HELP=$("${PEER_LB[$i]}" --help 2>&1 || true)
  if [[ "$LB_HELP" == *"--n-depth"* ]]; then DECODE_AT+=("-n $DECODE -d $PREFILL")
  elif [[ "$LB_HELP" == *"-gp <pp,tg>"* ]]; then DECODE_AT+=("-n 0 -gp $PREFILL,$DECODE")
  else die "${PEER_LB[$i]} has neither -d (depth) nor -gp: cannot time decode at a context"; fi
done
llama_cmd() {  # PEER_INDEX FTYPE KIND -> CMD, the llama-bench command line
  local lb=${PEER_LB[$1]} extra=(${PEER_ARGS[$1]}) at=(${DECODE_AT[$1]})
  if [ "$3" = prefill ]; then CMD=("$lb" -m "$(gguf_of "$2")" -t "$THREADS" -p "$PREFILL" -n 0 -r 1 -o json "${extra[@]}")
  else CMD=("$lb" -m "$(gguf_of "$2")" -t "$THREADS" -p 0 "${at[@]}" -r 1 -o json "${extra[@]}"); fi
}

RES=$OUT/results.tsv
: > "$RES"
run_job() {  # ROUND moe MODE | ROUND llama PEER_INDEX FTYPE
  local r=$1 eng=$2 c=$3 j kind i
  if [ "$eng" = moe ]; then
    j=$OUT/moe-$c-r$r.json
    moe_cmd "$c"
    "${CMD[@]}" --output-json "$j" 2> "$OUT/moe-$c-r$r.err" || die "moe-ep $c failed: $(tail -3 "$OUT/moe-$c-r$r.err")"
    python3 - "$j" "$r" "$c" "$PREFILL" "$DECODE" >> "$RES" <<'EOF'
import json, sys
j, r, c, p, d = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
t = j["timings"]
assert t["prefill_tokens"] == p and t["decode_tokens"] == d, (t, p, d)
print(f"{r}\tmoe\t{c}\tprefill\t{t['prefill_tokens_per_s']:.3f}")
print(f"{r}\tmoe\t{c}\tdecode\t{t['decode_tokens_per_s']:.3f}")
EOF
  else
    i=$3 c=$4
    for kind in prefill decode; do
      j=$OUT/llama$i-$c-$kind-r$r.json
      llama_cmd "$i" "$c" $kind
      "${CMD[@]}" > "$j" 2> "$OUT/llama$i-$c-$kind-r$r.err" \
        || die "${PEER_NAME[$i]}'s llama-bench $c $kind failed: $(tail -3 "$OUT/llama$i-$c-$kind-r$r.err")"
      python3 - "$j" "$r" "$c" "$kind" "$i" >> "$RES" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 1, rows
print(f"{sys.argv[2]}\tllama{sys.argv[5]}\t{sys.argv[3]}\t{sys.argv[4]}\t{rows[0]['avg_ts']:.3f}")
EOF
    done
  fi
}

bandwidth() {  # moe-ep's streaming-read probe, GB/s
  "$MOE_EP" bench --threads "$THREADS" --shape qwen3-30b-a3b --tokens 1 --dtype bf16 --seconds 0.2 --skip-check \
    2>&1 | sed -n 's/.*limits: read bandwidth \([0-9.]*\) GB\/s.*/\1/p' | head -1
}

BW0= BW1=
[ "$FLOOR" = 1 ] && BW0=$(bandwidth)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(date -u +%FT%TZ)
for ((r = 1; r <= R; r++)); do
  order=("${JOBS[@]}")
  if ((r % 2 == 0)); then
    order=(); for ((i = ${#JOBS[@]} - 1; i >= 0; i--)); do order+=("${JOBS[$i]}"); done
  fi
  for job in "${order[@]}"; do
    echo "round $r/$R: $job" >&2
    run_job "$r" $job
  done
done
T1=$(date -u +%FT%TZ)
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
[ "$FLOOR" = 1 ] && BW1=$(bandwidth)

# --- report ---
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
FLAGS=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|fma|f16c|avx512f|avx512_bf16|avx512_vnni|avx_vnni|amx_tile' | tr '\n' ' ')
# llama-bench's JSON names its build (build_commit, build_number).
peer_commit() {  # PEER_INDEX
  python3 -c '
import glob, json, sys
f = sorted(glob.glob(sys.argv[1] + "/llama" + sys.argv[2] + "-*.json"))
r = json.load(open(f[0]))[0] if f else {}
print("commit %s, build %s" % (r.get("build_commit", "?"), r.get("build_number", "?")))' "$OUT" "$1"
}
MOE_COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo "?")

echo
NAMES=$(IFS=,; echo "${PEER_NAME[*]}")
echo "moe-ep vs ${NAMES//,/ and }: $R round(s) $T0 .. $T1, $THREADS threads, prefill $PREFILL tokens, decode $DECODE tokens at batch 1"
echo "CPU: $CPU; flags: $FLAGS; load average before: $LOAD0, after: $LOAD1"
echo "moe-ep: $MOE_EP (checkout $MOE_COMMIT); checkpoint: $CKPT; GGUFs: $GGUF_DIR; raw: $OUT"
for i in "${!PEER_LB[@]}"; do
  echo "${PEER_NAME[$i]}: ${PEER_LB[$i]} ($(peer_commit "$i")${PEER_ARGS[$i]:+, flags ${PEER_ARGS[$i]}})"
done
[ "$FLOOR" = 1 ] && echo "read bandwidth (moe-ep probe, GB/s): before ${BW0:-?}, after ${BW1:-?}"
for s in "${SKIPPED[@]}"; do echo "skipped: $s"; done
W4_GROUP=${INT4_GROUP:-$("$MOE_EP" generate --help 2>&1 | sed -n 's/.*--int4-group[^=[]*[=[]\([0-9]*\).*/\1/p' | head -1)}
for job in "${JOBS[@]}"; do
  set -- $job
  if [ "$1" = moe ]; then moe_cmd "$2"; echo "command: ${CMD[*]/"@$IDS_FILE"/@\$IDS_FILE} --output-json F"
  else for k in prefill decode; do llama_cmd "$2" "$3" $k; echo "command: ${CMD[*]}"; done; fi
done
echo "(\$IDS_FILE: $PREFILL prompt ids, id j = (17 + 104729 j) mod ($VOCAB - 256))"
[[ " ${JOBS[*]} " == *" moe w4a8 "* ]] && echo "(w4a8's bytes per token counted with --int4-group ${W4_GROUP:-32})"
echo
PYTHONPATH="$REPO/tools" python3 - "$RES" "$CKPT" "$GGUF_DIR" "$FLOOR" "${BW0:-0}" "${BW1:-0}" "$PREFILL" "$DECODE" "${W4_GROUP:-32}" "$LINEARS" "${PEER_NAME[@]}" <<'EOF'
import glob, json, os, statistics, struct, sys
from gguf_sizes import gguf_infos, kind_of, moe_step_bytes
res, ckpt, gguf_dir, floor = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
bw = max(float(sys.argv[5] or 0), float(sys.argv[6] or 0))
prefill, decode, w4_group = int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9])
linears_q8 = sys.argv[10] == "w8a8"  # attention projections and lm_head int8 in the quantised modes
linears_q4 = sys.argv[10] == "w4a8"  # ... or int4 + an f32 scale and a u8 zero point per group
peers = sys.argv[11:]  # the peers' names, by index: results rows "llama0", "llama1"
vals = {}
for line in open(res):
    r, eng, case, kind, tps = line.split("\t")
    vals.setdefault((eng, case, kind), []).append(float(tps))
med = {k: statistics.median(v) for k, v in vals.items()}
cfg = json.load(open(f"{ckpt}/config.json"))
topk, n_exp = cfg["num_experts_per_tok"], cfg.get("num_experts", cfg.get("n_routed_experts"))  # DeepSeek's name
# Cached values per position and layer: MLA keeps one latent and one rotary key for all
# heads; GQA a K and a V per KV head.
per_pos = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] if cfg.get("kv_lora_rank")
           else 2 * cfg["num_key_value_heads"] * cfg["head_dim"])
kv_elems = cfg["num_hidden_layers"] * per_pos * (prefill + decode / 2)

def moe_bytes(mode):
    """Bytes per decode token with moe-ep's storage of the checkpoint's tensors."""
    idx = json.load(open(f"{ckpt}/model.safetensors.index.json"))["weight_map"]
    total = 0.0
    for shard in sorted(set(idx.values())):
        with open(f"{ckpt}/{shard}", "rb") as f:
            hdr = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for name, t in hdr.items():
            if name == "__metadata__": continue
            shape, n = t["shape"], 1
            for d in t["shape"]: n *= d
            k = kind_of(name)
            if k == "expert":
                rows, cols = (n // shape[-1]), shape[-1]  # [.., out, in]
                b = {"bf16": 2.0 * n, "w8a8": n + 4.0 * rows,
                     "w4a8": 0.5 * n + 5.0 * rows * -(-cols // w4_group)}[mode]
                total += b * topk / n_exp
            elif k == "embed":
                total += 2.0 * shape[-1]
            elif name.endswith("mlp.gate.weight"):
                total += 4.0 * n  # router f32
            elif linears_q8 and mode != "bf16" and len(shape) == 2:  # int8 + f32 scale per row
                total += n + 4.0 * shape[0]
            elif linears_q4 and mode != "bf16" and len(shape) == 2:
                total += 0.5 * n + 5.0 * shape[0] * -(-shape[1] // w4_group)
            else:
                total += 2.0 * n
    return total + (4.0 if os.environ.get("KV", "bf16") == "f32" else 2.0) * kv_elems  # moe-ep's KV dtype

def gguf_bytes(path):
    """Bytes per decode token from a GGUF's tensor table (stored sizes, any quant type)."""
    total = 0.0
    for name, dims, nb, ty in gguf_infos(path):
        k = kind_of(name)
        if k == "expert": total += nb * topk / n_exp
        elif k == "embed": total += nb / dims[-1]  # one row of [H, V]
        else: total += nb
    return total + 2.0 * kv_elems  # KV f16

def moe_gguf_bytes(path):
    """Bytes per decode token of moe-ep running a GGUF: tensors of integer-coded types in
    their codes (CODED), float ones in bf16, a quantised token_embd as its blocks (one row
    per token), the router f32; with LINEARS w8a8 the 2-D non-expert tensors int8 + an f32
    scale per row instead (w4a8: int4 + an f32 scale and a u8 zero point per group)."""
    q8 = linears_q8 and not path.endswith("-BF16.gguf")
    q4 = linears_q4 and not path.endswith("-BF16.gguf")
    total = 0.0
    for name, dims, nb, ty in gguf_infos(path):
        linear = kind_of(name) == "other" and "ffn_gate_inp" not in name and len(dims) == 2
        n = dims[0] * dims[-1]
        if q8 and linear: total += n + 4.0 * dims[1]
        elif q4 and linear: total += 0.5 * n + 5.0 * dims[1] * -(-dims[0] // w4_group)
        else: total += moe_step_bytes(name, dims, nb, ty, topk, n_exp)
    return total + (4.0 if os.environ.get("KV", "bf16") == "f32" else 2.0) * kv_elems

def fmt(x): return f"{x:.1f}" if x else "-"
def ratio(a, b): return f"{a / b:.2f}" if a and b else "-"
pairs = [("bf16", "BF16"), ("w8a8", "Q8_0"), ("w4a8", "Q4_0"), ("w4a8", "Q4_K_M")]
pairs += sorted({(c, c[5:]) for (e, c, k) in med if c.startswith("gguf:")})
for pi, peer in enumerate(peers):  # one table per peer, the same moe-ep medians in each
    eng = f"llama{pi}"
    if pi: print()
    print(f"| moe-ep | {peer} | decode moe-ep | decode {peer} | ratio | prefill moe-ep | prefill {peer} | ratio |"
          + (f" MB/token moe-ep / {peer} | floor frac moe-ep / {peer} |" if floor else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if floor else ""))
    for m, t in pairs:
        md, ld = med.get(("moe", m, "decode")), med.get((eng, t, "decode"))
        mp, lp = med.get(("moe", m, "prefill")), med.get((eng, t, "prefill"))
        if md is None and mp is None: continue  # a moe-ep mode this run left out
        row = f"| {m} | {t} | {fmt(md)} | {fmt(ld)} | {ratio(md, ld)} | {fmt(mp)} | {fmt(lp)} | {ratio(mp, lp)} |"
        if floor:
            g = glob.glob(f"{gguf_dir}/*-{t}.gguf")
            mb = (moe_gguf_bytes(g[0]) if m.startswith("gguf:") else moe_bytes(m)) if md else 0
            lb = gguf_bytes(g[0]) if g and ld else 0
            fr = lambda tps, b: f"{tps * b / (bw * 1e9):.2f}" if tps and b and bw else "-"
            mbs = lambda b: f"{b / 1e6:.0f}" if b else "-"
            row += f" {mbs(mb)} / {mbs(lb)} | {fr(md, mb)} / {fr(ld, lb)} |"
        print(row)
print(f"\ntokens/s, median of {len(next(iter(vals.values()))) if vals else 0} round(s); ratio = moe-ep / the table's peer"
      + (f"; floor frac = decode tokens/s x bytes per token / {bw:.1f} GB/s" if floor else ""))
EOF
