#!/bin/bash
# One device call (one H200, at most 10 minutes):
#   (1) tfbench sweep, qwen3-8b, 1, 8, 64 streams, whole against mixed 24 ms, one cell, one repetition;
#   (2) tfbench run long-prompt, qwen3-32b: whole, p = 0.5, mixed 40 and 64 ms, each once, plain reference, tiles.
# Predictions: receipts/predictions/h200-mixed-32b.{md,yaml}, h200-sweep-mixed-2.yaml (written first); with 2:
#   h200-mixed-32b-2.{md,yaml}, h200-sweep-mixed-3.yaml (after the round's down went to one K chain).
# Installs nothing. Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_32b.sh [2] (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
if [ "${1:-1}" = 2 ]; then lp=h200-mixed-32b-2.yaml sw=h200-sweep-mixed-3.yaml; else lp=h200-mixed-32b.yaml sw=h200-sweep-mixed-2.yaml; fi
timeout 170 python3 -m tensorfold_bench sweep --device cuda --model qwen3-8b --levels 1,8,64 \
  --tokens 256 --cells 1 --reps 1 --mixed 24 --predict receipts/predictions/$sw \
  --engine-arg=--cut-attention=tiles --out /tmp/sw 2>&1 | tail -22
left=$((575 - $(date +%s) + start))
timeout $left python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-32b --share 0.5 --mixed 40,64 \
  --order "whole,stepped p=0.5,mixed budget=40,mixed budget=64" --predict receipts/predictions/$lp \
  --plain-check --engine-arg=--cut-attention=tiles --out /tmp/lp32 2>&1 | grep -E "^ (whole|stepped|mixed)|in range|rror" | head -30
for d in sw lp32; do for f in /tmp/$d/*.md /tmp/$d/*.json.gz /tmp/$d/*.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done; done
tar czf "$OUT/logs.tgz" -C /tmp sw lp32 --exclude='*.json.gz' 2>/dev/null
ls -la "$OUT"
