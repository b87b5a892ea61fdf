#!/bin/bash
# One device call (issue 15, rounds 2-3): where the N = 2 decode round's time goes, and the 128
# small sums a round through NCCL, symmetric memory's one-shot all-reduce ("symm"), the sum fused
# into the add + RMSNorm after it ("fused", engine/parallel/fused.py), or skipped (timing only). Phase
# one: the plain engine at N = 1; phase tp: N = 2, its decode graph recaptured for each way in turn
# (tools/tp_check.py --sums), with the bit checks. EXTRA=1 adds fused under PDL 2 and at
# --parallel 64; LL=1 adds round 2's NCCL_PROTO=LL phase.
# Predictions and outcome: tools/PERF.md, issue 15 rounds 2 and 3.
# Usage (repository root): MODEL=qwen3-32b bash scripts/h200_tp_sums.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODEL=${MODEL:-qwen3-32b}; SUMS=${SUMS:-fused,symm,skip,nccl,fused,symm,skip,nccl}; ROUNDS=${ROUNDS:-200}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'nccl', torch.cuda.nccl.version()); \
import torch.distributed._symmetric_memory as s; o = torch.ops.symm_mem; \
print({n: hasattr(o, n) for n in ('one_shot_all_reduce_out', 'one_shot_all_reduce_copy_out')}, \
'signal pad bytes', getattr(s, 'get_signal_pad_size', lambda: '?')())" 2>&1 | tee -a "$OUT/gpus.txt"
run() {  # name timeout args...
  local name=$1 t=$2; shift 2
  timeout "$t" python3 -m tools.tp_check --model "$MODEL" --long 0 --rounds "$ROUNDS" --out "$OUT" "$@" \
    >"$OUT/$name.log" 2>&1
  echo "== $name rc $?"; grep -v Warning "$OUT/$name.log" | tail -4 | cut -c1-3000
}
run one "${T1:-150}" --phase one
run tp "${T2:-300}" --phase tp --world 2 --sums "$SUMS"
if [ "${EXTRA:-0}" = 1 ]; then  # round 3, call 2: fused under PDL (issue 14's knob), and in a 64-lane round
  run tp_pdl2 "${T4:-200}" --phase tp --world 2 --sums fused,symm --pdl 2 --tag _pdl2
  run tp_p64 "${T5:-200}" --phase tp --world 2 --sums fused,symm,fused,symm --parallel 64 --tag _p64
fi
if [ "${LL:-0}" = 1 ]; then NCCL_PROTO=LL run ll "${T3:-150}" --phase tp --world 2 --sums nccl --tag _ll; fi
ls -la "$OUT"
