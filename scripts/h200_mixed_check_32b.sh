#!/bin/bash
# One device call (one H200): tools/mixed_check.py on qwen3-32b, the bits and a 128-row forward's kernels.
# Predictions: receipts/predictions/h200-mixed-check-32b.md (written first). Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_check_32b.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 200 python3 -m tools.mixed_check --model qwen3-32b --prompt 9400 --tokens 16 --time 8192 \
  --profile 128@8192 --out "$OUT/mixed_check_32b.json" > "$OUT/check_32b.txt" 2>&1
grep -E '"all_equal"|^timing|^profile|^runner|rror' "$OUT/check_32b.txt" | cut -c1-1500
