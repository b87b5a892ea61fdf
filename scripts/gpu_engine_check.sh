#!/bin/bash
# One device call (one H200 or H100, at most 10 minutes): the engine's bits and speed on the GPU across
# a refactor of the runner and the model, the tree before it unpacked at BASE (git archive REF engine
# tools tensorfold_bench), every figure on the same card in the same call.
#   (1) tools.tree_tokens, qwen3-8b, the trees BASE and this one: four greedy prompts of 700-811
#       tokens, 32 tokens each, alone and together, whole / stepped / split 32 SMs / mixed (tiles):
#       every hash equal to the base's;
#   (2) tools.bench, qwen3-8b: decode at 1 and 8 streams, prompts of 4,096 and 32,768 tokens,
#       in the order old/new/new/old: each figure within 2 % of the base's.
# Prediction (written first): every hash equal; every new/old median ratio in 0.98-1.02 (the
# refactor moves no kernel; Python around the forward changes, which graphs hide in decode).
# Usage: BASE=.devcarry/base TFBENCH_COMMIT=<sha> bash scripts/gpu_engine_check.sh   (files under $OUT)
#   PARTS="bits" or "bench" runs one of the two (default both), for calls shared with other work.
set -u
export PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BASE=$(cd "${BASE:-.devcarry/base}" && pwd); NEW=$PWD
exec > >(tee -a "$OUT/console-engine.txt") 2>&1
PARTS=${PARTS:-bits bench}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv
# BITS_MODES: the flag sets, ';' between them
IFS=';' read -ra modes <<< "${BITS_MODES:---prefill-mode whole;--prefill-mode stepped;--prefill-mode split --decode-sms 32;--prefill-mode mixed --cut-attention tiles}"
flags=(); for m in "${modes[@]}"; do flags+=(--flags "$m"); done
[[ $PARTS == *bits* ]] && PYTHONPATH=$NEW timeout 300 python3 -m tools.tree_tokens --root "$BASE" --root "$NEW" --model qwen3-8b \
  --device cuda "${flags[@]}" --out "$OUT/tree_tokens.json" 2>&1 | grep -vE "Warning|warn\("
i=0
[[ $PARTS == *bench* ]] && for side in old new new old; do
  i=$((i + 1)); root=$([ "$side" = old ] && echo "$BASE" || echo "$NEW")
  (cd "$root" && PYTHONPATH="$root" timeout 100 python3 -m tools.bench --model qwen3-8b --device cuda --streams 1,8 \
    --prompts 4096,32768 --json "$OUT/bench-$i-$side.json" 2>&1 | grep -vE "Warning|warn\(" | tail -8)
done
ls -la "$OUT"
