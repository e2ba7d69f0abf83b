#!/usr/bin/env bash
# The runs behind docs/PERF_SERVE.md: `moe-ep serve` loaded by `moe-ep bench-serve` on a
# generated Qwen3-30B-A3B-shaped model (4 layers, 128 experts, H 2048, I 768, random bf16
# weights, vocab 1226 with the chat_qwen3 fixture tokenizer), on 1 rank and under
# mpirun --ep 2; then `moe-ep generate` of 16 prompts of the same length as one batch,
# the scheduler-free baseline for the server's output tokens/s at concurrency 16.
#   tools/bench_serve.sh [OUT_DIR]     (env: BIN, DIR, P, N, CONC, R, RANKS)
# AGENT_TURNS=T (TURN_TOKENS=K, default 1024) runs the agent replay instead, on 1 rank:
# one conversation resent whole every turn, growing by K random ids a turn, the time to
# first token from the prefix cache against the whole history cold and the new tokens
# alone (`moe-ep bench-serve --agent-turns`; context T * K + N, so --max-model-len fits).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/moe-ep}; DIR=${DIR:-/tmp/q3serve}; OUT=${1:-bench-results/serve}
P=${P:-32}; N=${N:-32}; CONC=${CONC:-1,4,16}; R=${R:-16}; RANKS=${RANKS:-"1 2"}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
if [ ! -f "$DIR/config.json" ]; then
  g++ -O2 -std=c++20 -o /tmp/gen_big_checkpoint tools/gen_big_checkpoint.cpp
  /tmp/gen_big_checkpoint "$DIR" 4 128 2048 768 0 1226
  cp tests/fixtures/chat_qwen3/tokenizer.json tests/fixtures/chat_qwen3/tokenizer_config.json "$DIR"/
fi
lscpu | grep -E "Model name|^CPU\(s\)" | tee "$OUT/machine.txt"
uptime | tee -a "$OUT/machine.txt"
if [ -n "${AGENT_TURNS:-}" ]; then
  K=${TURN_TOKENS:-1024}
  "$BIN" serve --model "$DIR" --dtype bf16 --port 0 --served-model-name q3 --max-model-len $((AGENT_TURNS * K + N + 16)) \
    --max-num-seqs 4 --max-batch-tokens 512 2> "$OUT/serve_agent.log" &
  SPID=$!
  for _ in $(seq 1200); do grep -q 'on http://' "$OUT/serve_agent.log" && break; sleep 0.1; done
  URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve_agent.log" | head -1)
  rc=0
  "$BIN" bench-serve --url "$URL" --agent-turns "$AGENT_TURNS" --turn-tokens "$K" --output-len "$N" --timeout 3600 \
    --token-range 1,1001 --output-json "$OUT/agent.json" | tee "$OUT/agent.txt" || rc=$?
  curl -s "$URL/metrics" > "$OUT/metrics_agent.txt"
  kill -TERM "$SPID"; wait "$SPID" || true
  exit "$rc"
fi
for ranks in $RANKS; do
  if [ "$ranks" = 1 ]; then launch=(); else launch=(mpirun -np "$ranks" --oversubscribe); fi
  "${launch[@]}" "$BIN" serve --model "$DIR" --dtype bf16 --port 0 --served-model-name q3 --ep "$ranks" \
    --max-model-len 256 --max-num-seqs 64 --max-batch-tokens 512 2> "$OUT/serve_$ranks.log" &
  SPID=$!
  for _ in $(seq 1200); do grep -q 'on http://' "$OUT/serve_$ranks.log" && break; sleep 0.1; done
  URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve_$ranks.log" | head -1)
  "$BIN" bench-serve --url "$URL" --concurrency "$CONC" --prompt-len "$P" --output-len "$N" --requests "$R" \
    --timeout 600 --token-range 1,1001 --output-json "$OUT/bench_serve_$ranks.json" | tee "$OUT/bench_serve_$ranks.txt"
  curl -s "$URL/metrics" > "$OUT/metrics_$ranks.txt"
  kill -TERM "$SPID"; wait "$SPID" || true
done
# Baseline: 16 prompts of P random ids (the same range bench-serve draws from), one batch.
ids=$(awk -v p="$P" -v seed=7 'BEGIN { srand(seed); for (i = 0; i < 16; i++) { s = ""; for (j = 0; j < p; j++)
        s = s (j ? "," : "") int(1 + rand() * 1000); printf "%s%s", (i ? ";" : ""), s } }')
"$BIN" generate --model "$DIR" --dtype bf16 --prompt-ids "$ids" --max-new-tokens "$N" --ignore-eos \
  --output-json "$OUT/generate16.json" --quiet
jq -r --argjson n "$N" '"generate, 16 prompts as one batch: \(16 * $n) output tokens in \(.timings.prefill_s + .timings.decode_s | . * 1000 | round) ms = \(16 * $n / (.timings.prefill_s + .timings.decode_s) | . * 10 | round / 10) output tokens/s (prefill \(.timings.prefill_tokens_per_s | round) tokens/s, decode \(.timings.decode_tokens_per_s | round) tokens/s)"' \
  "$OUT/generate16.json" | tee "$OUT/generate16.txt"
