#!/bin/bash
# One device call (one H200, at most 10 minutes): (1) tools/mixed_forms.py, qwen3-8b, hold down against
# chunks; (2) tfbench run long-prompt, qwen3-8b: whole, mixed 10, 12, 16, 24 ms; (3) the same, qwen3-32b:
# whole, mixed 40 and 64 ms; (4) tfbench sweep, qwen3-8b, 1, 8, 64 streams, whole against mixed 24 ms.
# Each variant once, plain reference, tiles.
# Predictions (written first): receipts/predictions/h200-mixed-chunks.{md,yaml}, h200-mixed-chunks-32b.yaml,
# h200-sweep-mixed-5.yaml. Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_chunks.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
timeout 130 python3 -m tools.mixed_forms --model qwen3-8b --contexts 0,8192 --reps 15 --forms "hold down,chunks" \
  --out "$OUT/mixed_forms.json" 2>&1 | grep -v Warning | tail -14
timeout 150 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --mixed 10,12,16,24 \
  --order "whole,mixed budget=10,mixed budget=12,mixed budget=16,mixed budget=24" \
  --predict receipts/predictions/h200-mixed-chunks.yaml --plain-check --engine-arg=--cut-attention=tiles \
  --out /tmp/lp 2>&1 | grep -E "^ (whole|stepped|mixed)|in range|rror" | head -30
timeout 170 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-32b --mixed 40,64 \
  --order "whole,mixed budget=40,mixed budget=64" --predict receipts/predictions/h200-mixed-chunks-32b.yaml \
  --plain-check --engine-arg=--cut-attention=tiles --out /tmp/lp32 2>&1 | grep -E "^ (whole|stepped|mixed)|in range|rror" | head -30
left=$((585 - $(date +%s) + start))
timeout $left python3 -m tensorfold_bench sweep --device cuda --model qwen3-8b --levels 1,8,64 \
  --tokens 256 --cells 1 --reps 1 --mixed 24 --predict receipts/predictions/h200-sweep-mixed-5.yaml \
  --engine-arg=--cut-attention=tiles --out /tmp/sw 2>&1 | tail -24
for d in lp lp32 sw; do for f in /tmp/$d/*.json.gz /tmp/$d/*-frontier.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done; done
tar czf "$OUT/logs.tgz" -C /tmp lp lp32 sw --exclude='*.json.gz' --exclude='*.png' 2>/dev/null
ls -la "$OUT"
