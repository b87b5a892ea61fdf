#!/bin/bash
# One device call: the qwen3-8b H200 sweep with levels above the lanes, written under $OUT (flat).
#   --levels 1,2,4,8,16,32,64,128,256 --parallel 64: 128 and 256 streams open at once, queued behind
#   64 lanes; --tokens 256 --cells 1 --reps 2, whole vs stepped p=0.5, fresh servers
#   base/new/new/base, predictions receipts/predictions/h200-sweep-queued.yaml (committed first).
# Time: about 4.5 min on one H200 (receipt 20261201-230639 took 56-60 s a run for levels 1-64 at 2
# cells, 14 s of it the server's start; here one cell, plus 2 x 4.1 s at 128 and 2 x 8.3 s at 256:
# ~67 s a run); the sweep is stopped at 7 min, keeping the runs done (the receipt is rewritten after
# each run, marked partial).
# Usage: OUT=DIR PYTHONPATH=/abs/checkout TFBENCH_COMMIT=<sha> bash scripts/h200_sweep.sh
set -u
ROOT=${PYTHONPATH:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
export PYTHONPATH="$ROOT" PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > /tmp/gpu.txt 2>&1
timeout 420 python3 -m tensorfold_bench sweep --device cuda --model qwen3-8b \
  --levels 1,2,4,8,16,32,64,128,256 --parallel 64 --tokens 256 --cells 1 --reps 2 --share 0.5 \
  --predict ${SW_PRED:-receipts/predictions/h200-sweep-queued.yaml} --out /tmp/swq 2>&1 | tail -30
for f in /tmp/swq/*.md /tmp/swq/*.json.gz /tmp/swq/*.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done
tar czf "$OUT/logs.tgz" -C /tmp gpu.txt swq 2>/dev/null  # the run logs beside the receipt
ls -la "$OUT"
