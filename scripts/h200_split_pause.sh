#!/bin/bash
# One short device call (about 3 minutes): split mode's pause at a short prompt's arrival, after the
# split's cuts moved to a thread of their own. tools/split_check.py (qwen3-0.6b, bits), then
# tfbench run long-prompt on qwen3-8b, split sms=32 and whole, once each, no plain reference (the
# full receipt: scripts/h200_split.sh). Predictions: receipts/predictions/h200-split-pause.yaml.
# Installs nothing. Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_split_pause.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
timeout 90 python3 -m tools.split_check --model qwen3-0.6b --decode-sms 32 2>&1 | grep -vE "Warning|warn" | tail -4
[ "${PIPESTATUS[0]}" = 0 ] || { echo "split_check failed: no receipt"; exit 1; }
timeout 200 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b \
  --variants examples/variants/split-cuda.yaml --order "split sms=32,whole" \
  --predict receipts/predictions/h200-split-pause.yaml --out /tmp/lp > /tmp/lp.log 2>&1
echo "exit $?"; tail -5 /tmp/lp.log
for f in /tmp/lp/*.json.gz; do [ -f "$f" ] && cp "$f" "$OUT/"; done
ls -la "$OUT"
