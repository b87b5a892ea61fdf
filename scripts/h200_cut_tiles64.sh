#!/bin/bash
# One device call (one H200, at most 10 minutes): (1) tools/cut_flash_probe.py, the cut attention's tile
# shapes (bits against the default, the rate in cuts of 128 / 256 / 1,024 rows); (2) tools/mixed_forms.py,
# qwen3-8b, the runner's tiles against the tiles planned per capacity; (3) tfbench run long-prompt,
# qwen3-8b: whole, mixed 10, 12, 16, 24 ms with --mixed-low-tiles, plain reference, tiles.
# Predictions (written first): receipts/predictions/h200-cut-tiles64.{md,yaml}. Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_cut_tiles64.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
timeout 120 python3 -m tools.cut_flash_probe --model qwen3-8b --rows 128,256,1024 --skip products \
  --out "$OUT/cut_flash_probe.md" 2>&1 | grep -v Warning | tail -22
timeout 170 python3 -m tools.mixed_forms --model qwen3-8b --contexts 0,8192,24576 --reps 15 --forms "chunks,tiles" \
  --out "$OUT/mixed_forms.json" 2>&1 | grep -v Warning | tail -20
python3 -c "import json; print(json.load(open('$OUT/mixed_forms.json'))['plans'])" 2>&1 | tail -3
left=$((590 - $(date +%s) + start))
timeout $left python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --mixed 10,12,16,24 \
  --order "whole,mixed budget=10,mixed budget=12,mixed budget=16,mixed budget=24" \
  --predict receipts/predictions/h200-cut-tiles64.yaml --plain-check --engine-arg=--cut-attention=tiles --engine-arg=--mixed-low-tiles \
  --out /tmp/lp 2>&1 | grep -E "^ (whole|stepped|mixed)|in range|rror" | head -30
for f in /tmp/lp/*.json.gz /tmp/lp/*-frontier.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done
tar czf "$OUT/logs.tgz" -C /tmp lp --exclude='*.json.gz' --exclude='*.png' 2>/dev/null
ls -la "$OUT"
