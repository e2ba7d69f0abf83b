#!/usr/bin/env bash
# Runs the layer benchmarks whose tables are in docs/PERF.md, one after another
# (never two at once: they measure the machine). Results go to bench-results/
# as JSON next to the printed tables. Run on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
BIN=build/moe-ep
OUTDIR=${1:-bench-results}
mkdir -p "$OUTDIR"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI="mpirun --oversubscribe"

echo "== machine: $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== single rank, bf16 (issue: foundation)"
$BIN bench --shape qwen3-30b-a3b --tokens 1,16,128,512 --dtype bf16 --json "$OUTDIR/layer_bf16.json"
echo "== single rank, f32"
$BIN bench --shape qwen3-30b-a3b --tokens 1,16,128 --dtype f32 --json "$OUTDIR/layer_f32.json"
for comm in allreduce allgather alltoall alltoall-ll; do
  echo "== 2 ranks, --ep 2 --moe-comm $comm"
  extra=""
  [ "$comm" = alltoall-ll ] && extra="--max-tokens-per-rank 512"
  OMP_WAIT_POLICY=PASSIVE $MPI -np 2 $BIN bench --shape qwen3-30b-a3b --ep 2 --moe-comm $comm --tokens 1,16,512 \
    --dtype bf16 $extra --json "$OUTDIR/ep2_$comm.json"
done
echo "== 2 ranks with shared experts (overlap), --ep 2 --moe-comm alltoall"
OMP_WAIT_POLICY=PASSIVE $MPI -np 2 $BIN bench --shape deepseek-v2-lite --ep 2 --moe-comm alltoall --tokens 1,16,512 \
  --dtype bf16 --json "$OUTDIR/ep2_overlap.json"
