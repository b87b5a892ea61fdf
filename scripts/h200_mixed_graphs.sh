#!/bin/bash
# One device call (one H200, at most 10 minutes): mixed forwards as CUDA graphs, qwen3-8b.
#   (a) tools/mixed_check.py --prompt 32000: cuts off the grid beside rounds, in process, against each
#       prompt alone (ids and the long prompt's K/V bits), then forward times at every cut size;
#   (b) tfbench run long-prompt, B of 32,000 tokens, whole / mixed 8, 12, 20 ms, each once, with the
#       plain reference, every variant with --cut-attention tiles (run only if (a) found every bit equal).
# Predictions: receipts/predictions/h200-mixed-graphs.{md,yaml} (written first). Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_graphs.sh   (files under $OUT, flat)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
start=$(date +%s)
timeout 240 python3 -m tools.mixed_check --model qwen3-8b --prompt 32000 --out "$OUT/mixed_check.json" > "$OUT/check_log.txt" 2>&1
tail -60 "$OUT/check_log.txt"
grep -q '"all_equal": true' "$OUT/mixed_check.json" 2>/dev/null || { echo "check did not pass: no serving run"; exit 0; }
left=$((575 - $(date +%s) + start))  # the call's 600 s, less the copies after
timeout $left python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --mixed 8,12,20 \
  --order "whole,mixed budget=8,mixed budget=12,mixed budget=20" \
  --plain-check --engine-arg=--cut-attention=tiles --predict receipts/predictions/h200-mixed-graphs.yaml \
  --out /tmp/lp 2>&1 | tail -40
for f in /tmp/lp/*.md /tmp/lp/*.json.gz /tmp/lp/*.png; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$f")"; done
tar czf "$OUT/logs.tgz" -C /tmp lp --exclude='*.json.gz' 2>/dev/null
ls -la "$OUT"
