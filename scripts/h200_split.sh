#!/bin/bash
# One device call (one H200 or H100, about 8 minutes): split SMs served.
#   (1) tools/split_check.py on qwen3-0.6b: A decoding on the decode partition beside B's cuts on the
#       prompt partition, bits against each alone (stops here on a difference);
#   (2) tfbench run long-prompt, qwen3-8b: whole, p = 1, p = 0.5, split at 16, 32, 48 decode SMs,
#       each once, plain reference (examples/variants/split-cuda.yaml);
#   (3) with the time left, qwen3-32b: whole, split at 32 and 48.
# Predictions (written first): receipts/predictions/h200-split.{md,yaml}, h200-split-32b.yaml.
# Installs nothing. Usage: TFBENCH_COMMIT=<sha> bash scripts/h200_split.sh (files under $OUT)
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TFENGINE_COMMIT=${TFBENCH_COMMIT:-unknown}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
timeout 120 python3 -m tools.split_check --model qwen3-0.6b --decode-sms 32 2>&1 | grep -vE "Warning|warn" | tail -6
[ "${PIPESTATUS[0]}" = 0 ] || { echo "split_check failed: no receipts"; exit 1; }
timeout 330 python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-8b \
  --variants examples/variants/split-cuda.yaml --predict receipts/predictions/h200-split.yaml --plain-check \
  --out /tmp/lp 2>&1 | grep -E "^ (whole|stepped|split)|in range|equal|rror" | head -30
left=$((450 - $(date +%s) + start))
if [ "$left" -gt 150 ]; then
  cat > /tmp/v32.yaml <<'V'
- name: whole
  flags: --prefill-mode whole
- name: split sms=32
  flags: --prefill-mode split --decode-sms 32
- name: split sms=48
  flags: --prefill-mode split --decode-sms 48
V
  timeout "$left" python3 -m tensorfold_bench run long-prompt --device cuda --model qwen3-32b --variants /tmp/v32.yaml \
    --predict receipts/predictions/h200-split-32b.yaml --plain-check --out /tmp/lp32 2>&1 \
    | grep -E "^ (whole|split)|in range|equal|rror" | head -20
fi
for d in lp lp32; do for f in /tmp/$d/*.json.gz /tmp/$d/*.png; do [ -f "$f" ] && cp "$f" "$OUT/"; done; done
tar czf "$OUT/logs.tgz" -C /tmp lp lp32 --exclude='*.json.gz' 2>/dev/null
ls -la "$OUT"
