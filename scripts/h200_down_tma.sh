#!/bin/bash
# One device call (one H200): (1) the down product over a mixed forward's rows through TMA tiles against
# cuBLAS padded (tools/down_probe.py --sections tma); (2) tools/mixed_check.py as the tree stands: the bits
# in process, every cut size's forward time at 0 and 8,192 keys, the 128-row shape's kernels.
# Predictions: receipts/predictions/h200-down-tma.md (written first). Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_down_tma.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout 300 python3 -m tools.down_probe --model qwen3-8b,qwen3-32b --cuts 128,256 --sections tma --out "$OUT/down_tma.md" 2>&1 | tail -80
left=$((585 - $(date +%s) + start))
[ $left -gt 60 ] && timeout $left python3 -m tools.mixed_check --model qwen3-8b --prompt 12000 --time 0,8192 \
  --profile 128@0,128@8192 --out "$OUT/mixed_check.json" > "$OUT/check_log.txt" 2>&1
grep -E '"all_equal"|^timing|^runner|rror' "$OUT/check_log.txt" | cut -c1-1500
ls -la "$OUT"
