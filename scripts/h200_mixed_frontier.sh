#!/bin/bash
# One device call (one H200, at most 10 minutes): both frontiers of qwen3-8b on a 32,000-token B.
#   (1) tfbench run long-prompt: whole, the share at p = 1, 0.75, 0.5, 0.25, mixed at 10, 14, 20,
#       30 ms, each once, the plain reference, every variant with --cut-attention tiles;
#   (2) then, in the time left, tools/mixed_check.py --prompt 12000 --time 0,8192: the bits in process,
#       and forward times.
# Predictions: receipts/predictions/h200-mixed-frontier.{md,yaml} (written first). Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_mixed_frontier.sh [2|4]   (files under $OUT, flat; 2 or 4: the
#   second variant set, whole, p = 1, 0.75, 0.5, mixed 12, 16, 24, predictions h200-mixed-frontier-2.* or -4.*)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > "$OUT/gpu.csv" 2>&1
start=$(date +%s)
left=500  # (1) first; (2) gets what is left of the call's 600 s, less the copies after
if [ "${1:-1}" != 1 ]; then  # the second set (2: after the host's cost-model fix; 4: after down's one K chain)
  set_args=(--share 1,0.75,0.5 --mixed 12,16,24 --predict receipts/predictions/h200-mixed-frontier-$1.yaml
            --order "whole,stepped p=1,stepped p=0.75,stepped p=0.5,mixed budget=12,mixed budget=16,mixed budget=24")
else
  set_args=(--share 1,0.75,0.5,0.25 --mixed 10,14,20,30 --predict receipts/predictions/h200-mixed-frontier.yaml
            --order "whole,stepped p=1,stepped p=0.75,stepped p=0.5,stepped p=0.25,mixed budget=10,mixed budget=14,mixed budget=20,mixed budget=30")
fi
timeout $left python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b "${set_args[@]}" \
  --plain-check --engine-arg=--cut-attention=tiles \
  --out /tmp/lp 2>&1 | tail -60
left=$((585 - $(date +%s) + start))
[ $left -gt 60 ] && timeout $left python3 -m tools.mixed_check --model qwen3-8b --prompt 12000 --time 0,8192 --profile 64@0,64@8192,256@0,256@8192 --out "$OUT/mixed_check.json" > "$OUT/check_log.txt" 2>&1
grep -E '"all_equal"|^timing|^runner' "$OUT/check_log.txt" | cut -c1-1500
for f in /tmp/lp/*.md /tmp/lp/*.json.gz /tmp/lp/*.png; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$f")"; done
tar czf "$OUT/logs.tgz" -C /tmp lp --exclude='*.json.gz' 2>/dev/null
ls -la "$OUT"
