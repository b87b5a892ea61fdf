#!/bin/bash
# One device call (issue 15, round 2): where the N = 2 decode round's time goes, and the small sums
# through symmetric memory against NCCL's. Phase one: the plain engine at N = 1; phase tp: N = 2
# with the o/down sums through nccl / skipped (timing only) / symm in turn, recaptured each time
# (engine/dev/tp_check.py --sums); then NCCL_PROTO=LL at N = 2 (NCCL only). Predictions and
# outcome: engine/dev/PERF.md, issue 15 round 2.
# Usage (repository root): MODEL=qwen3-32b bash scripts/h200_tp_sums.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODEL=${MODEL:-qwen3-32b}; SUMS=${SUMS:-nccl,skip,symm,nccl,skip,symm}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version()); \
import torch.distributed._symmetric_memory; o = torch.ops.symm_mem; \
print({n: hasattr(o, n) for n in ('one_shot_all_reduce_out', 'one_shot_all_reduce_copy_out')})" 2>&1 | tee -a "$OUT/gpus.txt"
run() {  # name timeout args...
  local name=$1 t=$2; shift 2
  timeout "$t" python3 -m engine.dev.tp_check --model "$MODEL" --long 0 --out "$OUT" "$@" >"$OUT/$name.log" 2>&1
  echo "== $name rc $?"; grep -v Warning "$OUT/$name.log" | tail -4 | cut -c1-2500
}
run one "${T1:-150}" --phase one
run tp "${T2:-220}" --phase tp --world 2 --sums "$SUMS"
NCCL_PROTO=LL run ll "${T3:-150}" --phase tp --world 2 --sums nccl --tag _ll
ls -la "$OUT"
