#!/bin/bash
# One device call (one H200): (1) tools/swap_probe.py, the products with the operands swapped; (2)
# tools/mixed_forms.py, qwen3-8b, plain / hold down / swap side by side; (3) tfbench sweep, qwen3-8b,
# 1, 8, 64 streams, whole against mixed 24 ms.
# Predictions: receipts/predictions/h200-swap-probe.md, h200-sweep-mixed-4.yaml (written first).
# Installs nothing. Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_swap.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
timeout 100 python3 -m tools.swap_probe --model qwen3-8b,qwen3-32b --out "$OUT/swap_probe.md" 2>&1 | tail -40
timeout 110 python3 -m tools.mixed_forms --model qwen3-8b --contexts 0,8192 --reps 20 --out "$OUT/mixed_forms.json" 2>&1 | tail -14
left=$((420 - $(date +%s) + start))
timeout $left python3 -m tensorfold_bench sweep --device cuda --model qwen3-8b --levels 1,8,64 \
  --tokens 256 --cells 1 --reps 1 --mixed 24 --predict receipts/predictions/h200-sweep-mixed-4.yaml \
  --engine-arg=--cut-attention=tiles --out /tmp/sw 2>&1 | tail -24
for f in /tmp/sw/*.json.gz /tmp/sw/*.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done
tar czf "$OUT/logs.tgz" -C /tmp sw --exclude='*.json.gz' 2>/dev/null
ls -la "$OUT"
