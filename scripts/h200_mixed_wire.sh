#!/bin/bash
# One device call (one H200, at most 10 minutes): mixed forwards on CUDA with --cut-attention tiles, qwen3-8b.
#   (a) tools/mixed_check.py: cuts off the grid beside rounds, in process, against each prompt alone
#       (ids and the long prompt's K/V bits);
#   (b) tfbench run long-prompt, B of 32,000 tokens, whole / stepped p=1, 0.5 / mixed 20, 40, 80 ms,
#       each variant once (7 servers with the plain reference fit the call; base/new/new/base would not), every variant and the plain reference with --cut-attention tiles.
# Predictions: receipts/predictions/h200-mixed-wire.{md,yaml} (written first). Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_wire.sh   (files under $OUT, flat)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
start=$(date +%s)
timeout 170 python3 -m tools.mixed_check --model qwen3-8b --out "$OUT/mixed_check.json" > "$OUT/check_log.txt" 2>&1
tail -45 "$OUT/check_log.txt"
left=$((575 - $(date +%s) + start))  # the call's 600 s, less the copies after
timeout $left python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --share 1,0.5 --mixed 20,40,80 \
  --order "whole,stepped p=1,stepped p=0.5,mixed budget=20,mixed budget=40,mixed budget=80" \
  --plain-check --engine-arg=--cut-attention=tiles --predict receipts/predictions/h200-mixed-wire.yaml \
  --out /tmp/lp 2>&1 | tail -40
for f in /tmp/lp/*.md /tmp/lp/*.json.gz /tmp/lp/*.png; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$f")"; done
tar czf "$OUT/logs.tgz" -C /tmp lp --exclude='*.json.gz' 2>/dev/null
ls -la "$OUT"
