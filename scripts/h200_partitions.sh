#!/bin/bash
# One device call (one H200, a few minutes): a decode round and a prompt cut on disjoint SM
# partitions (green contexts), alone and side by side, bits checked (tools/partition_probe.py).
# Predictions (written first): receipts/predictions/h200-partitions.md. Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_partitions.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader
python3 -c "import cuda.bindings, torch; print('cuda.bindings', cuda.bindings.__version__, 'torch', torch.__version__)"
timeout 400 python3 -m tools.partition_probe --model qwen3-8b --sms 16,32,48 --contexts 8192,24576 \
  --out "$OUT/partitions.json" > "$OUT/partitions.log" 2>&1
echo "exit $?"
grep -vE "^\s*$|Warning|warn" "$OUT/partitions.log" | tail -30
