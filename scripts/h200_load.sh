#!/bin/bash
# One device call: `tfbench load` on one H200, qwen3-8b in bf16: Poisson traffic at 4, 8 and 16
# requests/s (12 s of arrivals each; 256-token prompts, 32-token replies) with a cold 32,000-token
# prompt injected every 4 s, whole against stepped p=0.5 (base/new/base: the fewest runs that give
# a paired verdict), the plain reference; the receipt under $OUT (flat). The predictions are
# committed before the call (receipts/predictions/h200-load.yaml) and stamped into the receipt.
# About 6-7 minutes: four server starts (three runs and the plain reference), 3 x ~40 s of traffic,
# ~340 requests replayed alone.
# Usage: OUT=/some/dir PYTHONPATH=/abs/repo TFBENCH_COMMIT=<sha> bash scripts/h200_load.sh
set -u
export PYTHONPATH=${PYTHONPATH:?an absolute PYTHONPATH: the repository} PYTHONUNBUFFERED=1
export TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:?a directory for the receipt}; mkdir -p "$OUT"
cd "$PYTHONPATH" || exit 2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > /tmp/gpu.txt 2>&1
# --parallel 8: every lane holds a 32k context (8 x 33k tokens of KV, ~39 GB in bf16)
timeout 470 python3 -m tensorfold_bench load --device cuda --model qwen3-8b --parallel 8 \
  --rate 4,8,16 --duration 12 --input-len 256 --output-len 32 --inject 32000@4 \
  --slo ttft=300ms,tpot=30ms,e2e=2s --share 0.5 --order base,new,base --plain-check \
  --predict receipts/predictions/h200-load.yaml --out /tmp/ld 2>&1 | tail -40
for f in /tmp/ld/*.md /tmp/ld/*.json.gz /tmp/ld/*.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done
tar czf "$OUT/load-logs.tgz" -C /tmp gpu.txt ld 2>/dev/null  # the servers' logs beside the receipt
ls -la "$OUT"
