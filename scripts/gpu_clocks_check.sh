#!/bin/bash
# One device call (~4 minutes): the GPU's SM clock and power sampled every 50 ms while a long
# prompt fills whole and at p=1 (B of 32,000 tokens, the trace on), then a one-stream sweep level
# from an idle server: do a whole fill's slow first cuts and an idle server's late first token
# follow the clocks?
# Predictions (written before the call):
#   (1) where a whole fill's first cuts run over the profile's times, the SM clock is below
#       1,700 MHz while they run (ramping up from the decode rounds' lighter load); cuts at the
#       top clock (1,980 MHz) run within 10 % of the profile's fill.
#   (2) an idle server's GPU sits at its idle clock (345 MHz) when a request arrives, and its
#       first forward runs before the clock reaches the top: the 20 ms the sweep's first token
#       carries over the simulation.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/gpu_clocks_check.sh   (files under $OUT: clocks.csv,
#   runs.tgz, console.txt, offset.txt: wall time minus CLOCK_MONOTONIC)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/console.txt") 2>&1
python3 -c "import time; print(time.time() - time.monotonic())" > "$OUT/offset.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,nounits -lms 50 > "$OUT/clocks.csv" 2>&1 &
smi=$!
timeout 170 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --share 1 \
  --order "whole,stepped p=1" --out /tmp/ck 2>&1 | grep -E "rror|receipt json" | head -6
timeout 60 python3 -m tensorfold_bench sweep --device cuda --model qwen3-8b --levels 1 --tokens 64 --cells 2 --reps 1 \
  --parallel 4 --out /tmp/ck 2>&1 | grep -E "tok/s|rror|receipt json" | head -6
kill $smi
python3 -c "import time; print(time.time() - time.monotonic())" >> "$OUT/offset.txt"
tar czf "$OUT/runs.tgz" -C /tmp ck 2>/dev/null
ls -la "$OUT"
