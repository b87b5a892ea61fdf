#!/bin/bash
# One device call: the qwen3-8b H200 receipts, written under $OUT (flat, so a device tool that brings
# back a few files keeps them all). Predictions are committed under receipts/predictions/ before the call.
#   long-prompt: qwen3-8b, B of 32,000 tokens, whole vs stepped p=1 and p=0.5, plain check
#   sweep: --levels 1,2,4,8,16,32,64 --tokens 256 --cells 2 --reps 2 (the call fits 10 min), whole vs p=0.5
# Usage: TFBENCH_COMMIT=<sha> [LP_PRED=... SW_PRED=... SWEEP=0 LONG=0] bash scripts/h200_receipts.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > /tmp/gpu.txt 2>&1
keep() {  # copy a run's receipt files under $OUT as soon as it ends (a later timeout keeps them)
  for f in /tmp/$1/*.md /tmp/$1/*.json.gz /tmp/$1/*.png; do [ -f "$f" ] && cp "$f" "$OUT/$1-$(basename "$f")"; done
}
if [ "${LONG:-1}" = 1 ]; then  # LONG=0: the sweep alone
timeout 250 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --share 1,0.5 \
  --plain-check --predict ${LP_PRED:-receipts/predictions/h200-long-prompt.yaml} --out /tmp/lp 2>&1 | tail -30
keep lp
fi
if [ "${SWEEP:-1}" = 1 ]; then  # SWEEP=0: the long-prompt receipt alone
timeout 310 python3 -m tensorfold_bench sweep --device cuda --model qwen3-8b --levels 1,2,4,8,16,32,64 \
  --tokens 256 --cells 2 --reps 2 --share 0.5 --predict ${SW_PRED:-receipts/predictions/h200-sweep.yaml} --out /tmp/sw 2>&1 | tail -30
keep sw
fi
tar czf "$OUT/logs.tgz" -C /tmp gpu.txt lp sw 2>/dev/null  # the run logs beside each receipt
ls -la "$OUT"
