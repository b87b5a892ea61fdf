#!/bin/bash
# One device call on nvidia-h200-x2: the tensor-parallel N = 2 receipts (qwen3-32b, bf16), written under
# $OUT flat (so a device tool that brings back a few files keeps them all). Predictions are committed under
# receipts/predictions/ before the call.
#   long-prompt: B of 32,000 tokens, whole vs stepped p=0.5, plain check
#   sweep: --levels 1,2,4,8,16,32,64 --tokens 128 --cells 1 --reps 1 (scaled to fit), whole vs p=0.5
#   then, if time is left: the N = 2 decode round with cuBLAS matmuls (tp_check --no-skinny)
#   LP_PRED / SW_PRED: the predictions files (default: the first N = 2 receipts' ones); T3=0 skips the cuBLAS round
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_tp_receipts.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
keep() {  # copy a run's receipt files under $OUT as soon as it ends (a later timeout keeps them)
  for f in /tmp/$1/*.md /tmp/$1/*.json.gz /tmp/$1/*.png; do [ -f "$f" ] && cp "$f" "$OUT/$1-$(basename "$f")"; done
  tar czf "$OUT/logs.tgz" -C /tmp lp sw 2>/dev/null
}
timeout ${T1:-270} python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-32b --tensor-parallel 2 \
  --share 0.5 --plain-check --predict ${LP_PRED:-receipts/predictions/h200-tp2-32b-long-prompt.yaml} --out /tmp/lp 2>&1 | tail -25
keep lp
timeout ${T2:-270} python3 -m tensorfold_bench sweep --device cuda --model qwen3-32b --tensor-parallel 2 \
  --levels 1,2,4,8,16,32,64 --tokens 128 --cells 1 --reps 1 --share 0.5 \
  --predict ${SW_PRED:-receipts/predictions/h200-tp2-sweep.yaml} --out /tmp/sw 2>&1 | tail -25
keep sw
[ "${T3:-50}" = 0 ] || timeout ${T3:-50} python3 -m tools.tp_check --phase tp --world 2 --model qwen3-32b --long 0 --no-skinny \
  --sums symm,nccl --tag _cublas --out "$OUT" 2>&1 | grep '^{' | cut -c1-1500
ls -la "$OUT"
