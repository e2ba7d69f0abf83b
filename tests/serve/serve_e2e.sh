#!/usr/bin/env bash
# moe-ep serve end to end, driven by curl (and jq to read the JSON): a real server on a
# fixture model that has a tokenizer and a chat template.
#   serve_e2e.sh BIN MODEL basic     one rank: answers equal `moe-ep generate`, streaming
#                                    equals non-streaming, answers from the prefix cache
#                                    equal cold ones, n=3 choices share the prompt's blocks,
#                                    structured outputs (json_schema, forced tool calls,
#                                    hostile schemas and tool lists), errors, 64 concurrent clients
#                                    (some disconnecting), no KV leak, RSS flat, SIGTERM
#   serve_e2e.sh BIN MODEL ep2       mpirun -np 2 --ep 2: the same answers as one rank
#                                    (cold and from the prefix cache, n=3 choices),
#                                    structured outputs that validate,
#                                    SIGTERM on rank 0 ends every rank with 0
#   serve_e2e.sh BIN MODEL attn2     mpirun -np 2 --ep 2 --attn-tp 2: the same answers as one rank
#   serve_e2e.sh BIN MODEL kill      mpirun -np 2 --ep 2: rank 1 killed under load ends
#                                    the job non-zero in bounded time, clients see errors
#   serve_e2e.sh BIN MODEL ep4       mpirun -np 4 --ep 4: the same answers as one rank
#                                    (cold, from the prefix cache, n=3 choices, a seeded
#                                    top_k draw), SIGTERM on rank 0 ends every rank with 0;
#                                    structured outputs are left to ep2 (whether a random
#                                    fixture's forced tool call closes within its tokens
#                                    depends on the fixture's weights, not on the ranks)
# E2E_FLAGS (e.g. "--dtype bf16") go to every serve and generate command.
# Every loop is bounded; only 127.0.0.1 is contacted.
set -euo pipefail
BIN=$(realpath "$1"); MODEL=$(realpath "$2"); MODE=$3
TMP=$(mktemp -d)
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill -9 "$SERVER_PID" 2>/dev/null || true
  pkill -9 -f "moe-ep serve --model $MODEL" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_WAIT_POLICY=PASSIVE OMPI_MCA_mpi_yield_when_idle=1
fail() { echo "FAIL: $*"; echo "--- server log"; cat "$TMP/server.log" 2>/dev/null | tail -30; exit 1; }
KEY=sekret
NAME=e2e-model
MAXTOK=12

# start_server CMD...: runs it in the background, waits for the port line (60 s).
start_server() {
  "$@" > "$TMP/server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    PORT=$(grep -o 'on http://127.0.0.1:[0-9]*' "$TMP/server.log" | head -1 | sed 's/.*://') || true
    [ -n "${PORT:-}" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited during start"
    sleep 0.1
  done
  [ -n "${PORT:-}" ] || fail "server did not start within 60 s"
  URL="http://127.0.0.1:$PORT"
}
SERVE_FLAGS=(serve --model "$MODEL" --port 0 --served-model-name "$NAME" --api-key "$KEY" --max-model-len 512 --max-num-seqs 16
             --max-batch-tokens 32)
read -r -a EXTRA <<< "${E2E_FLAGS:-}"
SERVE_FLAGS+=("${EXTRA[@]}")

post() {  # post PATH JSON -> body on stdout, status in $TMP/status
  curl -sS -m 60 -o "$TMP/body" -w '%{http_code}' -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
    -d "$2" "$URL$1" > "$TMP/status" || true
  cat "$TMP/body"
}
status() { cat "$TMP/status"; }
chat_body() {  # chat_body TEXT STREAM
  jq -cn --arg t "$1" --arg m "$NAME" --argjson s "$2" --argjson n $MAXTOK \
    '{model: $m, messages: [{role: "user", content: $t}], max_tokens: $n, temperature: 0, stream: $s,
      stream_options: {include_usage: true}}'
}
completion_body() {
  jq -cn --arg t "$1" --arg m "$NAME" --argjson s "$2" --argjson n $MAXTOK \
    '{model: $m, prompt: $t, max_tokens: $n, temperature: 0, stream: $s}'
}
# The text of an SSE stream on stdin (chat deltas or completion texts), and a check of
# the framing: every event is a data line, the last is [DONE].
sse_text() {
  local raw; raw=$(cat)
  [ "$(printf '%s' "$raw" | grep -v '^$' | grep -vc '^data: ')" = 0 ] || { echo "BAD-FRAMING"; return; }
  [ "$(printf '%s' "$raw" | grep '^data: ' | tail -1)" = "data: [DONE]" ] || { echo "NO-DONE"; return; }
  printf '%s' "$raw" | grep '^data: {' | sed 's/^data: //' |
    jq -j '(.choices[0].delta.content // .choices[0].text // "")'
}
PROMPTS=("Hello, how are you?" "Write a haiku about the sea." "日本語で答えてください。" "1 2 3 4 5")

# What `moe-ep generate` says for the same prompts (one rank, greedy): the reference.
reference() {
  local args=()
  for p in "${PROMPTS[@]}"; do args+=(--chat "$p"); done
  "$BIN" generate --model "$MODEL" "${EXTRA[@]}" "${args[@]}" --max-new-tokens $MAXTOK --output-json "$TMP/gen_chat.json" --quiet
  args=()
  for p in "${PROMPTS[@]}"; do args+=(--prompt "$p"); done
  "$BIN" generate --model "$MODEL" "${EXTRA[@]}" "${args[@]}" --max-new-tokens $MAXTOK --output-json "$TMP/gen_text.json" --quiet
}

check_answers() {  # every prompt: chat and completion, streamed and not, equal the reference
  local i=0
  for p in "${PROMPTS[@]}"; do
    want=$(jq -j ".text[$i]" "$TMP/gen_chat.json")
    got=$(post /v1/chat/completions "$(chat_body "$p" false)" | jq -j '.choices[0].message.content')
    [ "$(status)" = 200 ] || fail "chat $i: status $(status): $(cat "$TMP/body")"
    [ "$got" = "$want" ] || fail "chat $i: got '$got', generate gave '$want'"
    usage=$(jq -c '.usage' "$TMP/body")
    [ "$(jq '.completion_tokens' <<<"$usage")" -ge 1 ] || fail "chat $i: usage $usage"
    got=$(post /v1/chat/completions "$(chat_body "$p" true)" | sse_text)
    [ "$got" = "$want" ] || fail "chat $i streamed: got '$got', want '$want'"
    grep -q '"usage":{' "$TMP/body" || fail "chat $i streamed: no usage chunk (include_usage)"
    want=$(jq -j ".text[$i]" "$TMP/gen_text.json")
    got=$(post /v1/completions "$(completion_body "$p" false)" | jq -j '.choices[0].text')
    [ "$got" = "$want" ] || fail "completion $i: got '$got', generate gave '$want'"
    got=$(post /v1/completions "$(completion_body "$p" true)" | sse_text)
    [ "$got" = "$want" ] || fail "completion $i streamed: got '$got', want '$want'"
    i=$((i + 1))
  done
  echo "ok: ${#PROMPTS[@]} prompts x (chat, completion) x (stream, not) equal moe-ep generate"
}

# Prefix cache (on by default): a prompt served from cached blocks answers with the
# tokens and logprobs of its cold run, bit for bit (jq prints each float as the
# shortest text that reads back to the same double); a chat's second turn reads its
# history from the cache (usage.prompt_tokens_details.cached_tokens).
check_prefix_cache() {
  local body cold warm c0 c1 turn1 reply turn2 c2 n ids
  body=$(jq -cn --arg m "$NAME" --arg t "prefix cache probe: $(seq -s ' ' 100 112)" \
    '{model: $m, prompt: $t, max_tokens: 8, temperature: 0, logprobs: 5}')
  cold=$(post /v1/completions "$body" | jq -c '.choices[0] | [.text, .logprobs]')
  c0=$(jq '.usage.prompt_tokens_details.cached_tokens' "$TMP/body")
  warm=$(post /v1/completions "$body" | jq -c '.choices[0] | [.text, .logprobs]')
  c1=$(jq '.usage.prompt_tokens_details.cached_tokens' "$TMP/body")
  [ "$(status)" = 200 ] || fail "prefix cache probe: status $(status): $(cat "$TMP/body")"
  [ "$c0" = 0 ] || fail "a new prompt reported $c0 cached tokens"
  [ "$c1" -gt 0 ] || fail "the same prompt again reported $c1 cached tokens"
  [ "$cold" = "$warm" ] || fail "answer from the prefix cache differs: cold $cold, cached $warm"
  turn1=$(jq -cn --arg m "$NAME" --arg t "Remember these numbers: $(seq -s ' ' 1 14)" \
    '{model: $m, messages: [{role: "user", content: $t}], max_tokens: 6, temperature: 0}')
  reply=$(post /v1/chat/completions "$turn1" | jq -c '.choices[0].message | {role, content}')
  [ "$(status)" = 200 ] || fail "first turn: status $(status): $(cat "$TMP/body")"
  turn2=$(jq -c --argjson r "$reply" '.messages += [$r, {role: "user", content: "And now?"}]' <<<"$turn1")
  c2=$(post /v1/chat/completions "$turn2" | jq '.usage.prompt_tokens_details.cached_tokens')
  [ "$(status)" = 200 ] || fail "second turn: status $(status): $(cat "$TMP/body")"
  [ "$c2" -gt 0 ] || fail "a chat's second turn reported $c2 cached tokens"
  # /tokenize counts what the chat ran; /detokenize gives its text back.
  n=$(post /tokenize "$turn2" | jq '.count')
  [ "$n" = "$(jq '.usage.prompt_tokens' <<<"$(post /v1/chat/completions "$turn2")")" ] || fail "/tokenize count $n"
  ids=$(post /tokenize "$(jq -cn --arg m "$NAME" '{model: $m, prompt: "Hello, how are you?", add_special_tokens: false}')" |
    jq -c '.tokens')
  [ "$(post /detokenize "{\"tokens\": $ids}" | jq -r '.prompt')" = "Hello, how are you?" ] || fail "/detokenize: $(cat "$TMP/body")"
  echo "ok: prefix cache: the same prompt answers bit for bit from $c1 cached tokens; a second chat turn reads $c2"
}

# n choices (greedy): every choice is the one-choice answer, and the later choices
# read the prompt's full blocks from the prefix cache (serve/choices.h): the cache's hit
# counter grows by at least (n - 1) x the tokens a repeat of the prompt finds cached.
check_choices() {
  local body h0 h1 answers one c
  body=$(jq -cn --arg m "$NAME" --arg t "Choices probe: $(seq -s ' ' 200 214)" \
    '{model: $m, messages: [{role: "user", content: $t}], max_tokens: 6, temperature: 0, n: 3}')
  h0=$(metric moe_ep_prefix_cache_hits_total)
  answers=$(post /v1/chat/completions "$body" | jq -c '[.choices[] | [.index, .message.content, .finish_reason]]')
  [ "$(status)" = 200 ] || fail "n=3: status $(status): $(cat "$TMP/body")"
  h1=$(metric moe_ep_prefix_cache_hits_total)
  one=$(post /v1/chat/completions "$(jq -c '.n = 1' <<<"$body")" | jq -c '.choices[0] | [.message.content, .finish_reason]')
  c=$(jq '.usage.prompt_tokens_details.cached_tokens' "$TMP/body")
  [ "$(jq -c '[.[] | .[0]]' <<<"$answers")" = "[0,1,2]" ] || fail "n=3: choices $answers"
  [ "$(jq -c '[.[] | .[1:]] | unique' <<<"$answers")" = "[$one]" ] || fail "n=3 greedy: $answers, one choice: $one"
  [ "$c" -gt 0 ] || fail "the n=3 prompt again reported $c cached tokens"
  [ $((h1 - h0)) -ge $((2 * c)) ] || fail "n=3: prefix-cache hits grew by $((h1 - h0)), want >= 2 x $c"
  echo "ok: n=3 greedy choices equal the one-choice answer; choices 2 and 3 read $((h1 - h0)) tokens from the cache"
}

# A seeded top-k draw reads only the row's k best logits (under --attn-tp the ranks send
# just theirs); asking for logprobs makes the engine read whole rows. Same text both ways.
check_seeded_top_k() {
  local body a b
  body=$(jq -cn --arg m "$NAME" --arg t "${PROMPTS[1]}" \
    '{model: $m, messages: [{role: "user", content: $t}], max_tokens: 8, temperature: 0.9, top_k: 3, seed: 7}')
  a=$(post /v1/chat/completions "$body" | jq -j '.choices[0].message.content')
  [ "$(status)" = 200 ] || fail "seeded top_k: status $(status): $(cat "$TMP/body")"
  b=$(post /v1/chat/completions "$(jq -c '.logprobs = true | .top_logprobs = 1' <<<"$body")" | jq -j '.choices[0].message.content')
  [ "$a" = "$b" ] || fail "seeded top_k: '$a' from the k best logits, '$b' from whole rows"
  echo "ok: a seeded top_k=3 draw gives the same text from the k best logits and from whole rows"
}

rank_pid() {  # the pid of MPI rank $1 of the server
  local p
  for p in $(pgrep -f "moe-ep serve --model $MODEL" || true); do
    if tr '\0' '\n' < /proc/"$p"/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then echo "$p"; return; fi
  done
}
metric() { curl -sS -m 10 "$URL/metrics" | grep "^$1 " | awk '{print $2}'; }
rss_kb() { awk '/VmRSS/ {print $2}' /proc/"$1"/status; }

# Structured outputs (serve/grammar): a json_schema reply from this random-weight model
# parses and validates (checked with jq), ends with "stop", and a seeded repeat (its
# prompt now cached) is the same; tool_choice "required" / named return calls of the
# listed tools whose arguments validate. No thinking: the model's free reasoning would
# rarely end within max_tokens.
SCHEMA='{"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
  "age": {"type": "integer", "minimum": 0, "maximum": 120}, "ok": {"type": "boolean"}},
  "required": ["name", "age", "ok"], "additionalProperties": false}'
TOOLS='[{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
  "properties": {"tz": {"enum": ["utc", "cet"]}}, "required": ["tz"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
  "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}]'
structured_body() {  # structured_body SEED EXTRA_JSON
  jq -cn --arg m "$NAME" --argjson seed "$1" --argjson extra "$2" \
    '{model: $m, messages: [{role: "user", content: "Reply as JSON."}], max_tokens: 400, temperature: 1.0, seed: $seed,
      chat_template_kwargs: {enable_thinking: false}} + $extra'
}
check_structured() {
  local rf first again
  rf=$(jq -cn --argjson s "$SCHEMA" '{response_format: {type: "json_schema", json_schema: {name: "p", schema: $s}}}')
  for seed in 1 2 3; do
    first=$(post /v1/chat/completions "$(structured_body $seed "$rf")")
    [ "$(status)" = 200 ] || fail "json_schema seed $seed: status $(status): $first"
    [ "$(jq -r '.choices[0].finish_reason' <<<"$first")" = stop ] || fail "json_schema seed $seed: $(jq -c '.choices[0]' <<<"$first")"
    jq -e '.choices[0].message.content | fromjson | (keys == ["age", "name", "ok"]) and (.name | type == "string" and length <= 6)
           and (.age | type == "number" and . == floor and . >= 0 and . <= 120) and (.ok | type == "boolean")' \
      <<<"$first" >/dev/null || fail "json_schema seed $seed: reply does not validate: $(jq -c '.choices[0].message' <<<"$first")"
    again=$(post /v1/chat/completions "$(structured_body $seed "$rf")")
    [ "$(jq -c '.choices[0].message' <<<"$again")" = "$(jq -c '.choices[0].message' <<<"$first")" ] ||
      fail "json_schema seed $seed: the repeat differs"
  done
  # How long a forced call takes is the random model's draw: between JSON tokens the
  # grammar allows whitespace, which these weights often pick, and "required" allows more
  # calls after the first; the 512-token context leaves 140 tokens after the tool list.
  # So every reply that finishes must be valid calls, one cut by max_tokens must be inside
  # the forced call (no text before it, any parsed call one of the listed tools), and of 8
  # seeds at least 2 must finish (measured on the DeepSeek FP8 fixture: "required" 8 of 12
  # seeds, named 12 of 12).
  local finished
  for choice in '"required"' '{"type": "function", "function": {"name": "get_time"}}'; do
    finished=0
    for seed in 1 2 3 4 5 6 7 8; do
      [ "$finished" -ge 2 ] && break
      first=$(post /v1/chat/completions "$(structured_body $seed "{\"tools\": $TOOLS, \"tool_choice\": $choice, \"max_tokens\": 140}")")
      [ "$(status)" = 200 ] || fail "tool_choice $choice: status $(status): $first"
      case "$(jq -r '.choices[0].finish_reason' <<<"$first")" in
        tool_calls) finished=$((finished + 1)) ;;
        length)
          jq -e '.choices[0].message | ((.content // "") | ltrimstr("\n") | . == "" or startswith("<")) and
                 ((.tool_calls // []) | all(.[]; .function.name == "get_time" or .function.name == "get_weather"))' \
            <<<"$first" >/dev/null || fail "tool_choice $choice seed $seed: cut reply is not a forced call: $(jq -c '.choices[0].message' <<<"$first")"
          continue ;;
        *) fail "tool_choice $choice seed $seed: $(jq -c '.choices[0]' <<<"$first")" ;;
      esac
      jq -e '.choices[0].message.tool_calls | length >= 1 and all(.[]; .type == "function" and (.id | length > 0) and
             (if .function.name == "get_time" then (.function.arguments | fromjson | keys == ["tz"] and (.tz == "utc" or .tz == "cet"))
              elif .function.name == "get_weather" then (.function.arguments | fromjson | .city | type == "string" and length <= 8)
              else false end))' <<<"$first" >/dev/null ||
        fail "tool_choice $choice seed $seed: calls do not validate: $(jq -c '.choices[0].message' <<<"$first")"
      if [ "$choice" != '"required"' ]; then
        jq -e '[.choices[0].message.tool_calls[].function.name] | unique == ["get_time"]' <<<"$first" >/dev/null ||
          fail "named tool_choice called another tool: $(jq -c '.choices[0].message' <<<"$first")"
      fi
    done
    [ "$finished" -ge 2 ] || fail "tool_choice $choice: fewer than 2 of 8 seeds ended their calls within 140 tokens"
  done
  echo "ok: json_schema replies validate (and repeat from the cache); forced tool calls validate"
}

# Hostile structured-output requests: each a 400 naming the field; the server keeps serving.
check_structured_hostile() {
  local big many
  bad() {  # bad WHAT PARAM BODY
    post /v1/chat/completions "$3" >/dev/null
    [ "$(status)" = 400 ] || fail "$1: status $(status): $(cat "$TMP/body")"
    [ "$(jq -r '.error.param' "$TMP/body")" = "$2" ] || fail "$1: param $(jq -c '.error' "$TMP/body")"
  }
  bad "invalid schema" response_format "$(structured_body 1 '{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}')"
  bad "self-referential schema" response_format "$(structured_body 1 '{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}}')"
  big=$(jq -cn '{response_format: {type: "json_schema", json_schema: {name: "x", schema: {type: "object",
        properties: ([range(0; 3000)] | map({key: "field_\(.)", value: {type: "integer"}}) | from_entries)}}}}')
  bad "huge schema" response_format.json_schema.schema "$(structured_body 1 "$big")"
  many=$(jq -cn '{tools: [range(0; 1000)] | map({type: "function", function: {name: "t\(.)"}}), tool_choice: "required"}')
  bad "1000 tools" tools "$(structured_body 1 "$many")"
  bad "n = 10^6" n "$(structured_body 1 '{"n": 1000000}')"
  bad "unknown response_format" response_format "$(structured_body 1 '{"response_format": {"type": "yaml"}}')"
  post /v1/completions '{"model": "e2e-model", "prompt": "JSON:", "max_tokens": 40, "seed": 2, "temperature": 1.0,
    "response_format": {"type": "json_object"}}' > /dev/null
  [ "$(status)" = 200 ] || fail "completions json_object after the hostile ones: $(status) $(cat "$TMP/body")"
  jq -e '.choices[0].text | test("^[ \\t\\n\\r]*\\{")' "$TMP/body" >/dev/null || fail "completions json_object: $(cat "$TMP/body")"
  echo "ok: invalid, self-referential and huge schemas, 1000 tools, n = 10^6: 400 each; the server keeps serving"
}

# N ranks (STRUCTURED: also the structured-output checks) with the layout flags given:
# the answers equal one rank's (cold, from the prefix cache, n=3 choices), and SIGTERM on
# rank 0 ends every rank with 0.
ranks() {
  local n=$1 structured=$2
  shift 2
  reference
  start_server mpirun -np "$n" --oversubscribe "$BIN" "${SERVE_FLAGS[@]}" "$@" --comm-timeout 20
  check_answers
  check_prefix_cache
  check_choices
  check_seeded_top_k
  [ "$structured" = structured ] && check_structured
  local rank0 rc=0
  rank0=$(rank_pid 0)
  [ -n "$rank0" ] || fail "cannot find rank 0"
  kill -TERM "$rank0"
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  [ "$rc" = 0 ] || fail "SIGTERM on rank 0: mpirun exit code $rc"
  echo "ok: $* answers equal one rank's; SIGTERM on rank 0 -> every rank exits 0"
}

case "$MODE" in
basic)
  reference
  start_server "$BIN" "${SERVE_FLAGS[@]}"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] || fail "/health not 200"
  [ "$(curl -s -H "Authorization: Bearer $KEY" "$URL/v1/models" | jq -r '.data[0].id')" = "$NAME" ] || fail "/v1/models"
  check_answers
  check_prefix_cache
  check_choices
  check_structured
  check_structured_hostile
  # Errors, each with its status and OpenAI's error shape.
  [ "$(curl -s -o /dev/null -w '%{http_code}' -d '{}' "$URL/v1/chat/completions")" = 401 ] || fail "no key: not 401"
  post /v1/chat/completions '{"model": "e2e-model", "messages": [' >/dev/null; [ "$(status)" = 400 ] || fail "truncated JSON: $(status)"
  jq -e '.error.message' "$TMP/body" >/dev/null || fail "error shape: $(cat "$TMP/body")"
  post /v1/chat/completions '{"model": "nope", "messages": [{"role": "user", "content": "x"}]}' >/dev/null
  [ "$(status)" = 404 ] || fail "unknown model: $(status)"
  post /v1/chat/completions '{"model": "e2e-model", "messages": "hi"}' >/dev/null; [ "$(status)" = 400 ] || fail "wrong type: $(status)"
  post /v1/completions "{\"model\": \"$NAME\", \"prompt\": \"$(printf 'x %.0s' $(seq 700))\", \"max_tokens\": 4}" >/dev/null
  [ "$(status)" = 400 ] || fail "prompt longer than the context: $(status)"
  head -c 10000000 /dev/zero | tr '\0' 'a' > "$TMP/big"
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" --data-binary @"$TMP/big" "$URL/v1/completions")
  [ "$code" = 413 ] || fail "10 MB body: $code"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/nothing")" = 404 ] || fail "unknown route: not 404"
  echo "ok: 401 / 400 / 404 / 413 answered"
  # 64 concurrent streaming clients, every 4th hangs up after 0.2 s; the others must get
  # exactly their solo answers.
  pids=()
  for c in $(seq 0 63); do
    p="${PROMPTS[$((c % 4))]}"
    if [ $((c % 4)) = 3 ]; then mt=(-m 0.2); else mt=(-m 120); fi
    curl -sS -N "${mt[@]}" -H "Authorization: Bearer $KEY" -d "$(chat_body "$p" true)" "$URL/v1/chat/completions" \
      > "$TMP/c$c.sse" 2>/dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  for c in $(seq 0 63); do
    [ $((c % 4)) = 3 ] && continue
    want=$(jq -j ".text[$((c % 4))]" "$TMP/gen_chat.json")
    got=$(sse_text < "$TMP/c$c.sse")
    [ "$got" = "$want" ] || fail "concurrent client $c: got '$got', want '$want'"
  done
  sleep 1
  [ "$(metric moe_ep_requests_running)" = 0 ] || fail "requests still running after the clients left"
  [ "$(metric moe_ep_kv_cache_blocks_used)" = 0 ] || fail "KV blocks leaked: $(metric moe_ep_kv_cache_blocks_used)"
  echo "ok: 64 concurrent clients (16 hung up): answers equal solo, no slot or KV block left held"
  # RSS after 50 and after 500 requests.
  many() { for k in $(seq "$1"); do post /v1/completions "$(completion_body "${PROMPTS[$((k % 4))]}" false)" >/dev/null; done; }
  many 50; r50=$(rss_kb "$SERVER_PID"); many 450; r500=$(rss_kb "$SERVER_PID")
  echo "RSS after 50 requests ${r50} kB, after 500 ${r500} kB"
  [ $((r500 - r50)) -lt 8192 ] || fail "RSS grew by $((r500 - r50)) kB over 450 requests"
  kill -TERM "$SERVER_PID"
  rc=0; wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  [ "$rc" = 0 ] || fail "SIGTERM: exit code $rc"
  echo "ok: SIGTERM -> exit 0"
  ;;
ep2) ranks 2 structured --ep 2 --moe-comm alltoall ;;
attn2)
  # The seed's vLLM layout: attention, KV cache, shared experts and lm_head split over the
  # 2 ranks, experts whole and EP over the same 2 (the answers as one rank's: greedy).
  ranks 2 structured --ep 2 --attn-tp 2 ;;
ep4) ranks 4 answers --ep 4 ;;
kill)
  start_server mpirun -np 2 --oversubscribe "$BIN" "${SERVE_FLAGS[@]}" --ep 2 --comm-timeout 5
  ( for round in $(seq 40); do
      for c in $(seq 8); do
        curl -sS -N -m 30 -H "Authorization: Bearer $KEY" -d "$(chat_body "${PROMPTS[$((c % 4))]}" true)" \
          "$URL/v1/chat/completions" > "$TMP/k$round.$c.sse" 2>/dev/null &
      done
      wait
    done ) &
  LOAD=$!
  sleep 1
  rank1=$(rank_pid 1)
  [ -n "$rank1" ] || fail "cannot find rank 1"
  t0=$(date +%s)
  kill -9 "$rank1"
  rc=0
  for _ in $(seq 600); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$SERVER_PID" 2>/dev/null && fail "the job still runs 60 s after rank 1 was killed"
  wait "$SERVER_PID" || rc=$?
  SERVER_PID=""
  t1=$(date +%s)
  kill "$LOAD" 2>/dev/null || true; wait "$LOAD" 2>/dev/null || true
  [ "$rc" != 0 ] || fail "the job exited 0 after a rank was killed"
  broken=0
  for f in "$TMP"/k*.sse; do [ "$(sse_text < "$f")" = "NO-DONE" ] && broken=$((broken + 1)); done
  echo "ok: rank 1 killed -> job exit code $rc after $((t1 - t0)) s; $broken streams ended without [DONE]"
  ;;
*) echo "unknown mode $MODE"; exit 2 ;;
esac
echo "serve_e2e $MODE: passed"
