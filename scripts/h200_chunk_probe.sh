#!/bin/bash
# One device call (one H200, at most 10 minutes): (1) tools/chunk_probe.py, qwen3-8b and qwen3-32b, a mixed
# forward's products in other cuBLAS forms (bits and times); (2) tfbench run long-prompt, qwen3-32b: whole
# and the share at p = 1, each once, plain reference, tiles.
# Predictions (written first): receipts/predictions/h200-chunk-probe.md, h200-share-32b.yaml. Installs nothing.
# Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_chunk_probe.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
timeout 240 python3 -m tools.chunk_probe --model qwen3-8b,qwen3-32b --out "$OUT/chunk_probe.md" 2>&1 | tail -90
left=$((585 - $(date +%s) + start))
timeout $left python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-32b --share 1 \
  --order "whole,stepped p=1" --predict receipts/predictions/h200-share-32b.yaml --plain-check \
  --engine-arg=--cut-attention=tiles --out /tmp/lp32 2>&1 | grep -E "^ (whole|stepped|mixed)|in range|rror" | head -30
for f in /tmp/lp32/*.json.gz /tmp/lp32/*-frontier.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done
tar czf "$OUT/logs.tgz" -C /tmp lp32 --exclude='*.json.gz' --exclude='*.png' 2>/dev/null
ls -la "$OUT"
