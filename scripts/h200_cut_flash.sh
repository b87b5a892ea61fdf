#!/bin/bash
# One device call (one H200, about 3 minutes): the cut attention at absolute tiles
# (engine/cuda/cut_flash.py) against the current cut path on qwen3-8b's attention shapes over a
# 32,000-token prompt (bits under two cuttings, rate at 128-1,024-row cuts), and cuBLAS's row
# invariance for qwen3-8b's weight products at 8-1,032 rows (tools/cut_flash_probe.py), under $OUT.
# Predictions: receipts/predictions/h200-cut-flash.md (written first). Installs nothing.
# Usage: bash scripts/h200_cut_flash.sh   (from a plain checkout: PYTHONPATH is set here)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee "$OUT/versions.txt"
timeout 480 python3 -m tools.cut_flash_probe --model qwen3-8b --prompt 32000 --rows 128,256,512,1024 \
    --rounds 3 --out "$OUT/cut_flash_8b.md" 2>&1 | tee "$OUT/log.txt" | tail -80
ls -la "$OUT"
