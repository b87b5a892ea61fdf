#!/bin/bash
# One device call (one H200): tools/mixed_forms.py on qwen3-8b, the mixed graphs' forms side by side.
# Predictions: receipts/predictions/h200-down-tma.md, last section (written first). Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_forms.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 560 python3 -m tools.mixed_forms --model qwen3-8b --contexts 0,8192 --out "$OUT/mixed_forms.json" 2>&1 \
  | grep -vE "^\s*$" | tail -40
