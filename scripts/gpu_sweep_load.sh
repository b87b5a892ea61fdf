#!/bin/bash
# The second device call (one H200 or H100, at most 10 minutes), after scripts/gpu_profile_frontier.sh
# on the same card: the profile's rounds and cuts again, so this call's receipts have a profile of
# their own card; the sweep with the best split against whole; a load with a cold prompt injected.
#   (1) tfengine profile --quick --split-sms SPLIT, a short budget (rounds 1-64 streams, cuts, the host);
#   (2) tfbench sweep, levels 1-64, 256 tokens, 2 cells, 1 rep: whole / split sms=SPLIT / whole;
#   (3) tfbench load, Poisson 8 requests/s for 12 s (256-token prompts, 32-token replies), a cold
#       32,000-token prompt injected every 4 s, whole / split / whole, --parallel 8, the plain reference.
# Predictions (written first): receipts/predictions/gpu-sweep-split.yaml, gpu-load-split.yaml (reasons:
# gpu-frontier.md). Installs nothing.
# Usage: SPLIT=40 TFBENCH_COMMIT=<sha> bash scripts/gpu_sweep_load.sh   (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SPLIT=${SPLIT:-40}
start=$(date +%s)
exec > >(tee "$OUT/console.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,driver_version --format=csv
cat > /tmp/split.yaml <<V
- name: whole
  flags: --prefill-mode whole
- name: split sms=$SPLIT
  flags: --prefill-mode split --decode-sms $SPLIT
V
sed "s/sms=40/sms=$SPLIT/" receipts/predictions/gpu-sweep-split.yaml > /tmp/sweep-pred.yaml
sed "s/sms=40/sms=$SPLIT/" receipts/predictions/gpu-load-split.yaml > /tmp/load-pred.yaml
timeout 150 python3 -m engine profile --model qwen3-8b --device cuda --quick --budget 50 --split-sms "$SPLIT" \
  --out "$OUT/qwen3-8b-cuda-call2.json" 2>&1 | grep -vE "Warning|warn\(" | tail -12
timeout 220 python3 -m tensorfold_bench sweep --device cuda --model qwen3-8b --levels 1,2,4,8,16,32,64 --tokens 256 \
  --cells 2 --reps 1 --parallel 64 --variants /tmp/split.yaml --order "whole,split sms=$SPLIT,whole" \
  --predict /tmp/sweep-pred.yaml --out /tmp/sw 2>&1 | grep -E "tok/s|in range|equal|rror|wrote" | head -30
left=$((580 - $(date +%s) + start))
timeout "$left" python3 -m tensorfold_bench load --device cuda --model qwen3-8b --parallel 8 --rate 8 --duration 12 \
  --input-len 256 --output-len 32 --inject 32000@4 --slo ttft=300ms,tpot=30ms,e2e=2s --variants /tmp/split.yaml \
  --order "whole,split sms=$SPLIT,whole" --plain-check --predict /tmp/load-pred.yaml --out /tmp/ld 2>&1 \
  | grep -E "in range|equal|rror|wrote|goodput|pause" | head -30
tar czf "$OUT/receipts.tgz" -C /tmp sw ld 2>/dev/null
ls -la "$OUT"
