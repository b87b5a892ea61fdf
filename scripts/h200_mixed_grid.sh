#!/bin/bash
# One device call (one H200, at most 10 minutes): (1) tools/mixed_forms.py, qwen3-8b, hold down / side /
# persistent / side+persistent at 0, 8,192 and 24,576 keys; (2) tools/prompt_alone.py, tiles against tiles
# persistent; (3) tfbench run long-prompt, qwen3-8b: whole, mixed 10, 12, 16, 24 ms, each once, plain
# reference, tiles (the graphs' defaults: side+persistent).
# Predictions (written first): receipts/predictions/h200-mixed-grid.{md,yaml}. Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_grid.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
timeout 170 python3 -m tools.mixed_forms --model qwen3-8b --contexts 0,8192,24576 --reps 15 \
  --forms "hold down,side,persistent,side+persistent" --out "$OUT/mixed_forms.json" 2>&1 | grep -v Warning | tail -20
timeout 80 python3 -m tools.prompt_alone --model qwen3-8b --prompt 32000 --paths "tiles, persistent" \
  --out "$OUT/prompt_alone.json" 2>&1 | tail -4
left=$((585 - $(date +%s) + start))
timeout $left python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --mixed 10,12,16,24 \
  --order "whole,mixed budget=10,mixed budget=12,mixed budget=16,mixed budget=24" \
  --predict receipts/predictions/h200-mixed-grid.yaml --plain-check --engine-arg=--cut-attention=tiles \
  --out /tmp/lp 2>&1 | grep -E "^ (whole|stepped|mixed)|in range|rror" | head -30
for f in /tmp/lp/*.json.gz /tmp/lp/*.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done
tar czf "$OUT/logs.tgz" -C /tmp lp --exclude='*.json.gz' 2>/dev/null
ls -la "$OUT"
