#!/bin/bash
# One device call (one H200, at most 10 minutes), qwen3-8b: (1) tools/cut_flash_probe.py, the cut attention
# with K and V through tensor descriptors (tma) against pointer loads: bits, and the whole prompt's attention
# in cuts of 128 / 256 / 1,024 rows, each variant one CUDA graph; (2) tools/mixed_forms.py, the mixed graphs
# as they run (K and V by tensor descriptors on the H200 since) against the same graphs by pointer loads, at
# 0 / 8,192 / 24,576 keys; (3) tools/prompt_alone.py, B alone in process on each path. Predictions (written first): receipts/predictions/h200-cut-tma.md.
# Installs nothing. Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_cut_tma.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import triton; from triton.tools.tensor_descriptor import TensorDescriptor; print('triton', triton.__version__)"
timeout 200 python3 -m tools.cut_flash_probe --model qwen3-8b --rows 128,256,1024 --skip products \
  --out "$OUT/cut_flash_probe.md" 2>&1 | grep -v Warning | tail -24
timeout 200 python3 -m tools.mixed_forms --model qwen3-8b --contexts 0,8192,24576 --reps 15 --forms "chunks,pointer loads" \
  --out "$OUT/mixed_forms.json" 2>&1 | grep -v Warning | tail -20
timeout 150 python3 -m tools.prompt_alone --model qwen3-8b --prompt 32000 --out "$OUT/prompt_alone.json" 2>&1 | tail -6
ls -la "$OUT"
