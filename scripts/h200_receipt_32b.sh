#!/bin/bash
# One device call: the qwen3-32b long-prompt receipt (whole vs stepped p=0.5, plain
# check), under $OUT. Usage: TFBENCH_COMMIT=<sha> [PRED=<predictions.yaml>] bash scripts/h200_receipt_32b.sh
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 430 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-32b --share 0.5 \
  --plain-check --predict ${PRED:-receipts/predictions/h200-32b-long-prompt.yaml} --out /tmp/lp32 2>&1 | tail -30
for f in /tmp/lp32/*.md /tmp/lp32/*.json.gz /tmp/lp32/*.png; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$f")"; done
tar czf "$OUT/logs32.tgz" -C /tmp lp32 2>/dev/null
ls -la "$OUT"
