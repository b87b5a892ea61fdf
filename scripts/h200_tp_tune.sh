#!/bin/bash
# One device call (issue 15, round 4): the skinny configs for one rank's (halved) qwen3-32b shapes
# at N = 2, and the gated gate/up kernel at N = 1 and N = 2, tuned at once on both GPUs
# (tools/bench_skinny.py --tensor-parallel 2; --rows 4: tp_check's round, padded to 16);
# then the decode round at N = 1 and N = 2 (fused sums) with the shipped tables ("old") and with
# the tuned entries ("new") in turn, with the bit checks (tools/tp_check.py --skinny --turns).
# Predictions and outcome: tools/PERF.md, issue 15 round 4.
# Usage (repository root): bash scripts/h200_tp_tune.sh   (DEVICE=cpu MODEL=tiny: the dry run)
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODEL=${MODEL:-qwen3-32b}; DEVICE=${DEVICE:-cuda}; ROUNDS=${ROUNDS:-200}; ROWS=${ROWS:-4}
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
  G0=0; G1=1; FUSED=fused; SYMM=symm
else  # the dry run: Triton's interpreter, gloo, no fused/symm sums
  export TRITON_INTERPRET=1; G0=; G1=; FUSED=nccl; SYMM=nccl
fi
tune() {  # name gpu args...
  local name=$1 gpu=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu timeout "${TT:-200}" python3 -m tools.bench_skinny --model "$MODEL" --device "$DEVICE" \
    --rows "$ROWS" --json "$OUT/$name.json" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name rc $?"; grep -E "best|adopt|chain|failed|Error" "$OUT/$name.log" | cut -c1-600
}
# GPU 0: q/k/v, o, gate/up and the gated kernel at N = 2; GPU 1: down, lm_head at N = 2, then the
# gated kernel at N = 1 (its gate/up keeps the shipped config)
# (call 2: A=qkv,o B=silu+down N1=0: the 5,120-column shapes again, with the round-4 tables shipped)
tune tune_tp2_a "$G0" --tensor-parallel 2 --only "${A:-qkv,o,gate_up}" &
( tune tune_tp2_b "$G1" --tensor-parallel 2 --only "${B:-silu+down,lm_head}"
  if [ "${N1:-1}" = 1 ]; then tune tune_tp1 "$G1" --only gate_up --keep; fi ) &
wait
run() {  # name timeout args...
  local name=$1 t=$2; shift 2
  timeout "$t" python3 -m tools.tp_check --model "$MODEL" --device "$DEVICE" --long 0 --rounds "$ROUNDS" \
    --out "$OUT" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name rc $?"; grep -v Warning "$OUT/$name.log" | tail -2 | cut -c1-4000
}
if [ "${N1:-1}" = 1 ]; then run one "${T1:-150}" --phase one --skinny "$OUT/tune_tp1.json" --turns old,new,old,new
else run one "${T1:-150}" --phase one; fi
run tp "${T2:-240}" --phase tp --world 2 --skinny "$OUT/tune_tp2_a.json,$OUT/tune_tp2_b.json" \
  --turns "${TURNS:-old:$FUSED,new:$FUSED,new:$SYMM,old:$FUSED,new:$FUSED}"
ls -la "$OUT"
