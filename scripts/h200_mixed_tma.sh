#!/bin/bash
# One device call (one H200, at most 10 minutes): the mixed frontiers with the cut attention's K and V by
# tensor descriptors (the runner's default from capability 9), each variant once, tiles, plain reference:
#   (1) tfbench run long-prompt, qwen3-8b: whole, mixed 10, 16, 24 ms;
#   (2) tfbench run long-prompt, qwen3-32b: whole, mixed 40, 64 ms.
# Predictions (written first): receipts/predictions/h200-mixed-tma.{md,yaml}, h200-mixed-tma-32b.yaml.
# Installs nothing. Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_tma.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
timeout 260 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --mixed 10,16,24 \
  --order "whole,mixed budget=10,mixed budget=16,mixed budget=24" \
  --predict receipts/predictions/h200-mixed-tma.yaml --plain-check --engine-arg=--cut-attention=tiles \
  --out /tmp/lp 2>&1 | grep -E "^ (whole|stepped|mixed)|in range|rror" | head -30
left=$((585 - $(date +%s) + start))
timeout $left python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-32b --mixed 40,64 \
  --order "whole,mixed budget=40,mixed budget=64" --predict receipts/predictions/h200-mixed-tma-32b.yaml \
  --plain-check --engine-arg=--cut-attention=tiles --out /tmp/lp32 2>&1 | grep -E "^ (whole|stepped|mixed)|in range|rror" | head -30
# the receipts' json and pictures and the logs come back (each .md renders again from its json:
# python -m tensorfold_bench report X.json.gz --no-png)
for d in lp lp32; do for f in /tmp/$d/*.json.gz /tmp/$d/*.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done; done
tar czf "$OUT/logs.tgz" -C /tmp lp lp32 --exclude='*.json.gz' 2>/dev/null
ls -la "$OUT"
