#!/bin/bash
# One device call: tensor parallel on the GPU, checked and timed against one rank. Phase one: the plain engine at N = 1;
# phase tp: the same engine at N = WORLD ranks (2 on nvidia-h200-x2; 1 on a one-GPU machine: one
# NCCL rank, collectives forced into the decode graph). Write the expected figures down before the call.
# Usage (repository root): WORLD=2 MODEL=qwen3-32b LONG=16384 bash scripts/h200_tp.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WORLD=${WORLD:-2}; MODEL=${MODEL:-qwen3-32b}; LONG=${LONG:-16384}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" | tee -a "$OUT/gpus.txt"
timeout ${T1:-130} python3 -m tools.tp_check --phase one --model "$MODEL" --long "$LONG" --out "$OUT" 2>&1 \
  | grep -v Warning | tail -5
timeout ${T2:-150} python3 -m tools.tp_check --phase tp --world "$WORLD" --model "$MODEL" --long "$LONG" --out "$OUT" 2>&1 \
  | grep -v Warning | tail -8
ls -la "$OUT"
