#!/bin/bash
# One device call (one H100 or H200, at most ~9 minutes): the profile with the sustained fill, the
# mixed forwards' exactness with the tiles on every server, and fresh whole and p=1 runs for the
# fill's check, all on one card.
#   (1) tfengine profile --quick (with the `fill` kind: the longest prompt cut by cut, back to back);
#   (2) long-prompt, B of 8,192 tokens, whole and mixed budget=40, `--cut-attention tiles` on every
#       server, the plain reference included;
#   (3) long-prompt, B of 32,000 tokens, whole and stepped p=1, the trace on.
# Predictions (written before the call):
#   (1) the fill's cuts cost more than the grid's fit the longer the fill runs: the heat's k in
#       0.03-0.20 (a whole fill of 32k on the H100 ran 3 % over the grid at its start and 10-17 %
#       past 24k keys); `since` of the last cut 1.2-1.5 s.
#   (2) every reply, A's included, equal to the plain reference: this morning's A, differing from
#       token 29, ran its prompt's attention in tiles against a reference in cuDNN halves.
#   (3) on (1)'s profile, `python -m tensorfold_bench.calibrate.sim_error --profile` gives B's first
#       token within 4 % for whole and p=1 (-7.0 and -5.1 % on the grid alone this morning).
# Usage: TFBENCH_COMMIT=<sha> bash scripts/gpu_fill_check.sh   (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/console.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,driver_version --format=csv
timeout 170 python3 -m engine profile --model qwen3-8b --device cuda --quick --budget 75 --split-sms 32,40 \
  --out "$OUT/qwen3-8b-cuda.json" 2>&1 | grep -vE "Warning|warn\(" | tail -14
timeout 200 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --b-at 2 --b-tokens 8192 \
  --engine-arg=--cut-attention --engine-arg=tiles --mixed 40 --order "whole,mixed budget=40" --plain-check \
  --out /tmp/ex 2>&1 | grep -E "equal|Differ|rror|receipt json" | head -12
timeout 170 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b --share 1 \
  --order "whole,stepped p=1" --out /tmp/fr 2>&1 | grep -E "^ *\| (whole|stepped)|rror|receipt json" | head -12
tar czf "$OUT/runs.tgz" -C /tmp ex fr 2>/dev/null
ls -la "$OUT"
