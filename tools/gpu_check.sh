#!/bin/bash
# One device call: correctness checks of the CUDA path, then the bench of qwen3-8b. Writes $OUT.
# Usage (device tool): bash tools/gpu_check.sh [extra bench flags]
export PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
timeout ${CHECK_S:-170} python3 -m tools.gpu_check --out "$OUT/check.json" 2>&1 | tee "$OUT/check.log" | tail -c 4000
timeout ${BENCH_S:-230} python3 -m tools.bench --model qwen3-8b --device cuda --json "$OUT/bench_8b.json" "$@" 2>&1 | tee "$OUT/bench.log"
