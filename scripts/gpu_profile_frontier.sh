#!/bin/bash
# One device call (one H200 or H100, at most 10 minutes): the simulator's cost profile and the
# long-prompt frontier of qwen3-8b, on the same card.
#   (1) tfengine profile --quick: prompt cuts to 32k keys, rounds of 1-64 streams, short prompts
#       together, the host's own time, split cuts beside rounds at 24/32/40/56 decode SMs, mixed
#       forwards if the budget leaves time (receipts/profiles/);
#   (2) tfbench run long-prompt, B of 32,000 tokens: whole, the share at p = 1, 0.75, 0.5, 0.25,
#       split at 24, 32, 40, 56 decode SMs, each once, the plain reference, the trace on; the five
#       the simulator's check needs most come first, so a call cut short keeps them (the receipt
#       is written after every run).
# Predictions (written first): receipts/predictions/gpu-frontier.{md,yaml}. Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/gpu_profile_frontier.sh   (files under $OUT: profile JSON,
#   lp.tgz with the receipt and the servers' logs, console-frontier.txt)
#   DEADLINE (s, default 575): the whole script's time; PROFILE_BUDGET (s, default 140) and SPLIT_SMS
#   (default 24,32,40,56): the profile's, for a call that shares its ten minutes with other work.
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
exec > >(tee "$OUT/console-frontier.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,driver_version --format=csv
timeout $(( ${PROFILE_BUDGET:-140} + 120 )) python3 -m engine profile --model qwen3-8b --device cuda --quick \
  --budget ${PROFILE_BUDGET:-140} --split-sms ${SPLIT_SMS:-24,32,40,56} --out "$OUT/qwen3-8b-cuda.json" 2>&1 | grep -vE "Warning|warn\(" | tail -25
left=$((${DEADLINE:-575} - $(date +%s) + start))
echo "profile done at $(( $(date +%s) - start )) s; $left s left for the frontier"
timeout "$left" python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b \
  --share 1,0.75,0.5,0.25 --mixed ${MIXED:-40} --split 24,32,40,56 \
  --order "${ORDER:-whole,stepped p=1,stepped p=0.5,split sms=32,mixed budget=${MIXED:-40},split sms=40,stepped p=0.75,stepped p=0.25,split sms=24,split sms=56}" \
  --predict receipts/predictions/gpu-frontier.yaml --plain-check --out /tmp/lp 2>&1 \
  | grep -E "^ *\| (whole|stepped|split)|in range|equal|rror|receipt|wrote" | head -60
tar czf "$OUT/lp.tgz" -C /tmp lp 2>/dev/null
ls -la "$OUT"
