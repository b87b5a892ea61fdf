#!/bin/bash
# One device call on nvidia-h200-x2 (issue 15, round 5): the decode round at N = 1, N = 2 (fused
# sums, two turns) and N = 1 again with the shipped tables, then the N = 2 receipts with the
# round-5 predictions (scripts/h200_tp_receipts.sh). Predictions: tools/PERF.md, issue 15
# round 5, and receipts/predictions/h200-tp2-*-r2.yaml.
# Usage (repository root): TFBENCH_COMMIT=<sha> bash scripts/h200_tp_round5.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
run() {  # name timeout args...
  local name=$1 t=$2; shift 2
  timeout "$t" python3 -m tools.tp_check --model qwen3-32b --long 0 --rounds 200 --tag "_$name" \
    --out /tmp/tp "$@" >"/tmp/tp_$name.log" 2>&1
  echo "== $name rc $?"; grep '^{' "/tmp/tp_$name.log" | tail -1 | cut -c1-1500
}
mkdir -p /tmp/tp
run one1 100 --phase one
run tp 150 --phase tp --world 2 --sums fused,fused
run one2 100 --phase one
tar czf "$OUT/tp_check.tgz" -C /tmp tp tp_one1.log tp_tp.log tp_one2.log 2>/dev/null
T3=0 LP_PRED=receipts/predictions/h200-tp2-32b-long-prompt-r2.yaml SW_PRED=receipts/predictions/h200-tp2-sweep-r2.yaml \
  bash scripts/h200_tp_receipts.sh
