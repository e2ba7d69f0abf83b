#!/usr/bin/env bash
# The README's main job: builds moe-ep, runs the MoE block of a small Qwen3-MoE
# model that ships with the repo (tests/fixtures/qwen3_moe, made by transformers)
# and checks it against transformers' own output, runs it on 2 ranks with expert
# parallelism, then benchmarks a layer of Qwen3-30B-A3B's shape on this machine;
# then talks to a small model with a tokenizer and a chat template
# (tests/fixtures/chat_qwen3): tokenize, a chat with `generate --chat`, and the same
# chat through `moe-ep serve` and curl, on 1 and 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Only the CLI (not the tests or benches): the first output comes after the ~130 library
# objects, not the ~210 of the whole tree.
TARGETS=moe-ep bash scripts/build.sh >/dev/null
BIN=build/moe-ep
MODEL=tests/fixtures/qwen3_moe
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo
echo "== 1. The MoE block of layer 2 of $MODEL on 33 tokens (f32, then bf16)"
# Tolerances: f32 differs from transformers only by summation order; bf16 rounds
# each expert's intermediate activation to bf16 (see tests/test_fixtures.cpp).
for run in "f32 1e-5 1e-5" "bf16 2e-2 1.6e-2"; do
  set -- $run
  $BIN layer --model $MODEL --layer 2 --input $MODEL/golden/L2_T33_in.safetensors \
    --output "$OUT/y_$1.safetensors" --dtype $1
  $BIN compare "$OUT/y_$1.safetensors" $MODEL/golden/L2_T33_out.safetensors --atol $2 --rtol $3 \
    --label "moe-ep $1 vs transformers fp32"
done

echo
echo "== 2. The same block on 2 ranks, each holding half of the 60 experts (--ep 2, all-to-all)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE
mpirun -np 2 --oversubscribe $BIN layer --model $MODEL --layer 2 --input $MODEL/golden/L2_T33_in.safetensors \
  --output "$OUT/y_ep2.safetensors" --dtype bf16 --ep 2 --moe-comm alltoall
if cmp -s "$OUT/y_ep2.safetensors" "$OUT/y_bf16.safetensors"; then
  echo "2 ranks vs 1 rank: bitwise identical output"
else
  echo "2 ranks vs 1 rank: outputs DIFFER"; exit 1
fi

echo
echo "== 3. Whole model: greedy generation of 16 tokens for 3 prompts, 1 rank, then 2 ranks (--ep 2)"
PROMPTS="65;17,60,2,102,92;67,55,100,73,47,83,9,62,21"   # the prompts of $MODEL/golden/greedy.json
# f32 weights and KV cache, as transformers' fp32 golden ran (the default is the
# checkpoint's own dtype, bf16 here, with a bf16 KV cache).
$BIN generate --model $MODEL --prompt-ids "$PROMPTS" --max-new-tokens 16 --ignore-eos --dtype f32 \
  --kv-cache-dtype f32 | tee "$OUT/gen1.txt"
mpirun -np 2 --oversubscribe $BIN generate --model $MODEL --prompt-ids "$PROMPTS" --max-new-tokens 16 \
  --ignore-eos --dtype f32 --kv-cache-dtype f32 --ep 2 --moe-comm alltoall | tee "$OUT/gen2.txt"
if diff <(grep '^prompt' "$OUT/gen1.txt") <(grep '^prompt' "$OUT/gen2.txt") >/dev/null; then
  echo "2 ranks vs 1 rank: the same tokens"
else
  echo "2 ranks vs 1 rank: tokens DIFFER"; exit 1
fi
echo "transformers' greedy tokens for the same prompts ($MODEL/golden/greedy.json):"
grep -o '"generated": \[[0-9, ]*\]' $MODEL/golden/greedy.json | sed 's/"generated": /  /'

echo
CHAT=tests/fixtures/chat_qwen3
echo "== 4. Text: $CHAT has a tokenizer.json and a Qwen3-style chat template (random weights: the words are random too)"
echo "moe-ep tokenize 'The quick brown fox': $($BIN tokenize --model $CHAT --text 'The quick brown fox')"
echo "transformers' ids (golden):             $(jq -c '.prompts[] | select(.name == "plain_0") | .prompt_ids' \
  $CHAT/golden/chat_greedy.json)"
echo '[{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": "What is the capital of France?"}]' > "$OUT/chat.json"
echo "The chat rendered with the model's template:"
$BIN tokenize --model $CHAT --chat-file "$OUT/chat.json" --add-generation-prompt --render-only --template-kwargs '{"enable_thinking": false}'
echo "--- moe-ep generate --chat-file (streams the reply; stops at <|im_end|>):"
$BIN generate --model $CHAT --chat-file "$OUT/chat.json" --template-kwargs '{"enable_thinking": false}' --max-new-tokens 12 2>/dev/null
echo "--- transformers' greedy reply for the same chat (golden):"
jq -r '.prompts[] | select(.name == "system_user") | .text' $CHAT/golden/chat_greedy.json

echo
echo "== 5. The same chat through moe-ep serve (OpenAI API) and curl, then under mpirun --ep 2"
for ranks in 1 2; do
  if [ $ranks = 1 ]; then launch=(); else launch=(mpirun -np 2 --oversubscribe); fi
  "${launch[@]}" $BIN serve --model $CHAT --port 0 --served-model-name demo --max-model-len 256 --ep $ranks \
    2> "$OUT/serve.log" &
  SPID=$!
  for _ in $(seq 300); do grep -q 'on http://' "$OUT/serve.log" && break; sleep 0.1; done
  URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/serve.log" | head -1)
  echo "$ranks rank(s): POST $URL/v1/chat/completions ->"
  curl -s "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d "{\"model\": \"demo\", \"max_tokens\": 12,
    \"temperature\": 0, \"chat_template_kwargs\": {\"enable_thinking\": false}, \"messages\": $(cat "$OUT/chat.json")}" |
    jq -c '{content: .choices[0].message.content, finish_reason: .choices[0].finish_reason, usage}'
  kill -TERM $SPID; wait $SPID || true
done

echo
echo "== 6. One Qwen3-30B-A3B-shaped MoE layer (H=2048, I=768, E=128, k=8), random bf16 weights"
$BIN bench --shape qwen3-30b-a3b --tokens 1,16,128 --dtype bf16 --seconds 1
