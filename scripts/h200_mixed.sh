#!/bin/bash
# One device call (one H200, about 3 minutes): which form of a mixed forward's products keeps a
# decode row's bits on CUDA, and what each costs (tools/mixed_products.py), for qwen3-8b and
# qwen3-32b, under $OUT. Predictions: receipts/predictions/h200-mixed-products.md (written first).
# Usage: bash scripts/h200_mixed.sh   (from a plain checkout: PYTHONPATH is set here)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > "$OUT/gpu.csv" 2>&1
timeout 240 python3 -m tools.mixed_products --model qwen3-8b --rows 128,256,512,1024 --out "$OUT/mixed_products_8b.md" 2>&1 | tail -40
timeout 200 python3 -m tools.mixed_products --model qwen3-32b --rows 128,256,1024 --reps 10 --out "$OUT/mixed_products_32b.md" 2>&1 | tail -30
ls -la "$OUT"
