#!/bin/bash
# One device call (one H200): (1) the down product over a mixed forward's rows through TMA tiles against
# cuBLAS padded (tools/down_probe.py --sections tma); (2) tools/mixed_check.py at a base tree and at this
# one, one after the other: the bits in process, every cut size's forward time at 0 and 8,192 keys.
# Predictions: receipts/predictions/h200-down-tma.md (written first). Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> BASE=<dir of the base tree's engine, tools> bash scripts/h200_down_tma.sh
set -u
export PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
PYTHONPATH=$PWD timeout 240 python3 -m tools.down_probe --model qwen3-8b,qwen3-32b --cuts 128,256 --sections tma \
  --out "$OUT/down_tma.md" 2>&1 | tail -60
for side in base new; do
  if [ "$side" = base ]; then root=${BASE:-$PWD}; until=420; else root=$PWD; until=585; fi
  left=$((until - $(date +%s) + start))
  [ $left -gt 45 ] && (cd "$root" && PYTHONPATH=$root timeout $left python3 -m tools.mixed_check --model qwen3-8b --prompt 12000 \
    --time 0,8192 --profile 128@8192 --out "$OUT/mixed_check_$side.json" > "$OUT/check_$side.txt" 2>&1)
  echo "== $side"; grep -E '"all_equal"|^timing|^runner|rror' "$OUT/check_$side.txt" | cut -c1-1200
done
ls -la "$OUT"
