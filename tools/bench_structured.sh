#!/usr/bin/env bash
# Structured outputs' cost per decode step (docs/PERF_SERVE.md): `moe-ep serve` on a
# generated Qwen3-30B-A3B-shaped model (2 layers, 128 experts, H 2048, I 768, random bf16
# weights) with a vocabulary of Qwen3's size (151,936; tools/gen_big_vocab.py), one
# request at a time, the time per output token (TPOT) of requests with a json_schema
# response_format against the same requests without, in interleaved rounds. The schema
# is an array of at least 64 strings, so a reply runs all N (<= 128) tokens inside the grammar (bench-serve
# counts a request only if it ran exactly N tokens; the server's grammar makes the text
# a JSON array prefix).
#   tools/bench_structured.sh [OUT_DIR]    (env: BIN, DIR, N, R, ROUNDS, LAYERS)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/moe-ep}; DIR=${DIR:-/tmp/q3vocab150k}; OUT=${1:-bench-results/structured}
N=${N:-64}; R=${R:-8}; ROUNDS=${ROUNDS:-3}; LAYERS=${LAYERS:-2}
mkdir -p "$OUT"
if [ ! -f "$DIR/config.json" ]; then
  g++ -O2 -std=c++20 -o /tmp/gen_big_checkpoint tools/gen_big_checkpoint.cpp
  /tmp/gen_big_checkpoint "$DIR" "$LAYERS" 128 2048 768 0 151936 32 4 128
  python3 tools/gen_big_vocab.py "$DIR"
fi
lscpu | grep -E "Model name|^CPU\(s\)" | tee "$OUT/machine.txt"
"$BIN" serve --model "$DIR" --dtype bf16 --port 0 --served-model-name q3 --max-model-len 512 --max-num-seqs 4 \
  2> "$OUT/serve.log" &
SPID=$!
trap 'kill -TERM $SPID 2>/dev/null; wait $SPID 2>/dev/null || true' EXIT
for _ in $(seq 3000); do grep -q 'on http://' "$OUT/serve.log" && break; sleep 0.1; done
URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve.log" | head -1)
SCHEMA='{"type": "json_schema", "json_schema": {"name": "words", "schema": {"type": "array", "items": {"type": "string"}, "minItems": 64}}}'
run() {  # run LABEL ROUND [--response-format JSON]
  local label=$1 round=$2; shift 2
  "$BIN" bench-serve --url "$URL" --concurrency 1 --requests "$R" --prompt-len 32 --output-len "$N" \
    --token-range 1000,100000 --seed "$round" --timeout 900 --output-json "$OUT/${label}_$round.json" "$@" \
    > "$OUT/${label}_$round.txt"
  jq -r '.levels[0].tpot_ms.mean' "$OUT/${label}_$round.json"
}
# The result first: a constrained reply is the start of a JSON array of strings.
curl -s "$URL/v1/completions" -d "{\"prompt\": \"Words:\", \"max_tokens\": $N, \"temperature\": 0, \"ignore_eos\": true,
  \"response_format\": $SCHEMA}" > "$OUT/check.json"
jq -e '.choices[0].text | test("^[ \\t\\n\\r]*\\[[ \\t\\n\\r]*(\\]|\")")' "$OUT/check.json" > /dev/null ||
  { echo "the constrained reply is not a JSON array: $(jq -c '.choices[0].text' "$OUT/check.json")"; exit 1; }
echo "check: a constrained reply starts $(jq -c '.choices[0].text[0:40]' "$OUT/check.json")" | tee "$OUT/summary.txt"
run warmup 0 > /dev/null
for round in $(seq "$ROUNDS"); do
  free=$(run none "$round")
  constrained=$(run json_schema "$round" --response-format "$SCHEMA")
  awk -v a="$free" -v b="$constrained" -v r="$round" 'BEGIN { printf "round %d: TPOT none %.2f ms, json_schema %.2f ms, ratio %.3f\n", r, a, b, b / a }'
done | tee -a "$OUT/summary.txt"
grep '^round' "$OUT/summary.txt" | awk '{ print $NF }' | sort -n | awk '{ v[NR] = $1 } END { printf "median ratio json_schema / none: %.3f (%d rounds)\n", v[int((NR + 1) / 2)], NR }' \
  | tee -a "$OUT/summary.txt"
