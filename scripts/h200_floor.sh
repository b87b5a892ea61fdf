#!/bin/bash
# One device call (one H200, at most 10 minutes): what a mixed forward's floor is made of.
#   (1) tools/overlap_probe.py: a decode round beside a 128-row cut's attention on two streams;
#   (2) tools/cut_flash_probe.py: the cut attention's rate, the library's path graphed, splits of 1,024,
#       and the smallest cuts band by band;
#   (3) tools/mixed_check.py: a round's kernels beside a 128-row mixed forward's (bits checked first).
# Predictions (written first): receipts/predictions/h200-floor.md. Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_floor.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 170 python3 -m tools.overlap_probe --model qwen3-8b --contexts 8192,24576 --out "$OUT/overlap.json" 2>&1 \
  | grep -vE "^\s*$|Warning|warn" | tail -8
timeout 230 python3 -m tools.cut_flash_probe --model qwen3-8b --rows 128,256,1024 --skip products --bands 2048 \
  --out "$OUT/probe.md" > "$OUT/probe.log" 2>&1; tail -45 "$OUT/probe.md" 2>/dev/null || tail -20 "$OUT/probe.log"
timeout 150 python3 -m tools.mixed_check --model qwen3-8b --prompt 12000 --time "" --profile 0@0,128@0,128@8192 \
  --out "$OUT/check.json" > "$OUT/check.log" 2>&1
grep -E '"all_equal"|^profile|Error|error' "$OUT/check.log" | cut -c1-2500
ls -la "$OUT"
