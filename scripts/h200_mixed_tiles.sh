#!/bin/bash
# One device call (one H200, at most 10 minutes): the mixed frontiers of qwen3-8b and qwen3-32b.
#   (1) tfbench run long-prompt, qwen3-8b: whole, p = 1, 0.5, mixed 10, 12, 16, 24 ms, each once,
#       plain reference, tiles;
#   (2) tfbench run long-prompt, qwen3-32b: whole, mixed 40 and 64 ms, each once, plain reference, tiles.
# Predictions (written first): receipts/predictions/h200-mixed-SET.{md,yaml}, h200-mixed-SET-32b.yaml, SET the
# argument: tiles (the default: after mixed cuts went to whole tiles of the cut attention), hold (after down
# reads silu * up from its padded buffer). Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_tiles.sh [SET] (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
set_=${1:-tiles}
timeout 320 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --share 1,0.5 --mixed 10,12,16,24 \
  --order "whole,stepped p=1,stepped p=0.5,mixed budget=10,mixed budget=12,mixed budget=16,mixed budget=24" \
  --predict receipts/predictions/h200-mixed-$set_.yaml --plain-check --engine-arg=--cut-attention=tiles \
  --out /tmp/lp 2>&1 | grep -E "^ (whole|stepped|mixed)|in range|rror" | head -30
left=$((580 - $(date +%s) + start))
timeout $left python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-32b --mixed 40,64 \
  --order "whole,mixed budget=40,mixed budget=64" --predict receipts/predictions/h200-mixed-$set_-32b.yaml \
  --plain-check --engine-arg=--cut-attention=tiles --out /tmp/lp32 2>&1 | grep -E "^ (whole|stepped|mixed)|in range|rror" | head -30
# at most 8 files come back from $OUT: the receipts' json and pictures and the logs (each .md renders again
# from its json: python -m tensorfold_bench report X.json.gz --no-png)
for d in lp lp32; do for f in /tmp/$d/*.json.gz /tmp/$d/*.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done; done
tar czf "$OUT/logs.tgz" -C /tmp lp lp32 --exclude='*.json.gz' 2>/dev/null
ls -la "$OUT"
