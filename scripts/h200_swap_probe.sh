#!/bin/bash
# One device call (one H200): tools/swap_probe.py, a mixed forward's products with the operands swapped.
# Predictions: receipts/predictions/h200-swap-probe.md (written first). Installs nothing.
# Usage: bash scripts/h200_swap_probe.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 150 python3 -m tools.swap_probe --model qwen3-8b,qwen3-32b --out "$OUT/swap_probe.md" 2>&1 | tail -40
