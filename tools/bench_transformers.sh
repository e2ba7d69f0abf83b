#!/usr/bin/env bash
# Side by side on this machine: `moe-ep bench-model` on 1 rank, under
# `mpirun -np 2 ... --ep 2`, and the same model shape in PyTorch/transformers
# (tools/bench_transformers.py), same layers, vocabulary, prompts and threads.
# ROUNDS rounds, the engines interleaved; prints a table of the medians over rounds
# (each number inside a round is already the median of REPEATS timed passes).
#
#   tools/bench_transformers.sh                     # build/moe-ep, 4 layers, 1 round
#   MOE_EP=build-bm/moe-ep ROUNDS=3 OUT=/tmp/perf tools/bench_transformers.sh
#
# Needs tools/.venv with torch 2.15 and transformers 5.24 (created here if missing;
# never committed). Every run writes JSON into $OUT and the load average before it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${MOE_EP:-build/moe-ep}
OUT=${OUT:-/tmp/moe-ep-perf-model}
ROUNDS=${ROUNDS:-1}
LAYERS=${LAYERS:-4}
VOCAB=${VOCAB:-32000}
PREFILL=${PREFILL:-512}
BATCHES=${BATCHES:-1,16}
CONTEXT=${CONTEXT:-128}
STEPS=${STEPS:-16}
REPEATS=${REPEATS:-3}
THREADS=${THREADS:-$(nproc)}
[ -x "$BIN" ] || { echo "no moe-ep binary at $BIN (build it, or set MOE_EP)" >&2; exit 1; }
if [ ! -x tools/.venv/bin/python ]; then
  python3 -m venv tools/.venv
  tools/.venv/bin/pip install torch==2.15.0 transformers==5.24.0 safetensors
fi
mkdir -p "$OUT"
ARGS=(--layers "$LAYERS" --vocab "$VOCAB" --prefill "$PREFILL" --decode-batch "$BATCHES" --decode-context "$CONTEXT"
      --decode-steps "$STEPS" --repeats "$REPEATS")
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r: moe-ep, 1 rank, $THREADS threads ($(uptime))"
  uptime > "$OUT/moe_ep_1rank.$r.uptime"
  OMP_WAIT_POLICY=PASSIVE "$BIN" bench-model --threads "$THREADS" "${ARGS[@]}" --json "$OUT/moe_ep_1rank.$r.json"
  echo "== round $r: moe-ep, mpirun -np 2 --ep 2 ($(uptime))"
  uptime > "$OUT/moe_ep_ep2.$r.uptime"
  OMP_WAIT_POLICY=PASSIVE mpirun -np 2 --oversubscribe --allow-run-as-root "$BIN" bench-model "${ARGS[@]}" --ep 2 \
    --json "$OUT/moe_ep_ep2.$r.json"
  echo "== round $r: transformers, $THREADS threads ($(uptime))"
  uptime > "$OUT/transformers.$r.uptime"
  tools/.venv/bin/python tools/bench_transformers.py --layers "$LAYERS" --vocab "$VOCAB" --prefill "$PREFILL" \
    --decode-batch "$BATCHES" --decode-context "$CONTEXT" --decode-steps "$STEPS" --repeats "$REPEATS" \
    --threads "$THREADS" --json "$OUT/transformers.$r.json" > /dev/null
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    return [json.load(open(f"{out}/{name}.{r}.json")) for r in range(1, rounds + 1)]
runs = {"moe-ep 1 rank": load("moe_ep_1rank"), "moe-ep -np 2 --ep 2": load("moe_ep_ep2"),
        "transformers": load("transformers")}
med = lambda xs: statistics.median(xs)
batches = [d["batch"] for d in runs["transformers"][0]["decode"]]
hdr = ["engine", "prefill tok/s"] + [f"decode b{b} tok/s" for b in batches] + [f"b{b} x floor" for b in batches]
print("| " + " | ".join(hdr) + " |\n|" + "---|" * len(hdr))
for name, rs in runs.items():
    row = [name, f"{med([r['prefill']['tokens_per_s'] for r in rs]):.1f}"]
    for i in range(len(batches)):
        row.append(f"{med([r['decode'][i]['tokens_per_s'] for r in rs]):.2f}")
    for i in range(len(batches)):
        xs = [r["decode"][i].get("x_floor") for r in rs]
        row.append(f"{med(xs):.2f}" if None not in xs else "-")
    print("| " + " | ".join(row) + " |")
tf = runs["transformers"]
for i, b in enumerate(batches):
    t = med([r["decode"][i]["tokens_per_s"] for r in tf])
    for name in ("moe-ep 1 rank", "moe-ep -np 2 --ep 2"):
        m = med([r["decode"][i]["tokens_per_s"] for r in runs[name]])
        print(f"decode batch {b}: {name} / transformers = {m / t:.1f}x")
print("transformers experts implementation:", tf[0]["experts_implementation"], tf[0]["experts_impl_trials_decode_b1_tokens_per_s"])
PY
