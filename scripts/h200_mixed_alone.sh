#!/bin/bash
# One device call (one H200, at most 10 minutes), qwen3-8b:
#   (1) tools/prompt_alone.py: a 32,000-token prompt's fill in process on four cut-attention paths;
#   (2) tfbench run long-prompt: whole, p = 0.5, mixed 24 and 32 ms, each once, plain reference, tiles;
#   (3) tfbench sweep 1, 8, 64 streams, whole against mixed 24 ms, one cell, one repetition.
# Predictions: receipts/predictions/h200-mixed-alone.md, h200-mixed-frontier-3.yaml, h200-sweep-mixed.yaml
# (written first). Installs nothing. Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_alone.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
timeout 150 python3 -m tools.prompt_alone --model qwen3-8b --prompt 32000 --out "$OUT/prompt_alone.json" 2>&1 | tail -8
timeout 250 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --share 0.5 --mixed 24,32 \
  --order "whole,stepped p=0.5,mixed budget=24,mixed budget=32" --predict receipts/predictions/h200-mixed-frontier-3.yaml \
  --plain-check --engine-arg=--cut-attention=tiles --out /tmp/lp 2>&1 | grep -E "^ (whole|stepped|mixed)|predict|in range" | head -30
left=$((580 - $(date +%s) + start))
[ $left -gt 60 ] && timeout $left python3 -m tensorfold_bench sweep --device cuda --model qwen3-8b --levels 1,8,64 \
  --tokens 256 --cells 1 --reps 1 --mixed 24 --predict receipts/predictions/h200-sweep-mixed.yaml \
  --engine-arg=--cut-attention=tiles --out /tmp/sw 2>&1 | tail -25
for d in lp sw; do for f in /tmp/$d/*.md /tmp/$d/*.json.gz /tmp/$d/*.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done; done
tar czf "$OUT/logs.tgz" -C /tmp lp sw --exclude='*.json.gz' 2>/dev/null
ls -la "$OUT"
